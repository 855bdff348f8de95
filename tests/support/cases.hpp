// Test cases are data: one struct with a readable name, lists built by loops over its
// fields. The same lists drive the reference tests, the fast-kernel tests and the benches.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "attn/attn.hpp"

namespace attn::testing {

enum class MaskCase : std::uint8_t { none, boolean, additive };

struct Case {
  Index batch = 1, heads_q = 1, heads_kv = 1, len_q = 1, len_k = 1, dim = 1, dim_v = 1;
  bool causal = false;
  CausalAlign align = CausalAlign::top_left;
  Window window;
  double softcap = 0.0;
  bool alibi = false;
  bool sinks = false;
  // A random table by relative position: clipped (one row shared by every head, clamping
  // past 16 either way), t5 (32 columns to distance 40, a row per head) or t5_causal (16
  // columns to distance 24, a row per head).
  std::optional<BiasBuckets> position_bias;
  MaskCase mask = MaskCase::none;
  bool packed = false;  // split each batch entry's rows into uneven packed sequences
  DType dtype = DType::f32;
  bool bshd = false;     // inputs laid out [B, S, H, D] and passed as strided views
  double dropout = 0.0;  // Options::dropout_p (the seed follows make_inputs' seed)

  std::string name() const;
};

// gtest prints a failing parameter with this instead of its bytes.
void PrintTo(const Case& c, std::ostream* out);

// Whether ATTN_FULL_SWEEP=1 asks for every case, where CI runs a quick list.
bool full_sweep();
// The quick list that runs in CI, or every case when ATTN_FULL_SWEEP=1 is set.
std::vector<Case> case_list();
std::vector<Case> quick_cases();
std::vector<Case> full_cases();
// case_list() with dropout 0.3 on every case: every tail and chunk shape drops weights.
std::vector<Case> dropout_cases();

// Random inputs for a case, owned here, with views in the case's layout.
struct Inputs {
  Tensor q_storage, k_storage, v_storage, mask_storage;
  TensorView q, k, v;
  Options options;
};
Inputs make_inputs(const Case& c, unsigned seed = 1);

// Writes NaN into the key row and infinity into the value row `key` of every batch entry
// and KV head (f32, f16 or bf16 inputs): a row that sees the key gets NaN, a row that does not
// must not.
void poison_key(Inputs& in, Index key);

// Hides `key` in the case's mask from every row but each fourth, which sees it; the rows
// that do not still see keys on both sides of it (the mask hides about one key in five).
void show_key_to_every_fourth_row(Inputs& in, Index key);

}  // namespace attn::testing
