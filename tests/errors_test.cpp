// Every rejection of bad input, as data: a readable name, the call, and the pieces its
// attn::Error message must contain (the argument, what was expected and what was given).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "attn/attn.hpp"

namespace attn {
namespace {

using ::testing::HasSubstr;

struct ErrorCase {
  std::string name;
  std::function<void()> call;
  std::vector<std::string> message_parts;
  // For forward requests: the same request given to check_forward, which must reject it
  // with the same message.
  std::function<void()> check = nullptr;
};

void PrintTo(const ErrorCase& c, std::ostream* out) {
  *out << c.name;
}

// Zero-filled storage big enough for every view below; never read past by a valid request.
std::vector<double>& input_storage() {
  static std::vector<double> storage(4096);
  return storage;
}
std::vector<double>& output_storage() {
  static std::vector<double> storage(4096);
  return storage;
}

TensorView input(DType dtype, const Dims& shape) {
  return TensorView(input_storage().data(), dtype, shape);
}
MutableTensorView output(DType dtype, const Dims& shape) {
  return MutableTensorView(output_storage().data(), dtype, shape);
}

// A valid request that each case breaks in one way. Plain: q [2, 4, 3, 8], k [2, 2, 5, 8],
// v [2, 2, 5, 6]. Packed: one batch entry of 6 query rows and 10 key rows.
struct Request {
  TensorView q, k, v;
  Options options;
  Outputs outputs;

  static Request plain() {
    Request r;
    r.q = input(DType::f32, {2, 4, 3, 8});
    r.k = input(DType::f32, {2, 2, 5, 8});
    r.v = input(DType::f32, {2, 2, 5, 6});
    r.outputs.context = output(DType::f32, {2, 4, 3, 6});
    return r;
  }
  static Request packed() {
    Request r;
    r.q = input(DType::f32, {1, 4, 6, 8});
    r.k = input(DType::f32, {1, 2, 10, 8});
    r.v = input(DType::f32, {1, 2, 10, 6});
    r.outputs.context = output(DType::f32, {1, 4, 6, 6});
    r.options.cu_seqlens_q = {0, 2, 6};
    r.options.cu_seqlens_k = {0, 7, 10};
    return r;
  }
  void run() const { forward_into(q, k, v, options, outputs); }
  void check() const { check_forward(q, k, v, options, outputs); }
};

ErrorCase forward_case(std::string name, std::function<void(Request&)> edit,
                       std::vector<std::string> parts, Request base = Request::plain()) {
  return {std::move(name),
          [edit, base] {
            Request r = base;
            edit(r);
            r.run();
          },
          std::move(parts),
          [edit, base] {
            Request r = base;
            edit(r);
            r.check();
          }};
}

std::vector<ErrorCase> input_cases() {
  return {
      forward_case("q_boolean", [](Request& r) { r.q.dtype = DType::boolean; },
                   {"q: expected a floating-point dtype, given bool"}),
      forward_case("k_negative_extent", [](Request& r) { r.k.shape[2] = -1; },
                   {"k: expected non-negative extents, given shape [2, 2, -1, 8]"}),
      forward_case("v_no_heads", [](Request& r) { r.v.shape[1] = 0; },
                   {"v: expected at least one head, given shape [2, 0, 5, 6]"}),
      forward_case("q_zero_head_dim", [](Request& r) { r.q.shape[3] = 0; },
                   {"q: expected a head dim of at least 1, given shape [2, 4, 3, 0]"}),
      forward_case("k_strided_last_dim", [](Request& r) { r.k.strides[3] = 2; },
                   {"k: expected a contiguous last dim (stride 1), given stride 2"}),
      forward_case("v_null_data", [](Request& r) { r.v.data = nullptr; },
                   {"v: expected data, given a null pointer"}),
      forward_case("k_batch_differs",
                   [](Request& r) {
                     r.k = input(DType::f32, {1, 2, 5, 8});
                   },
                   {"k: expected shape [2, Hkv, Lk, 8] (batch and head dim of q), given "
                    "[1, 2, 5, 8]"}),
      forward_case("k_head_dim_differs",
                   [](Request& r) {
                     r.k = input(DType::f32, {2, 2, 5, 7});
                   },
                   {"k: expected shape [2, Hkv, Lk, 8]", "given [2, 2, 5, 7]"}),
      forward_case("v_length_differs",
                   [](Request& r) {
                     r.v = input(DType::f32, {2, 2, 4, 6});
                   },
                   {"v: expected shape [2, 2, 5, Dv] (batch, heads and length of k), given "
                    "[2, 2, 4, 6]"}),
      forward_case("v_heads_differ",
                   [](Request& r) {
                     r.v = input(DType::f32, {2, 1, 5, 6});
                   },
                   {"v: expected shape [2, 2, 5, Dv]", "given [2, 1, 5, 6]"}),
      forward_case("gqa_heads_not_divisible",
                   [](Request& r) {
                     r.k = input(DType::f32, {2, 3, 5, 8});
                     r.v = input(DType::f32, {2, 3, 5, 6});
                   },
                   {"k: expected a head count dividing the 4 query heads (GQA), given 3 heads"}),
  };
}

std::vector<ErrorCase> option_cases() {
  return {
      forward_case("scale_nan", [](Request& r) { r.options.scale = NAN; },
                   {"scale: expected a finite number, given nan"}),
      forward_case("scale_infinite", [](Request& r) { r.options.scale = -INFINITY; },
                   {"scale: expected a finite number, given -inf"}),
      forward_case("window_left_below_minus_one", [](Request& r) { r.options.window.left = -2; },
                   {"window.left: expected -1 (unbounded) or a count >= 0, given -2"}),
      forward_case("window_right_below_minus_one", [](Request& r) { r.options.window.right = -5; },
                   {"window.right: expected -1 (unbounded) or a count >= 0, given -5"}),
      forward_case("softcap_negative", [](Request& r) { r.options.softcap = -1.0; },
                   {"softcap: expected a finite number >= 0 (0 is off), given -1.000000"}),
      forward_case("softcap_nan", [](Request& r) { r.options.softcap = NAN; },
                   {"softcap: expected a finite number >= 0 (0 is off), given nan"}),
      forward_case("softcap_infinite", [](Request& r) { r.options.softcap = INFINITY; },
                   {"softcap: expected a finite number >= 0 (0 is off), given inf"}),
      forward_case("dropout_negative", [](Request& r) { r.options.dropout_p = -0.5; },
                   {"dropout_p: expected a probability in [0, 1] (0 is off), given -0.500000"}),
      forward_case("dropout_above_one", [](Request& r) { r.options.dropout_p = 1.5; },
                   {"dropout_p: expected a probability in [0, 1] (0 is off), given 1.500000"}),
      forward_case("dropout_nan", [](Request& r) { r.options.dropout_p = NAN; },
                   {"dropout_p: expected a probability in [0, 1] (0 is off), given nan"}),
      forward_case("alibi_wrong_length",
                   [](Request& r) {
                     r.options.alibi_slopes = {1, 2, 3};
                   },
                   {"alibi_slopes: expected 4 values (one per query head), given 3"}),
      forward_case("alibi_nan",
                   [](Request& r) {
                     r.options.alibi_slopes = {1, 2, NAN, 4};
                   },
                   {"alibi_slopes: expected finite values, given nan at head 2"}),
      forward_case("alibi_minus_infinity",
                   [](Request& r) {
                     r.options.alibi_slopes = {1, -INFINITY, 3, 4};
                   },
                   {"alibi_slopes: expected finite values, given -inf at head 1"}),
      forward_case("sinks_wrong_length",
                   [](Request& r) {
                     r.options.sinks = {0, 0, 0, 0, 0};
                   },
                   {"sinks: expected 4 values (one per query head), given 5"}),
      forward_case("sinks_nan",
                   [](Request& r) {
                     r.options.sinks = {0, 0, 0, NAN};
                   },
                   {"sinks: expected finite values or -inf, given nan at head 3"}),
      forward_case("sinks_plus_infinity",
                   [](Request& r) {
                     r.options.sinks = {INFINITY, 0, 0, 0};
                   },
                   {"sinks: expected finite values or -inf, given inf at head 0"}),
      forward_case("threads_negative", [](Request& r) { r.options.threads = -1; },
                   {"threads: expected 0 (automatic) or a positive count, given -1"}),
  };
}

std::vector<ErrorCase> packed_cases() {
  const Request packed = Request::packed();
  return {
      forward_case(
          "cu_seqlens_k_missing", [](Request& r) { r.options.cu_seqlens_k.clear(); },
          {"cu_seqlens_k: expected offsets (both or neither are given), given none"}, packed),
      forward_case(
          "cu_seqlens_q_missing", [](Request& r) { r.options.cu_seqlens_q.clear(); },
          {"cu_seqlens_q: expected offsets (both or neither are given), given none"}, packed),
      forward_case("packed_batch_not_one",
                   [](Request& r) {
                     r.options.cu_seqlens_q = {0, 3};
                     r.options.cu_seqlens_k = {0, 5};
                   },
                   {"q: expected batch 1 for packed sequences (cu_seqlens given), given shape "
                    "[2, 4, 3, 8]"}),
      forward_case(
          "cu_seqlens_q_one_offset", [](Request& r) { r.options.cu_seqlens_q = {0}; },
          {"cu_seqlens_q: expected at least 2 offsets, given 1"}, packed),
      forward_case(
          "cu_seqlens_q_first_not_zero",
          [](Request& r) {
            r.options.cu_seqlens_q = {1, 6};
          },
          {"cu_seqlens_q: expected a first offset of 0, given [1, 6]"}, packed),
      forward_case(
          "cu_seqlens_k_decreasing",
          [](Request& r) {
            r.options.cu_seqlens_k = {0, 7, 3, 10};
          },
          {"cu_seqlens_k: expected non-decreasing offsets, given [0, 7, 3, 10]"}, packed),
      forward_case(
          "cu_seqlens_k_last_not_total",
          [](Request& r) {
            r.options.cu_seqlens_k = {0, 7, 9};
          },
          {"cu_seqlens_k: expected a last offset equal to the packed length 10, given "
           "[0, 7, 9]"},
          packed),
      forward_case(
          "cu_seqlens_count_differs",
          [](Request& r) {
            r.options.cu_seqlens_k = {0, 10};
          },
          {"cu_seqlens_k: expected 3 offsets (as cu_seqlens_q), given 2"}, packed),
      forward_case(
          "packed_with_mask",
          [](Request& r) {
            r.options.mask = input(DType::boolean, {1, 1, 6, 10});
          },
          {"mask: expected no mask with packed sequences (cu_seqlens given), given a "
           "mask"},
          packed),
  };
}

std::vector<ErrorCase> mask_cases() {
  const std::string expected = "mask: expected shape [2 or 1, 4 or 1, 3, 5], given ";
  return {
      forward_case("mask_batch_wrong",
                   [](Request& r) {
                     r.options.mask = input(DType::boolean, {3, 1, 3, 5});
                   },
                   {expected + "[3, 1, 3, 5]"}),
      forward_case("mask_heads_wrong",
                   [](Request& r) {
                     r.options.mask = input(DType::f32, {1, 2, 3, 5});
                   },
                   {expected + "[1, 2, 3, 5]"}),
      // Only the key dim wrong: a kernel would read past (or short of) each mask row.
      forward_case("mask_one_key_short",
                   [](Request& r) {
                     r.options.mask = input(DType::boolean, {2, 4, 3, 4});
                   },
                   {expected + "[2, 4, 3, 4]"}),
      forward_case("mask_one_key_long",
                   [](Request& r) {
                     r.options.mask = input(DType::f32, {1, 1, 3, 6});
                   },
                   {expected + "[1, 1, 3, 6]"}),
      forward_case("mask_rows_and_columns_swapped",
                   [](Request& r) {
                     r.options.mask = input(DType::f32, {2, 4, 5, 3});
                   },
                   {expected + "[2, 4, 5, 3]"}),
      forward_case("mask_strided_last_dim",
                   [](Request& r) {
                     r.options.mask = TensorView(input_storage().data(), DType::f32, {1, 1, 3, 5},
                                                 {15, 15, 10, 2});
                   },
                   {"mask: expected a contiguous last dim (stride 1), given stride 2"}),
      forward_case("mask_null_data",
                   [](Request& r) {
                     r.options.mask = TensorView(nullptr, DType::boolean, {1, 1, 3, 5});
                   },
                   {"mask: expected data, given a null pointer"}),
  };
}

std::vector<ErrorCase> output_cases() {
  return {
      forward_case("context_wrong_shape",
                   [](Request& r) {
                     r.outputs.context = output(DType::f32, {2, 4, 3, 8});
                   },
                   {"context: expected shape [2, 4, 3, 6], given [2, 4, 3, 8]"}),
      forward_case("context_boolean", [](Request& r) { r.outputs.context.dtype = DType::boolean; },
                   {"context: expected a floating-point dtype, given bool"}),
      forward_case("context_strided_last_dim", [](Request& r) { r.outputs.context.strides[3] = 3; },
                   {"context: expected a contiguous last dim (stride 1), given stride 3"}),
      forward_case("context_null_data", [](Request& r) { r.outputs.context.data = nullptr; },
                   {"context: expected data, given a null pointer"}),
      forward_case("lse_wrong_shape",
                   [](Request& r) {
                     r.outputs.lse = output(DType::f32, {2, 4, 3, 2});
                   },
                   {"lse: expected shape [2, 4, 3, 1], given [2, 4, 3, 2]"}),
      forward_case("lse_half_precision",
                   [](Request& r) {
                     r.outputs.lse = output(DType::f16, {2, 4, 3, 1});
                   },
                   {"lse: expected dtype float32 or float64, given float16"}),
      forward_case("weights_wrong_shape",
                   [](Request& r) {
                     r.outputs.weights = output(DType::f32, {2, 4, 3, 4});
                   },
                   {"weights: expected shape [2, 4, 3, 5], given [2, 4, 3, 4]"}),
      forward_case("weights_boolean",
                   [](Request& r) {
                     r.outputs.weights = output(DType::boolean, {2, 4, 3, 5});
                   },
                   {"weights: expected a floating-point dtype, given bool"}),
      forward_case(
          "packed_weights_per_sequence_shape",
          [](Request& r) {
            r.outputs.weights = output(DType::f32, {1, 4, 6, 7});
          },
          {"weights: expected shape [1, 4, 6, 10], given [1, 4, 6, 7]"}, Request::packed()),
      {"result_form_checks_inputs",
       [] {
         const Request r = Request::plain();
         forward(r.q, input(DType::boolean, {2, 2, 5, 8}), r.v);
       },
       {"k: expected a floating-point dtype, given bool"}},
  };
}

// Small valid lesson inputs: q [2, 4, 1, 2], k [2, 2, 3, 2].
TensorView lesson_q() {
  return input(DType::f64, {2, 4, 1, 2});
}
TensorView lesson_k() {
  return input(DType::f64, {2, 2, 3, 2});
}

ErrorCase scores_case(std::string name,
                      std::function<void(TensorView&, TensorView&, ScoreParams&)> edit,
                      std::vector<std::string> parts) {
  return {std::move(name),
          [edit] {
            TensorView q = lesson_q(), k = lesson_k();
            ScoreParams p;
            edit(q, k, p);
            scores(q, k, p);
          },
          std::move(parts)};
}

std::vector<ErrorCase> lesson_cases() {
  const TensorView m23 = input(DType::f64, {1, 1, 2, 3});
  return {
      scores_case("scores_q_boolean",
                  [](TensorView& q, TensorView&, ScoreParams&) { q.dtype = DType::boolean; },
                  {"q: expected a floating-point dtype, given bool"}),
      scores_case("scores_k_negative_extent",
                  [](TensorView&, TensorView& k, ScoreParams&) { k.shape[2] = -3; },
                  {"k: expected non-negative extents, given shape [2, 2, -3, 2]"}),
      scores_case("scores_q_strided_last_dim",
                  [](TensorView& q, TensorView&, ScoreParams&) { q.strides[3] = 2; },
                  {"q: expected a contiguous last dim (stride 1), given stride 2"}),
      scores_case("scores_k_null_data",
                  [](TensorView&, TensorView& k, ScoreParams&) { k.data = nullptr; },
                  {"k: expected data, given a null pointer"}),
      scores_case("scores_batch_differs",
                  [](TensorView&, TensorView& k, ScoreParams&) {
                    k = input(DType::f64, {1, 2, 3, 2});
                  },
                  {"k: expected batch 2 (as q), given [1, 2, 3, 2]"}),
      scores_case("scores_heads_not_dividing",
                  [](TensorView&, TensorView& k, ScoreParams&) {
                    k = input(DType::f64, {2, 3, 3, 2});
                  },
                  {"k: expected a head count dividing the 4 query heads, given 3 heads"}),
      scores_case("scores_no_key_heads",
                  [](TensorView&, TensorView& k, ScoreParams&) {
                    k = input(DType::f64, {2, 0, 3, 2});
                  },
                  {"k: expected a head count dividing the 4 query heads, given 0 heads"}),
      scores_case("scores_dot_dims_differ",
                  [](TensorView&, TensorView& k, ScoreParams& p) {
                    k = input(DType::f64, {2, 2, 3, 3});
                    p.kind = ScoreKind::dot;
                  },
                  {"k: expected head dim 2 (as q), given [2, 2, 3, 3]"}),
      scores_case("scores_scale_infinite",
                  [](TensorView&, TensorView&, ScoreParams& p) { p.scale = INFINITY; },
                  {"scale: expected a finite number, given inf"}),
      scores_case("scores_scale_with_dot",
                  [](TensorView&, TensorView&, ScoreParams& p) {
                    p.kind = ScoreKind::dot;
                    p.scale = 2.0;
                  },
                  {"scale: expected no scale (only scaled_dot scores take one), given 2.000000"}),
      scores_case("scores_general_without_weight",
                  [](TensorView&, TensorView& k, ScoreParams& p) {
                    k = input(DType::f64, {2, 2, 3, 3});
                    p.kind = ScoreKind::general;
                  },
                  {"weight: expected a [1, 1, 2, 3] matrix, given none"}),
      scores_case("scores_general_weight_transposed",
                  [](TensorView&, TensorView& k, ScoreParams& p) {
                    k = input(DType::f64, {2, 2, 3, 3});
                    p.kind = ScoreKind::general;
                    p.weight = input(DType::f64, {1, 1, 3, 2});
                  },
                  {"weight: expected shape [1, 1, 2, 3], given [1, 1, 3, 2]"}),
      scores_case("scores_general_weight_boolean",
                  [](TensorView&, TensorView&, ScoreParams& p) {
                    p.kind = ScoreKind::general;
                    p.weight = input(DType::boolean, {1, 1, 2, 2});
                  },
                  {"weight: expected a floating-point dtype, given bool"}),
      scores_case("scores_additive_without_energy",
                  [](TensorView&, TensorView&, ScoreParams& p) { p.kind = ScoreKind::additive; },
                  {"energy: expected a [1, 1, 1, A] vector, given none"}),
      scores_case("scores_additive_without_query_projection",
                  [](TensorView&, TensorView&, ScoreParams& p) {
                    p.kind = ScoreKind::additive;
                    p.energy = input(DType::f64, {1, 1, 1, 4});
                  },
                  {"query_projection: expected a [1, 1, 4, 2] matrix, given none"}),
      scores_case("scores_additive_key_projection_wrong",
                  [m23](TensorView&, TensorView&, ScoreParams& p) {
                    p.kind = ScoreKind::additive;
                    p.energy = input(DType::f64, {1, 1, 1, 2});
                    p.query_projection = input(DType::f64, {1, 1, 2, 2});
                    p.key_projection = m23;
                  },
                  {"key_projection: expected shape [1, 1, 2, 2], given [1, 1, 2, 3]"}),
      {"softmax_nan",
       [] {
         const double s[] = {0, NAN};
         softmax(TensorView(s, DType::f64, {1, 1, 1, 2}));
       },
       {"scores: expected finite values or -inf, given nan at [0, 0, 0, 1]"}},
      {"softmax_plus_infinity",
       [] {
         const double s[] = {0, 1, 2, INFINITY};
         softmax(TensorView(s, DType::f64, {1, 1, 2, 2}));
       },
       {"scores: expected finite values or -inf, given inf at [0, 0, 1, 1]"}},
      {"softmax_boolean",
       [] {
         softmax(input(DType::boolean, {1, 1, 1, 2}));
       },
       {"scores: expected a floating-point dtype, given bool"}},
      {"context_alpha_boolean",
       [] {
         context(input(DType::boolean, {1, 1, 1, 2}), input(DType::f64, {1, 1, 2, 1}));
       },
       {"alpha: expected a floating-point dtype, given bool"}},
      {"context_alpha_null_data",
       [] {
         context(TensorView(nullptr, DType::f64, {1, 1, 1, 2}), input(DType::f64, {1, 1, 2, 1}));
       },
       {"alpha: expected data, given a null pointer"}},
      {"context_values_length_differs",
       [] {
         context(input(DType::f64, {1, 2, 1, 2}), input(DType::f64, {1, 1, 3, 1}));
       },
       {"v: expected shape [1, Hkv, 2, Dv] (batch and key count of alpha), given [1, 1, 3, 1]"}},
      {"context_values_heads_not_dividing",
       [] {
         context(input(DType::f64, {1, 2, 1, 2}), input(DType::f64, {1, 3, 2, 1}));
       },
       {"v: expected a head count dividing the 2 query heads, given 3 heads"}},
  };
}

std::vector<ErrorCase> tensor_cases() {
  return {
      {"view_as_wrong_dtype",
       [] {
         input(DType::f64, {1, 1, 1, 1}).as<float>("q");
       },
       {"q: expected dtype float32, given float64"}},
      {"mutable_view_as_wrong_dtype",
       [] {
         output(DType::f16, {1, 1, 1, 1}).as<bfloat16>("out");
       },
       {"out: expected dtype bfloat16, given float16"}},
      {"tensor_data_as_wrong_dtype",
       [] {
         Tensor(DType::f32, {1, 1, 1, 1}).data_as<double>();
       },
       {"Tensor::data_as: expected dtype float64, given float32"}},
      {"tensor_negative_extent",
       [] {
         Tensor(DType::f32, {1, -1, 1, 1});
       },
       {"Tensor shape: expected non-negative extents, given [1, -1, 1, 1]"}},
      {"tensor_too_large",
       [] {
         Tensor(DType::f64, {1 << 20, 1 << 20, 1 << 20, 1});
       },
       {"Tensor shape: expected fewer than 2^63 bytes in all, given [1048576, 1048576, 1048576, "
        "1] of float64"}},
  };
}

std::vector<ErrorCase> all_cases() {
  std::vector<ErrorCase> all;
  for (auto list : {input_cases(), option_cases(), packed_cases(), mask_cases(), output_cases(),
                    lesson_cases(), tensor_cases()}) {
    all.insert(all.end(), list.begin(), list.end());
  }
  return all;
}

class Rejects : public ::testing::TestWithParam<ErrorCase> {};

// The message of the attn::Error that call throws; empty when it throws none.
std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

TEST_P(Rejects, WithMessageNamingArgument) {
  const ErrorCase& c = GetParam();
  const std::string message = error_of(c.call);
  ASSERT_FALSE(message.empty()) << "no attn::Error thrown";
  for (const std::string& part : c.message_parts) EXPECT_THAT(message, HasSubstr(part));
  if (c.check) {
    EXPECT_EQ(error_of(c.check), message) << "check_forward";
  }
}

std::string case_name(const ::testing::TestParamInfo<ErrorCase>& param) {
  return param.param.name;
}

INSTANTIATE_TEST_SUITE_P(BadInput, Rejects, ::testing::ValuesIn(all_cases()), case_name);

// The requests the cases start from are valid: each failure above comes from its one edit.
TEST(ValidRequests, BaseRequestsAreAccepted) {
  EXPECT_NO_THROW(Request::plain().check());
  EXPECT_NO_THROW(Request::packed().check());
  EXPECT_NO_THROW(Request::plain().run());
  EXPECT_NO_THROW(Request::packed().run());
  EXPECT_NO_THROW(scores(lesson_q(), lesson_k()));
}

TEST(ValidRequests, CheckForwardWritesNothing) {
  std::fill(output_storage().begin(), output_storage().end(), 7.0);
  Request::plain().check();
  EXPECT_EQ(std::count(output_storage().begin(), output_storage().end(), 7.0),
            static_cast<std::ptrdiff_t>(output_storage().size()));
}

TEST(ValidRequests, EdgeValuesAreAccepted) {
  Request r = Request::plain();
  r.options.window = {-1, 0};
  r.options.softcap = 0.0;
  r.options.sinks = {-INFINITY, 0, 0, 0};
  r.options.mask = input(DType::boolean, {2, 1, 3, 5});
  r.outputs.lse = MutableTensorView(output_storage().data() + 2048, DType::f64, {2, 4, 3, 1});
  EXPECT_NO_THROW(r.run());
}

// A weights matrix that cannot fit is refused before anything is allocated (4 TiB here; the
// allocation would fail, or succeed lazily and get the process killed while filled).
TEST(Memory, WeightsLargerThanMemoryThrowOutOfMemory) {
  const Index length = Index{1} << 20;
  const std::vector<float> zeros(static_cast<std::size_t>(length), 0.0f);
  const TensorView q(zeros.data(), DType::f32, {1, 1, length, 1});
  std::string message = "no error";
  try {
    weights(q, q);
  } catch (const OutOfMemory& e) {
    message = e.what();
  }
  EXPECT_THAT(message, HasSubstr("weights [1, 1, 1048576, 1048576] needs 4.0 TiB, more than the"));
  EXPECT_THAT(message, HasSubstr("select heads or rows, or ask for the top_k"));
  WeightSelection top;
  top.top_k = Index{1} << 40;
  const TensorView three(zeros.data(), DType::f32, {1, 1, 3, 1});
  const TensorView keys(zeros.data(), DType::f32, {1, 1, 1000, 1});
  EXPECT_EQ(weights(three, keys, {}, top).weights.shape(), (Dims{1, 1, 3, 1000}));
}

// ATTN_BACKEND may force the reference; anything else it says is a mistake to report, not to
// ignore (a misspelt "refernce" would silently run the fast kernel).
TEST(Environment, UnknownBackendIsRefused) {
  ASSERT_EQ(::setenv("ATTN_BACKEND", "bogus", 1), 0);
  std::string message = "no error";
  try {
    Request::plain().run();
  } catch (const Error& e) {
    message = e.what();
  }
  ::unsetenv("ATTN_BACKEND");
  EXPECT_EQ(message, "ATTN_BACKEND: expected 'reference' or unset (or empty), given 'bogus'");
  ASSERT_EQ(::setenv("ATTN_BACKEND", "", 1), 0);
  EXPECT_NO_THROW(Request::plain().run());
  ::unsetenv("ATTN_BACKEND");
}

}  // namespace
}  // namespace attn
