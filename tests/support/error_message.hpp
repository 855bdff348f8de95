// What an argument check said: the message of the attn::Error a call throws.
#pragma once

#include <string>

#include "attn/error.hpp"

namespace attn::testing {

// The message of the attn::Error that fn() throws, or "no error" when it throws none.
template <class Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace attn::testing
