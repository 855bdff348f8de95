// Rotary position embedding (attn::Rotary) on one row, in float64: the one definition the
// appends, the paged kernel's queries and the tests' reference all apply.
#pragma once

#include <string>

#include "attn/paged.hpp"

namespace attn::core {

// The rotary's tables, style and dims for rows of `dim` elements, and its positions: exactly
// `rows` of them when `rows_need_positions` (else none or `rows`), each a row of the tables.
// Throws attn::Error naming `name` and the field.
void check_rotary(const std::string& name, const Rotary& rotary, Index dim, Index rows,
                  bool rows_need_positions);

// Whether position p has a row in the tables.
bool has_position(const Rotary& rotary, Index dim, Index position);

// row[0 .. dims) rotated in place by the angles of `position`.
void rotate(const Rotary& rotary, Index dim, Index position, double* row);

}  // namespace attn::core
