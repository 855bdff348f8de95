// attn::Error: every bad input throws this, with a message naming the argument.
#pragma once

#include <stdexcept>
#include <string>

namespace attn {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace attn
