#include "run_args.hpp"

#include <charconv>
#include <filesystem>
#include <utility>
#include <vector>

#include "io/npy.hpp"

namespace attn::tools {

std::optional<Window> parse_window(const std::string& text) {
  const std::size_t comma = text.find(',');
  if (comma == std::string::npos) return std::nullopt;
  Window window;
  const char* end = text.data() + text.size();
  const auto left = std::from_chars(text.data(), text.data() + comma, window.left);
  const auto right = std::from_chars(text.data() + comma + 1, end, window.right);
  const bool parsed = left.ec == std::errc() && left.ptr == text.data() + comma &&
                      right.ec == std::errc() && right.ptr == end;
  if (!parsed || window.left < -1 || window.right < -1) return std::nullopt;
  return window;
}

Options options_without_mask(const RunArgs& args) {
  Options options;
  options.scale = args.scale;
  options.causal = args.causal;
  options.causal_align =
      args.causal_align == "bottom-right" ? CausalAlign::bottom_right : CausalAlign::top_left;
  if (!args.window.empty()) options.window = *parse_window(args.window);
  options.softcap = args.softcap;
  if (!args.alibi.empty()) options.alibi_slopes = io::read_npy_vector(args.alibi);
  if (!args.sinks.empty()) options.sinks = io::read_npy_vector(args.sinks);
  apply(args.compute, options);
  return options;
}

void check_outputs(const RunArgs& args) {
  const std::vector<std::pair<const char*, const std::string*>> outputs = {
      {"--out", &args.out},
      {"--weights", &args.weights},
      {"--contributions", &args.contributions},
      {"--lse", &args.lse},
      {"--viz", &args.viz}};
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].second->empty()) io::check_output_path(*outputs[i].second);
    for (std::size_t j = i + 1; j < outputs.size(); ++j) {
      const std::string& a = *outputs[i].second;
      const std::string& b = *outputs[j].second;
      if (a.empty() || b.empty()) continue;
      if (std::filesystem::absolute(a).lexically_normal() ==
          std::filesystem::absolute(b).lexically_normal()) {
        throw Error(std::string(outputs[j].first) + ": expected a path different from " +
                    outputs[i].first + ", given the same path '" + b + "'");
      }
    }
  }
}

}  // namespace attn::tools
