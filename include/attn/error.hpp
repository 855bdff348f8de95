// attn::Error: every bad input throws this, with a message naming the argument.
#pragma once

#include <stdexcept>
#include <string>

namespace attn {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Work that cannot fit in the memory available (the machine's, or a cgroup's or ulimit's
// share of it): thrown before anything large is allocated, instead of the process being
// killed, with the size needed and what to ask for instead. Python raises MemoryError.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

}  // namespace attn
