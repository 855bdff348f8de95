// The blend picture: its drawn cells parse back (expat for the SVG, libpng for the PNG) to
// alpha_i, v_i, alpha_i v_i and C, C equals attn::forward's context to float32 rounding, a
// "rest" row keeps the columns summing to C, bad arguments are named, and the cache-block
// and step-page pictures hold what they are given.
#include <expat.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "support/decoded_png.hpp"
#include "viz/blend.hpp"
#include "viz/blend_layout.hpp"
#include "viz/cache_blocks.hpp"
#include "viz/colormap.hpp"
#include "viz/draw.hpp"
#include "viz/steps_page.hpp"

namespace attn::viz {
namespace {

using testing::decode_png;
using testing::DecodedPng;

// Every <rect> with a data-value, by class: value, weight, scaled, context or slot.
struct Cell {
  int row = 0, col = 0;
  double value = 0.0;
  std::string fill;
};
struct ParsedCells {
  bool well_formed = false;
  std::map<std::string, std::vector<Cell>> cells;
  std::string text;
};

ParsedCells parse_cells(const std::string& svg) {
  ParsedCells parsed;
  XML_Parser parser = XML_ParserCreate("UTF-8");
  XML_SetUserData(parser, &parsed);
  XML_SetElementHandler(
      parser,
      [](void* data, const XML_Char* name, const XML_Char** attributes) {
        if (std::string(name) != "rect") return;
        std::map<std::string, std::string> a;
        for (int i = 0; attributes[i]; i += 2) a[attributes[i]] = attributes[i + 1];
        if (!a.contains("data-value")) return;
        Cell cell;
        cell.row = a.contains("data-row") ? std::stoi(a["data-row"]) : 0;
        cell.col = a.contains("data-col") ? std::stoi(a["data-col"]) : 0;
        cell.value = std::stod(a["data-value"]);
        cell.fill = a["fill"];
        static_cast<ParsedCells*>(data)->cells[a["class"]].push_back(cell);
      },
      [](void*, const XML_Char*) {});
  XML_SetCharacterDataHandler(parser, [](void* data, const XML_Char* text, int length) {
    static_cast<ParsedCells*>(data)->text.append(text, static_cast<std::size_t>(length));
  });
  parsed.well_formed =
      XML_Parse(parser, svg.data(), static_cast<int>(svg.size()), 1) == XML_STATUS_OK;
  XML_ParserFree(parser);
  return parsed;
}

std::vector<float> random_floats(std::size_t count, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> out(count);
  for (float& x : out) x = normal(rng);
  return out;
}

// Cross-attention with grouped KV heads: q [1, 2, 3, 8], k [1, 1, Lk, 8], v [1, 1, Lk, Dv];
// weights and context from attn itself, in float32.
struct Attention {
  Index len_k = 0, dim_v = 0;
  std::vector<float> q, k, v;
  Tensor weights, context;
  TensorView v_view() const { return {v.data(), DType::f32, {1, 1, len_k, dim_v}}; }
};

Attention attention(Index len_k, Index dim_v, unsigned seed) {
  std::mt19937 rng(seed);
  Attention a{len_k,
              dim_v,
              random_floats(2 * 3 * 8, rng),
              random_floats(static_cast<std::size_t>(len_k * 8), rng),
              random_floats(static_cast<std::size_t>(len_k * dim_v), rng),
              {},
              {}};
  const TensorView q(a.q.data(), DType::f32, {1, 2, 3, 8});
  const TensorView k(a.k.data(), DType::f32, {1, 1, len_k, 8});
  a.weights = weights(q, k).weights;
  a.context = forward(q, k, a.v_view()).context;
  return a;
}

// The colour a number gets on the blend's scale: the largest |number| drawn.
std::string fill_of(const Blend& blend, double value) {
  return hex(diverging_colour_at(blend_colour_position(lay_out_blend(blend), value)));
}

TEST(DivergingColormap, RunsFromBlueThroughWhiteToRed) {
  EXPECT_EQ(hex(diverging_colour_at(0.0)), "#053061");
  EXPECT_EQ(hex(diverging_colour_at(0.5)), "#f7f7f7");
  EXPECT_EQ(hex(diverging_colour_at(1.0)), "#67001f");
  EXPECT_EQ(hex(diverging_colour_at(std::nan(""))), "#f7f7f7");
  EXPECT_EQ(hex(diverging_colour_at(9.0)), "#67001f");
}

TEST(BlendSvg, ParsesBackToWeightsValuesScaledRowsAndTheContextOfForward) {
  const Attention a = attention(5, 6, 1);
  BlendOptions options;
  options.head = 1;
  options.row = 2;
  options.tokens = {"the", "cat", "<sat>", "on", "mat"};
  const Blend blend = make_blend(a.weights.view(), a.v_view(), options);
  const ParsedCells svg = parse_cells(blend_svg(blend));
  ASSERT_TRUE(svg.well_formed);
  ASSERT_EQ(svg.cells.at("weight").size(), 5u);
  ASSERT_EQ(svg.cells.at("value").size(), 30u);
  ASSERT_EQ(svg.cells.at("scaled").size(), 30u);
  ASSERT_EQ(svg.cells.at("context").size(), 6u);
  const float* alpha = a.weights.data_as<float>() + (1 * 3 + 2) * 5;  // head 1, row 2
  std::vector<double> column_sums(6, 0.0);
  for (const Cell& w : svg.cells.at("weight")) EXPECT_EQ(w.value, alpha[w.row]);
  for (const Cell& v : svg.cells.at("value")) {
    EXPECT_EQ(v.value, a.v[static_cast<std::size_t>(v.row * 6 + v.col)]);
    EXPECT_EQ(v.fill, fill_of(blend, v.value));
  }
  for (const Cell& s : svg.cells.at("scaled")) {
    EXPECT_DOUBLE_EQ(s.value,
                     double{alpha[s.row]} * a.v[static_cast<std::size_t>(s.row * 6 + s.col)]);
    EXPECT_EQ(s.fill, fill_of(blend, s.value));
    column_sums[static_cast<std::size_t>(s.col)] += s.value;
  }
  const float* forward_context = a.context.data_as<float>() + (1 * 3 + 2) * 6;
  for (const Cell& c : svg.cells.at("context")) {
    EXPECT_NEAR(c.value, column_sums[static_cast<std::size_t>(c.col)], 1e-12);
    // forward rounds its float32 result once; its fp32 accumulation adds a few ulps more.
    EXPECT_NEAR(c.value, forward_context[c.col], 8 * FLT_EPSILON * (1.0 + std::abs(c.value)))
        << "column " << c.col;
    EXPECT_EQ(c.fill, fill_of(blend, c.value));
  }
  for (const char* text : {"0 the", "2 <sat>", "C = sum of the rows", "alpha_i v_i"}) {
    EXPECT_NE(svg.text.find(text), std::string::npos) << text;
  }
}

TEST(BlendSvg, SumsTheInputsPastTopIntoOneRestRowThatStillAddsUpToC) {
  const Attention a = attention(40, 12, 2);
  BlendOptions options;
  options.top = 5;
  const Blend blend = make_blend(a.weights.view(), a.v_view(), options);
  ASSERT_EQ(blend.rows.size(), 6u);
  const BlendRow& rest = blend.rows.back();
  EXPECT_EQ(rest.count, 35);
  EXPECT_EQ(rest.label, "rest: 35 inputs");
  // The five rows drawn in full are the five largest weights, in input order.
  std::vector<float> sorted(a.weights.data_as<float>(), a.weights.data_as<float>() + 40);
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  double top_total = 0.0;
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_GE(blend.rows[i].weight, sorted[4]);
    top_total += blend.rows[i].weight;
    if (i > 0) {
      EXPECT_LT(std::stoi(blend.rows[i - 1].label), std::stoi(blend.rows[i].label));
    }
  }
  EXPECT_NEAR(rest.weight, 1.0 - top_total, 1e-6);

  const ParsedCells svg = parse_cells(blend_svg(blend));
  ASSERT_TRUE(svg.well_formed);
  std::vector<double> column_sums(12, 0.0), rest_value(12, 0.0);
  for (const Cell& s : svg.cells.at("scaled"))
    column_sums[static_cast<std::size_t>(s.col)] += s.value;
  for (const Cell& v : svg.cells.at("value")) {
    if (v.row == 5) rest_value[static_cast<std::size_t>(v.col)] = v.value;
  }
  const float* forward_context = a.context.data_as<float>();  // head 0, row 0
  for (const Cell& c : svg.cells.at("context")) {
    const auto col = static_cast<std::size_t>(c.col);
    EXPECT_NEAR(column_sums[col], c.value, 1e-12) << "column " << c.col;
    EXPECT_NEAR(c.value, forward_context[c.col], 8 * FLT_EPSILON * (1.0 + std::abs(c.value)));
    // The rest's value row is what its total weight multiplies into its scaled row.
    EXPECT_NEAR(rest.weight * rest_value[col], rest.scaled[col], 1e-12);
  }
}

TEST(BlendPng, DrawsTheSvgsCellsAndBarsAtTheLayoutsPlaces) {
  const Attention a = attention(4, 5, 3);
  BlendOptions options;
  options.tokens = {"a", "b", "c", "d"};
  const Blend blend = make_blend(a.weights.view(), a.v_view(), options);
  const BlendLayout layout = lay_out_blend(blend);
  ASSERT_TRUE(layout.numbers);
  const DecodedPng png = decode_png(blend_png(blend));
  ASSERT_EQ(png.width, layout.width);
  ASSERT_EQ(png.height, layout.height);
  // A cell's corner, clear of its printed number.
  const auto cell_at = [&](int x, int y, std::size_t d) {
    return hex(png.at(x + static_cast<int>(d) * layout.cell_width + 2, y + 2));
  };
  for (std::size_t i = 0; i < blend.rows.size(); ++i) {
    const BlendRow& row = blend.rows[i];
    const int y = layout.row_y[i];
    for (std::size_t d = 0; d < 5; ++d) {
      EXPECT_EQ(cell_at(layout.value_x, y, d), fill_of(blend, row.value[d])) << i << ", " << d;
      EXPECT_EQ(cell_at(layout.scaled_x, y, d), fill_of(blend, row.scaled[d])) << i << ", " << d;
    }
    // The bar's length is the weight, bar_length px for 1.
    int bar = 0;
    while (png.at(layout.bar_x + bar, y + layout.cell_height / 2) == Rgb{0xe4, 0x57, 0x2e}) ++bar;
    EXPECT_EQ(bar, std::lround(row.weight * layout.bar_length)) << "row " << i;
  }
  for (std::size_t d = 0; d < 5; ++d) {
    EXPECT_EQ(cell_at(layout.scaled_x, layout.context_y, d), fill_of(blend, blend.context[d]));
  }
}

TEST(Blend, NamesBadArguments) {
  const Attention a = attention(5, 6, 4);
  const auto message = [&](const TensorView& w, const TensorView& v, const BlendOptions& o) {
    try {
      make_blend(w, v, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  BlendOptions options;
  options.row = 3;
  EXPECT_EQ(message(a.weights.view(), a.v_view(), options),
            "row: expected 0 .. 2 (weights [1, 2, 3, 5]), given 3");
  options = {};
  options.head = 2;
  options.names.head = "--head";
  EXPECT_EQ(message(a.weights.view(), a.v_view(), options),
            "--head: expected 0 .. 1 (weights [1, 2, 3, 5]), given 2");
  options = {};
  options.tokens = {"a", "b"};
  EXPECT_EQ(message(a.weights.view(), a.v_view(), options),
            "tokens: expected 5 tokens (one per input), given 2");
  options = {};
  options.top = 0;
  EXPECT_EQ(message(a.weights.view(), a.v_view(), options), "top: expected at least 1, given 0");
  const TensorView short_v(a.v.data(), DType::f32, {1, 1, 4, 6});
  EXPECT_EQ(message(a.weights.view(), short_v, {}),
            "value: expected [B, Hkv, Lk, Dv] = [1, a divisor of 2, 5, at least 1] to match "
            "weights [1, 2, 3, 5], given [1, 1, 4, 6]");
  const TensorView three_heads(a.v.data(), DType::f32, {1, 3, 1, 6});
  EXPECT_NE(message(a.weights.view(), three_heads, {}).find("value: expected"), std::string::npos);
  // Scores are not weights.
  const std::vector<double> scores = {2.0, 1.0, 0.5, 0.0, 0.3};
  EXPECT_EQ(message(TensorView(scores.data(), DType::f64, {1, 1, 1, 5}), a.v_view(), {})
                .rfind("weights: expected weights that sum to 1", 0),
            0u);
  const std::vector<double> negative = {1.5, -0.5, 0.0, 0.0, 0.0};
  EXPECT_EQ(message(TensorView(negative.data(), DType::f64, {1, 1, 1, 5}), a.v_view(), {}),
            "weights: expected weights >= 0, given -0.500000 at key 1 of row 0");
  const std::vector<double> nan_row = {0.5, 0.5, std::nan(""), 0.0, 0.0};
  EXPECT_EQ(message(TensorView(nan_row.data(), DType::f64, {1, 1, 1, 5}), a.v_view(), {}),
            "weights: expected finite values, given nan at [0, 0, 0, 2]");
}

TEST(Blend, RendersEveryFormatAndStepsThroughSeveralOnOnePage) {
  const Attention a = attention(5, 6, 5);
  std::vector<Blend> blends;
  for (Index row = 0; row < 3; ++row) {
    BlendOptions options;
    options.row = row;
    blends.push_back(make_blend(a.weights.view(), a.v_view(), options));
  }
  EXPECT_EQ(render(blends[0], Format::svg).rfind("<?xml", 0), 0u);
  EXPECT_EQ(render(blends[0], Format::png).rfind("\x89PNG\r\n", 0), 0u);
  const std::string single = render(blends[0], Format::html);
  EXPECT_EQ(single.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(single.find("<div class=\"controls\" hidden>"), std::string::npos);
  const std::string page = blends_page_html(blends, "three <queries>");
  EXPECT_NE(page.find("<h1>three &lt;queries&gt;</h1>"), std::string::npos);
  EXPECT_NE(page.find("max=\"2\""), std::string::npos);
  for (const char* step :
       {"data-step-index=\"0\"", "data-step-index=\"1\"", "data-step-index=\"2\""}) {
    EXPECT_NE(page.find(step), std::string::npos) << step;
  }
  EXPECT_EQ(page.find("<?xml"), std::string::npos) << "an XML declaration inside HTML";
  EXPECT_EQ(page.find("http://"), page.find("http://www.w3.org/2000/svg")) << "a network link";
  EXPECT_THROW(steps_page_html("none", "", {}), Error);
}

TEST(CacheBlocks, DrawsEveryBlockWithItsFilledAndEmptySlots) {
  const CacheBlocks cache{.page_size = 2,
                          .block_table = {7, 3, 5},
                          .tokens = {"the", "cat", "sat", "on", "<the>"},
                          .weights = {0.1, 0.5, 0.2, 0.15, 0.05}};
  const std::string svg = cache_blocks_svg_element(cache);
  const ParsedCells parsed = parse_cells(svg);
  ASSERT_TRUE(parsed.well_formed);
  ASSERT_EQ(parsed.cells.at("slot").size(), 5u);
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(parsed.cells.at("slot")[i].value, cache.weights[i]);
    EXPECT_EQ(parsed.cells.at("slot")[i].fill, hex(colour_at(cache.weights[i])));
  }
  std::size_t empty = 0;
  for (std::size_t at = svg.find("class=\"empty\""); at != std::string::npos;
       at = svg.find("class=\"empty\"", at + 1)) {
    ++empty;
  }
  EXPECT_EQ(empty, 1u) << "6 slots in 3 blocks hold 5 tokens";
  for (const char* text :
       {"block 7", "block 3", "block 5", "&lt;the&gt;", "5 tokens in 3 blocks"}) {
    EXPECT_NE(svg.find(text), std::string::npos) << text;
  }
  CacheBlocks wrong = cache;
  wrong.block_table = {7, 3};
  EXPECT_THROW(cache_blocks_svg_element(wrong), Error);
  wrong = cache;
  wrong.weights.pop_back();
  EXPECT_THROW(cache_blocks_svg_element(wrong), Error);
}

}  // namespace
}  // namespace attn::viz
