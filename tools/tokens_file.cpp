#include "tokens_file.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "attn/error.hpp"
#include "viz/tokens.hpp"

namespace attn::tools {

std::vector<std::string> split_tokens(const std::string& text) {
  std::istringstream lines(text);
  std::vector<std::string> tokens;
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    tokens.push_back(line);
  }
  return tokens;
}

std::vector<std::string> read_tokens(const std::string& path, const char* argument) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    throw Error(std::string(argument) + ": cannot read '" + path + "': " + std::strerror(errno));
  }
  std::stringstream text;
  text << file.rdbuf();
  return split_tokens(text.str());
}

std::vector<std::string> read_tokens(const std::string& path, const char* argument, Index len_q,
                                     Index len_k) {
  if (path.empty()) return {};
  std::vector<std::string> tokens = read_tokens(path, argument);
  viz::token_labels(tokens, len_q, len_k, argument);
  return tokens;
}

}  // namespace attn::tools
