// Pictures of weights: the SVG is well-formed XML with one cell per (downsampled) weight in
// row-major order and the colour of its value; the PNG decodes to the layout's size with
// those colours at the cells; downsampling keeps block maxima or means; token text cannot
// break the markup; files appear whole or not at all.
#include <expat.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "support/decoded_png.hpp"
#include "support/temp_dir.hpp"
#include "viz/colormap.hpp"
#include "viz/downsample.hpp"
#include "viz/draw.hpp"
#include "viz/heatmap.hpp"
#include "viz/heatmap_layout.hpp"
#include "viz/markup.hpp"
#include "viz/matrix.hpp"
#include "viz/page.hpp"

namespace attn::viz {
namespace {

using testing::decode_png;
using testing::DecodedPng;
using testing::TempDir;

// rows x cols, entry (i, j) = f(i, j)
template <class F>
Matrix make_matrix(Index rows, Index cols, F f) {
  Matrix m{rows, cols, {}};
  for (Index i = 0; i < rows; ++i) {
    for (Index j = 0; j < cols; ++j) m.values.push_back(f(i, j));
  }
  return m;
}

// Distinct values, so that a cell out of place has the wrong colour.
Matrix ramp(Index rows, Index cols) {
  return make_matrix(rows, cols, [&](Index i, Index j) {
    return static_cast<double>(i * cols + j) / static_cast<double>(rows * cols);
  });
}

// What expat saw of an SVG: whether it parsed, the fill of every <rect> inside the
// <g class="cells"> group in document order, and all character data.
struct ParsedSvg {
  bool well_formed = false;
  std::string error;
  std::vector<std::string> cell_fills;
  std::string text;
  int depth_in_cells = 0;
};

ParsedSvg parse_svg(const std::string& svg) {
  ParsedSvg parsed;
  XML_Parser parser = XML_ParserCreate("UTF-8");
  XML_SetUserData(parser, &parsed);
  XML_SetElementHandler(
      parser,
      [](void* data, const XML_Char* name, const XML_Char** attributes) {
        auto& p = *static_cast<ParsedSvg*>(data);
        std::string class_name, fill;
        for (int i = 0; attributes[i]; i += 2) {
          if (std::string(attributes[i]) == "class") class_name = attributes[i + 1];
          if (std::string(attributes[i]) == "fill") fill = attributes[i + 1];
        }
        if (p.depth_in_cells > 0) {
          ++p.depth_in_cells;
          if (std::string(name) == "rect") p.cell_fills.push_back(fill);
        } else if (class_name == "cells") {
          p.depth_in_cells = 1;
        }
      },
      [](void* data, const XML_Char*) {
        auto& p = *static_cast<ParsedSvg*>(data);
        if (p.depth_in_cells > 0) --p.depth_in_cells;
      });
  XML_SetCharacterDataHandler(parser, [](void* data, const XML_Char* text, int length) {
    static_cast<ParsedSvg*>(data)->text.append(text, static_cast<std::size_t>(length));
  });
  parsed.well_formed =
      XML_Parse(parser, svg.data(), static_cast<int>(svg.size()), 1) == XML_STATUS_OK;
  if (!parsed.well_formed) parsed.error = XML_ErrorString(XML_GetErrorCode(parser));
  XML_ParserFree(parser);
  return parsed;
}

// The fills a heatmap of `cells` must have, row-major, on a scale from min(0, low) to high.
std::vector<std::string> expected_fills(const Matrix& cells) {
  const Range range = value_range(cells);
  const double low = std::min(0.0, range.low), high = range.high;
  std::vector<std::string> fills;
  for (const double value : cells.values)
    fills.push_back(hex(colour_at((value - low) / (high - low))));
  return fills;
}

TEST(Colormap, RunsFromDarkPurpleToYellow) {
  EXPECT_EQ(hex(colour_at(0.0)), "#440154");
  EXPECT_EQ(hex(colour_at(1.0)), "#fde725");
  EXPECT_EQ(hex(colour_at(-3.0)), "#440154");
  EXPECT_EQ(hex(colour_at(7.0)), "#fde725");
  // Brightness rises monotonically, so larger weights always look lighter.
  double previous = -1.0;
  for (int i = 0; i <= 100; ++i) {
    const Rgb c = colour_at(i / 100.0);
    const double luma = 0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b;
    EXPECT_GE(luma, previous - 0.5) << "t = " << i / 100.0;
    previous = luma;
  }
}

TEST(Downsample, KeepsSmallMatricesAsTheyAre) {
  const Matrix m = ramp(3, 5);
  const Blocks blocks = downsample(m, 512, Reduce::max);
  EXPECT_EQ(blocks.row_block, 1);
  EXPECT_EQ(blocks.col_block, 1);
  EXPECT_EQ(blocks.cells.values, m.values);
}

TEST(Downsample, TakesTheMaxOrMeanOfEachBlockWithPartialLastBlocks) {
  // 7 x 5 into at most 3 x 3 cells: blocks of 3 x 2, the last row of blocks 1 row high and
  // the last column 1 column wide.
  const Matrix m = ramp(7, 5);
  for (const Reduce reduce : {Reduce::max, Reduce::mean}) {
    const Blocks blocks = downsample(m, 3, reduce);
    ASSERT_EQ(blocks.row_block, 3);
    ASSERT_EQ(blocks.col_block, 2);
    ASSERT_EQ(blocks.cells.rows, 3);
    ASSERT_EQ(blocks.cells.cols, 3);
    for (Index r = 0; r < 3; ++r) {
      for (Index c = 0; c < 3; ++c) {
        double max = -1.0, sum = 0.0;
        int count = 0;
        for (Index i = 3 * r; i < std::min<Index>(7, 3 * r + 3); ++i) {
          for (Index j = 2 * c; j < std::min<Index>(5, 2 * c + 2); ++j) {
            max = std::max(max, m(i, j));
            sum += m(i, j);
            ++count;
          }
        }
        EXPECT_DOUBLE_EQ(blocks.cells(r, c), reduce == Reduce::max ? max : sum / count)
            << "cell " << r << ", " << c;
      }
    }
  }
  EXPECT_THROW(downsample(m, 0, Reduce::max), Error);
  EXPECT_EQ(parse_reduce("mean", "--downsample"), Reduce::mean);
  EXPECT_THROW(parse_reduce("median", "--downsample"), Error);
}

TEST(HeatmapSvg, IsXmlWithOneCellPerWeightInRowMajorOrder) {
  const Matrix m = ramp(6, 9);
  const ParsedSvg svg = parse_svg(heatmap_svg(m, {}));
  ASSERT_TRUE(svg.well_formed) << svg.error;
  EXPECT_EQ(svg.cell_fills, expected_fills(m));
  EXPECT_EQ(svg.cell_fills.front(), "#440154");  // 0, the scale's bottom
  EXPECT_EQ(svg.cell_fills.back(), "#fde725");   // the largest value, the scale's top
}

TEST(HeatmapSvg, DownsamplesLargeMatricesToMaxCells) {
  // 1000 x 600 in blocks of 2 x 2 (max_cells 500): 500 x 300 cells.
  const Matrix m =
      make_matrix(1000, 600, [](Index i, Index j) { return ((i * 7 + j * 3) % 11) / 10.0; });
  HeatmapOptions options;
  options.max_cells = 500;
  for (const Reduce reduce : {Reduce::max, Reduce::mean}) {
    options.reduce = reduce;
    const ParsedSvg svg = parse_svg(heatmap_svg(m, options));
    ASSERT_TRUE(svg.well_formed) << svg.error;
    EXPECT_EQ(svg.cell_fills, expected_fills(downsample(m, 500, reduce).cells));
  }
}

TEST(HeatmapSvg, LabelsTokensAndSurvivesMarkupAndBrokenUtf8) {
  const Matrix m = ramp(4, 4);
  HeatmapOptions options;
  options.row_labels = {"<b>", "a&b", "\"q\"", "caf\xC3\xA9"};
  options.column_labels = {"x", "\xFF\xFEy", "tab\there", "z\xEF\xBF\xBF"};
  options.title = "weights </svg>";
  const ParsedSvg svg = parse_svg(heatmap_svg(m, options));
  ASSERT_TRUE(svg.well_formed) << svg.error;
  for (const char* text : {"<b>", "a&b", "\"q\"", "caf\xC3\xA9", "\xEF\xBF\xBD\xEF\xBF\xBDy",
                           "tab?here", "weights </svg>", "key", "query"}) {
    EXPECT_NE(svg.text.find(text), std::string::npos) << text;
  }
}

TEST(HeatmapSvg, LabelsEveryNthTokenWhenTheyWouldCollide) {
  std::vector<std::string> tokens;
  for (int i = 0; i < 512; ++i) tokens.push_back(std::to_string(i) + "th");
  const Matrix m = ramp(512, 512);
  const HeatmapLayout layout = lay_out_heatmap(m, {tokens, tokens, "", Reduce::max, 512});
  ASSERT_GE(layout.row_labels.size(), 10u);
  ASSERT_LT(layout.row_labels.size(), 100u);
  for (std::size_t i = 1; i < layout.row_labels.size(); ++i) {
    EXPECT_GE(layout.row_labels[i].offset - layout.row_labels[i - 1].offset, layout.font_px);
  }
  // Eight tokens: all labelled, in large cells.
  const HeatmapLayout small = lay_out_heatmap(ramp(8, 8), {});
  EXPECT_EQ(small.row_labels.size(), 8u);
  EXPECT_EQ(small.column_labels.size(), 8u);
  EXPECT_GE(small.cell_width, 30);
  EXPECT_EQ(small.cell_height, small.cell_width);
}

TEST(HeatmapLayout, ASingleDecodeRowStaysAVisibleStrip) {
  const HeatmapLayout layout = lay_out_heatmap(ramp(1, 300), {});
  EXPECT_EQ(layout.cell_width, 2);
  EXPECT_GE(layout.plot.height, 30);
}

TEST(HeatmapPng, DecodesToTheLayoutSizeWithEachCellsColour) {
  const Matrix m = ramp(5, 7);
  HeatmapOptions options;
  options.row_labels = {"a", "b", "c", "d", "e"};
  const HeatmapLayout layout = lay_out_heatmap(m, options);
  const DecodedPng png = decode_png(heatmap_png(m, options));
  ASSERT_EQ(png.width, layout.width);
  ASSERT_EQ(png.height, layout.height);
  const std::vector<std::string> fills = expected_fills(m);
  for (Index r = 0; r < m.rows; ++r) {
    for (Index c = 0; c < m.cols; ++c) {
      const int x = layout.plot.x + static_cast<int>(c) * layout.cell_width + layout.cell_width / 2;
      const int y =
          layout.plot.y + static_cast<int>(r) * layout.cell_height + layout.cell_height / 2;
      EXPECT_EQ(hex(png.at(x, y)), fills[static_cast<std::size_t>(r * m.cols + c)])
          << "cell " << r << ", " << c;
    }
  }
  EXPECT_EQ(hex(png.at(0, 0)), "#ffffff");
  // The colour bar runs from the top colour to the bottom one, inside a one-pixel frame.
  const int bar_x = layout.bar.x + layout.bar.width / 2, last = layout.bar.height - 1;
  EXPECT_EQ(png.at(bar_x, layout.bar.y + 1), colour_at(1.0 - 1.0 / last));
  EXPECT_EQ(png.at(bar_x, layout.bar.y + last - 1), colour_at(1.0 / last));
}

TEST(HeatmapPng, DrawsLabelTextInTheMargin) {
  const Matrix m = ramp(3, 3);
  HeatmapOptions options;
  options.row_labels = {"WWW", "WWW", "WWW"};
  const HeatmapLayout layout = lay_out_heatmap(m, options);
  const DecodedPng png = decode_png(heatmap_png(m, options));
  int ink = 0;
  for (int y = layout.plot.y; y < layout.plot.y + layout.plot.height; ++y) {
    for (int x = 0; x < layout.plot.x; ++x) ink += png.at(x, y) != Rgb{255, 255, 255};
  }
  EXPECT_GT(ink, 3 * 20);  // each "WWW" has dozens of pixels
}

TEST(Heatmap, RefusesLabelsOfTheWrongCount) {
  HeatmapOptions options;
  options.row_labels = {"a", "b"};
  try {
    heatmap_svg(ramp(3, 3), options);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "row_labels: expected 3 tokens (one per query row), given 2");
  }
}

TEST(HeadMatrix, ReadsOneHeadOfAnyFloatDtypeAndNamesBadArguments) {
  std::vector<float> values(2 * 3 * 4 * 5);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  const TensorView weights(values.data(), DType::f32, {2, 3, 4, 5});
  const Matrix m = head_matrix(weights, 1, 2);
  EXPECT_EQ(m.rows, 4);
  EXPECT_EQ(m.cols, 5);
  EXPECT_EQ(m(0, 0), ((1 * 3 + 2) * 4) * 5);
  EXPECT_EQ(m(3, 4), ((1 * 3 + 2) * 4 + 3) * 5 + 4);
  EXPECT_THROW(head_matrix(weights, 2, 0), Error);
  EXPECT_THROW(head_matrix(weights, 0, -1), Error);
  values[7] = std::numeric_limits<float>::quiet_NaN();
  try {
    head_matrix(weights, 0, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weights: expected finite values"), std::string::npos);
  }
}

TEST(Markup, EscapesAndRepairsText) {
  EXPECT_EQ(xml_escaped("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
  EXPECT_EQ(clean_utf8("ok\xC3\xA9\xC3"), "ok\xC3\xA9\xEF\xBF\xBD");
  EXPECT_EQ(clean_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong '/'
  EXPECT_EQ(clean_utf8("a\nb\x7F"), "a?b?");
  // U+FFFE and U+FFFF: valid UTF-8, but no XML character.
  EXPECT_EQ(clean_utf8("\xEF\xBF\xBE\xEF\xBF\xBF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(json_string("</script>\"\\"), "\"\\u003c/script\\u003e\\\"\\\\\"");
  EXPECT_EQ(shortened("abcdef", 4), "abc\xE2\x80\xA6");
  EXPECT_EQ(shortened("abcd", 4), "abcd");
  EXPECT_EQ(shortened("\xC3\xA9\xC3\xA9\xC3\xA9", 2), "\xC3\xA9\xE2\x80\xA6");
}

TEST(Page, HoldsEveryHeadAndNeedsNoNetwork) {
  std::vector<float> values(3 * 4 * 4, 0.25f);
  const TensorView weights(values.data(), DType::f32, {1, 3, 4, 4});
  PageOptions options;
  options.row_labels = {"a", "b", "</script>", "d"};
  options.column_labels = options.row_labels;
  const std::string html = attention_page_html(weights, 0, options);
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"));
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("</script>\""), std::string::npos);  // a token cannot end the script
  EXPECT_NE(html.find("\"heads\":3"), std::string::npos);
  EXPECT_THROW(attention_page_html(weights, 1, options), Error);
}

TEST(Draw, PicksTheFormatFromTheNameAndWritesWholeFilesOnly) {
  EXPECT_EQ(format_of("a/b.SVG", "out"), Format::svg);
  EXPECT_EQ(format_of("x.png", "out"), Format::png);
  EXPECT_EQ(format_of("x.htm", "out"), Format::html);
  try {
    format_of("x.jpg", "--out");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "--out: expected a file name ending in .svg, .png or .html, given 'x.jpg'");
  }
  std::vector<double> values(2 * 6 * 6, 1.0 / 6.0);
  const TensorView weights(values.data(), DType::f64, {1, 2, 6, 6});
  const TempDir dir;
  Picture picture;
  picture.head = 1;
  picture.tokens = {"the", "cat", "sat", "on", "the", "mat"};
  for (const char* name : {"w.svg", "w.png", "w.html"}) draw(weights, dir.file(name), picture);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"w.html", "w.png", "w.svg"}));
  // A failure while drawing (here: a head that does not exist) leaves nothing behind.
  picture.head = 2;
  EXPECT_THROW(draw(weights, dir.file("bad.svg"), picture), Error);
  picture.head = 0;
  picture.tokens = {"too", "few"};
  EXPECT_THROW(draw(weights, dir.file("bad.png"), picture), Error);
  EXPECT_THROW(draw(weights, dir.file("missing/dir/w.svg"), {}), Error);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"w.html", "w.png", "w.svg"}));
}

}  // namespace
}  // namespace attn::viz
