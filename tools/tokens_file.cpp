#include "tokens_file.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "attn/error.hpp"

namespace attn::tools {

std::vector<std::string> read_tokens(const std::string& path, const char* argument) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    throw Error(std::string(argument) + ": cannot read '" + path + "': " + std::strerror(errno));
  }
  std::stringstream text;
  text << file.rdbuf();
  std::vector<std::string> tokens;
  std::string line;
  while (std::getline(text, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    tokens.push_back(line);
  }
  return tokens;
}

}  // namespace attn::tools
