#include "core/argument_checks.hpp"

#include <cmath>

namespace attn::core {

void fail(const std::string& argument, const std::string& expected, const std::string& given) {
  throw Error(argument + ": expected " + expected + ", given " + given);
}

void check_per_head(const char* name, const std::vector<float>& values, Index heads,
                    bool allow_minus_infinity) {
  if (values.empty()) return;
  if (static_cast<Index>(values.size()) != heads) {
    fail(name, std::to_string(heads) + " values (one per query head)",
         std::to_string(values.size()));
  }
  for (std::size_t h = 0; h < values.size(); ++h) {
    const float x = values[h];
    const bool ok = std::isfinite(x) || (allow_minus_infinity && x == -INFINITY);
    if (!ok) {
      fail(name, allow_minus_infinity ? "finite values or -inf" : "finite values",
           std::to_string(x) + " at head " + std::to_string(h));
    }
  }
}

}  // namespace attn::core
