// The whole-model page: it carries every layer's weights exactly (float32, base64) and the
// tokens safely inside its <script> blocks, and refuses bad shapes and label counts naming
// the argument. tests/python/test_viz_model.py opens it in Chromium with a real model.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "viz/model_page.hpp"

namespace attn::viz {
namespace {

// The text of the element with id="id" in `page`.
std::string element_text(const std::string& page, const std::string& id) {
  const std::size_t open = page.find("id=\"" + id + "\">");
  EXPECT_NE(open, std::string::npos) << id;
  const std::size_t start = page.find('>', open) + 1;
  return page.substr(start, page.find("</script>", start) - start);
}

std::vector<float> decode_float32(const std::string& base64) {
  const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<unsigned char> bytes;
  std::uint32_t bits = 0;
  int count = 0;
  for (const char c : base64) {
    if (c == '=') break;
    bits = (bits << 6) | static_cast<std::uint32_t>(alphabet.find(c));
    if ((count += 6) >= 8) {
      count -= 8;
      bytes.push_back(static_cast<unsigned char>(bits >> count));
    }
  }
  std::vector<float> values(bytes.size() / 4);
  std::memcpy(values.data(), bytes.data(), values.size() * 4);  // little-endian, as written
  return values;
}

// layers x heads x n x n softmax-like rows with distinct values.
std::vector<float> model_weights(Index layers, Index heads, Index n) {
  std::vector<float> w;
  for (Index i = 0; i < layers * heads * n; ++i) {
    float sum = 0.0f;
    std::vector<float> row;
    for (Index j = 0; j < n; ++j) row.push_back(1.0f + static_cast<float>((i * 7 + j * 3) % 11));
    for (const float x : row) sum += x;
    for (const float x : row) w.push_back(x / sum);
  }
  return w;
}

TEST(ModelPage, CarriesEveryWeightExactlyAndTheTokensSafely) {
  const Index layers = 3, heads = 2, n = 5;
  const std::vector<float> w = model_weights(layers, heads, n);
  ModelPageOptions options;
  options.tokens = {"[CLS]", "</script><b>", "caf\xC3\xA9", "&", "[SEP]"};
  options.special = {true, false, false, false, true};
  options.title = "tiny <model>";
  const std::string page =
      model_page_html(TensorView(w.data(), DType::f32, {layers, heads, n, n}), options);
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(decode_float32(element_text(page, "attn-weights")), w);
  const std::string data = element_text(page, "attn-data");
  EXPECT_NE(data.find("\"layers\":3,\"heads\":2"), std::string::npos) << data;
  EXPECT_NE(data.find("\"special\":[true,false,false,false,true]"), std::string::npos) << data;
  EXPECT_EQ(data.find('<'), std::string::npos) << "a token could end the <script>: " << data;
  EXPECT_NE(page.find("<title>tiny &lt;model&gt;</title>"), std::string::npos);
  for (const char* external : {"http://", "https://", "src=", "@import"}) {
    const std::size_t at = page.find(external);
    // The SVG namespace is a name, not a fetch.
    if (at != std::string::npos) {
      EXPECT_EQ(page.substr(at, 26), "http://www.w3.org/2000/svg") << external;
    }
  }
}

// The contributions as given and the rollout as attn::rollout computes it, both exact in
// float32, beside the weights; no contributions block without contributions.
TEST(ModelPage, CarriesTheContributionsAndTheRollout) {
  const Index layers = 3, heads = 2, n = 4;
  const std::vector<float> w = model_weights(layers, heads, n);
  std::vector<float> c(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) c[i] = w[i] * static_cast<float>(1 + i % 5);
  const TensorView weights(w.data(), DType::f32, {layers, heads, n, n});
  ModelPageOptions options;
  options.contributions = TensorView(c.data(), DType::f32, {layers, heads, n, n});
  const std::string page = model_page_html(weights, options);
  EXPECT_EQ(decode_float32(element_text(page, "attn-contributions")), c);
  const Tensor rolled = rollout(weights);
  std::vector<float> want;
  for (Index i = 0; i < rolled.numel(); ++i)
    want.push_back(static_cast<float>(rolled.data_as<double>()[i]));
  EXPECT_EQ(decode_float32(element_text(page, "attn-rollout")), want);
  EXPECT_EQ(model_page_html(weights, {}).find("id=\"attn-contributions\""), std::string::npos);
}

TEST(ModelPage, RefusesBadShapesAndLabelsNamingTheArgument) {
  const std::vector<float> w = model_weights(2, 2, 3);
  const TensorView good(w.data(), DType::f32, {2, 2, 3, 3});
  const auto message = [](const TensorView& weights, const ModelPageOptions& options) {
    try {
      model_page_html(weights, options);
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(
      message(TensorView(w.data(), DType::f32, {2, 2, 2, 4}), {})
          .rfind("weights: expected [layers, heads, L, L] with at least one layer, head and token "
                 "(self-attention over one text), given [2, 2, 2, 4]",
                 0),
      0u);
  ModelPageOptions options;
  options.contributions = TensorView(w.data(), DType::f32, {1, 2, 3, 3});
  EXPECT_EQ(message(good, options),
            "contributions: expected the weights' shape [2, 2, 3, 3], given [1, 2, 3, 3]");
  options.contributions.reset();
  options.tokens = {"a", "b"};
  EXPECT_EQ(message(good, options), "tokens: expected 3 tokens (one per position), given 2");
  options.tokens.clear();
  options.special = {true};
  EXPECT_EQ(message(good, options), "special: expected 3 flags (one per token), given 1");
  const float one = 1.0f;
  const TensorView huge(&one, DType::f32, {64, 64, 4096, 4096}, {0, 0, 0, 0});
  EXPECT_NE(message(huge, {}).find("draw a shorter text"), std::string::npos);
}

}  // namespace
}  // namespace attn::viz
