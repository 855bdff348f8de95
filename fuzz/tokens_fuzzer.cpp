// Token files on arbitrary bytes, through everything that reads their lines: split into
// tokens, checked against the weights' lengths, and drawn as the labels of an SVG heatmap.
// Tokens may hold markup, control bytes or broken UTF-8; the SVG must still be well-formed
// XML (expat decides), and nothing may crash. PNG and HTML are left out: drawing them too
// ran 5 inputs/s against 172 for SVG alone, and their labels go through the same
// clean_utf8 and shortened.
#include <expat.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/tensor.hpp"
#include "tokens_file.hpp"
#include "viz/draw.hpp"
#include "viz/tokens.hpp"

namespace {

// More labels only draw the same code more times, and slowly.
constexpr std::size_t kMaxTokens = 8;

bool well_formed_xml(const std::string& text) {
  XML_Parser parser = XML_ParserCreate("UTF-8");
  const bool ok = XML_Parse(parser, text.data(), static_cast<int>(text.size()), 1) == XML_STATUS_OK;
  XML_ParserFree(parser);
  return ok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> tokens =
      attn::tools::split_tokens(std::string(reinterpret_cast<const char*>(data), size));
  if (tokens.empty()) return 0;
  tokens.resize(std::min(tokens.size(), kMaxTokens));
  const auto count = static_cast<attn::Index>(tokens.size());

  // A count that fits neither length is refused with attn::Error.
  try {
    attn::viz::token_labels(tokens, count + 1, count + 2, "--viz-tokens");
    std::abort();
  } catch (const attn::Error&) {
  }

  // Weights of Lq = count queries over Lk = count + 1 keys: the tokens label the rows.
  attn::Tensor weights(attn::DType::f32, {1, 1, count, count + 1});
  float* values = weights.data_as<float>();
  for (attn::Index i = 0; i < count * (count + 1); ++i) {
    values[i] = static_cast<float>(i % 7) / 7.0f;
  }
  attn::viz::Picture picture;
  picture.tokens = tokens;
  if (!well_formed_xml(attn::viz::render(weights.view(), attn::viz::Format::svg, picture))) {
    std::abort();
  }
  return 0;
}
