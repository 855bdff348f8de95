#include "viz/draw.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "viz/heatmap.hpp"
#include "viz/page.hpp"
#include "viz/steps_page.hpp"
#include "viz/tokens.hpp"

namespace attn::viz {
namespace {

std::string default_title(const TensorView& weights, const Picture& picture, Format format) {
  std::string title = "Attention weights";
  if (weights.shape[0] > 1) title += ", batch " + std::to_string(picture.batch);
  if (format != Format::html) title += ", head " + std::to_string(picture.head);
  return title;
}

}  // namespace

Format format_of(const std::string& path, const char* argument) {
  std::string extension = std::filesystem::path(path).extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (extension == ".svg") return Format::svg;
  if (extension == ".png") return Format::png;
  if (extension == ".html" || extension == ".htm") return Format::html;
  throw Error(std::string(argument) +
              ": expected a file name ending in .svg, .png or .html, given '" + path + "'");
}

// weights: [B, H, Lq, Lk]
std::string render(const TensorView& weights, Format format, const Picture& picture) {
  TokenLabels labels;
  if (picture.key_tokens.empty()) {
    labels = token_labels(picture.tokens, weights.shape[2], weights.shape[3], "tokens");
  } else {
    check_label_count(picture.tokens, weights.shape[2], "tokens", "query row");
    check_label_count(picture.key_tokens, weights.shape[3], "key_tokens", "key");
    labels = {picture.tokens, picture.key_tokens};
  }
  const std::string title =
      picture.title.empty() ? default_title(weights, picture, format) : picture.title;
  // HeatmapOptions or PageOptions, from their defaults; max_cells below 1 keeps the default.
  const auto fill = [&](auto options) {
    options.row_labels = labels.rows;
    options.column_labels = labels.columns;
    options.title = title;
    options.reduce = picture.reduce;
    if (picture.max_cells > 0) options.max_cells = picture.max_cells;
    return options;
  };
  if (format == Format::html)
    return attention_page_html(weights, picture.batch, fill(PageOptions{}));
  const HeatmapOptions options = fill(HeatmapOptions{});
  const Matrix matrix = head_matrix(weights, picture.batch, picture.head);
  return format == Format::svg ? heatmap_svg(matrix, options) : heatmap_png(matrix, options);
}

io::StagedFile stage_bytes(const std::string& bytes, const std::string& path) {
  io::StagedFile file(path);
  file.write(bytes.data(), bytes.size());
  return file;
}

io::StagedFile stage(const TensorView& weights, const std::string& path, const Picture& picture,
                     const char* argument) {
  return stage_bytes(render(weights, format_of(path, argument), picture), path);
}

void draw(const TensorView& weights, const std::string& path, const Picture& picture,
          const char* argument) {
  stage(weights, path, picture, argument).commit();
}

std::string render(const Blend& blend, Format format) {
  if (format == Format::svg) return blend_svg(blend);
  if (format == Format::png) return blend_png(blend);
  return blends_page_html({blend}, blend.title);
}

std::string blends_page_html(const std::vector<Blend>& blends, const std::string& title) {
  std::vector<PageStep> steps;
  for (const Blend& blend : blends) steps.push_back({blend.title, blend_svg_element(blend)});
  return steps_page_html(
      title,
      "Each row is one input: its value vector v_i (blue below 0, white at 0, red above), its "
      "weight alpha_i as a bar, and the scaled vector alpha_i v_i. The context C under the "
      "scaled rows is their sum, column by column. Point at a cell for its exact number.",
      steps);
}

}  // namespace attn::viz
