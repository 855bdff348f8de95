// Uses the installed attn: the lesson's three-word example through attn::forward, and one
// bad call to see attn::Error cross the library boundary.
#include <attn/attn.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>

int main() {
  // Keys = values = three 2-d embeddings; the query is the second word; plain dot scores.
  const double embeddings[] = {1, 0, 0, 1, 1, 1};
  const double query[] = {0, 1};
  const attn::TensorView q(query, attn::DType::f64, {1, 1, 1, 2});
  const attn::TensorView kv(embeddings, attn::DType::f64, {1, 1, 3, 2});
  attn::Options options;
  options.scale = 1.0;
  const attn::Result result = attn::forward(q, kv, kv, options);
  const double* context = result.context.data_as<double>();
  const double e = std::exp(1.0), total = 1 + 2 * e;
  if (std::abs(context[0] - (1 + e) / total) > 1e-12 ||
      std::abs(context[1] - 2 * e / total) > 1e-12) {
    std::printf("wrong context: %.17g %.17g\n", context[0], context[1]);
    return 1;
  }

  const attn::TensorView wrong_v(embeddings, attn::DType::f64, {1, 1, 2, 2});
  try {
    attn::forward(q, kv, wrong_v, options);
    std::printf("a mismatched v was accepted\n");
    return 1;
  } catch (const attn::Error& error) {
    if (std::strncmp(error.what(), "v: expected", 11) != 0) {
      std::printf("unexpected message: %s\n", error.what());
      return 1;
    }
  }
  std::printf("attn %s found and working\n", attn::version);
  return 0;
}
