// Token files for the pictures: UTF-8 text, one token per line.
#pragma once

#include <string>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::tools {

// The lines of `text` without their "\n" or "\r\n"; an empty line is an empty token, and
// the newline after the last line is optional.
std::vector<std::string> split_tokens(const std::string& text);

// split_tokens of the file at `path`. Throws attn::Error naming `argument` and the path when
// it cannot be read.
std::vector<std::string> read_tokens(const std::string& path, const char* argument);

// read_tokens, checked to label weights of Lq = len_q and Lk = len_k (see viz::token_labels);
// none for an empty path. Throws attn::Error naming `argument`.
std::vector<std::string> read_tokens(const std::string& path, const char* argument, Index len_q,
                                     Index len_k);

}  // namespace attn::tools
