#include "core/rotary.hpp"

#include "core/argument_checks.hpp"

namespace attn::core {
namespace {

Index rotated(const Rotary& rotary, Index dim) {
  return rotary.dims == 0 ? dim : rotary.dims;
}

}  // namespace

void check_rotary(const std::string& name, const Rotary& rotary, Index dim, Index rows,
                  bool rows_need_positions) {
  if (rotary.style == RotaryStyle::none) {
    if (!rotary.cos.empty() || !rotary.sin.empty() || !rotary.positions.empty() || rotary.dims != 0)
      fail(name + ".style", "neox or interleaved for the tables and positions given", "none");
    return;
  }
  const Index dims = rotated(rotary, dim);
  if (dims < 2 || dims % 2 != 0 || dims > dim) {
    fail(name + ".dims", "an even count from 2 to the head dim " + std::to_string(dim),
         std::to_string(rotary.dims));
  }
  const Index half = dims / 2;
  if (rotary.cos.empty() || rotary.cos.size() % static_cast<std::size_t>(half) != 0) {
    fail(name + ".cos", "[positions, " + std::to_string(half) + "] values (dims / 2 a row)",
         std::to_string(rotary.cos.size()) + " values");
  }
  if (rotary.sin.size() != rotary.cos.size()) {
    fail(name + ".sin", std::to_string(rotary.cos.size()) + " values (as cos)",
         std::to_string(rotary.sin.size()));
  }
  const auto count = static_cast<Index>(rotary.positions.size());
  if ((rows_need_positions || count != 0) && count != rows) {
    fail(name + ".positions", std::to_string(rows) + " positions (one per row)",
         std::to_string(count));
  }
  for (Index i = 0; i < count; ++i) {
    if (!has_position(rotary, dim, rotary.positions[i])) {
      fail(name + ".positions",
           "positions in [0, " + std::to_string(static_cast<Index>(rotary.cos.size()) / half) +
               ") (the tables' rows)",
           "positions[" + std::to_string(i) + "] = " + std::to_string(rotary.positions[i]));
    }
  }
}

bool has_position(const Rotary& rotary, Index dim, Index position) {
  const Index half = rotated(rotary, dim) / 2;
  return position >= 0 && position < static_cast<Index>(rotary.cos.size()) / half;
}

void rotate(const Rotary& rotary, Index dim, Index position, double* row) {
  const Index half = rotated(rotary, dim) / 2;
  const float* c = rotary.cos.data() + position * half;
  const float* s = rotary.sin.data() + position * half;
  const bool neox = rotary.style == RotaryStyle::neox;
  for (Index j = 0; j < half; ++j) {
    double& x = row[neox ? j : 2 * j];
    double& y = row[neox ? j + half : 2 * j + 1];
    const double cj = c[j], sj = s[j];
    const double rx = x * cj - y * sj, ry = y * cj + x * sj;
    x = rx;
    y = ry;
  }
}

}  // namespace attn::core
