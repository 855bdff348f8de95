#include "viz/page.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "viz/colormap.hpp"
#include "viz/markup.hpp"
#include "viz/matrix.hpp"
#include "viz/tokens.hpp"

namespace attn::viz {
namespace {

// The page's style and script. The script reads the JSON data block, draws, and finally
// marks <body data-ready="true"> so that a headless browser can tell it ran to the end.
constexpr const char* kStyle = R"CSS(
body { font: 14px/1.4 "DejaVu Sans", Helvetica, Arial, sans-serif; color: #222; margin: 16px 24px; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 20px 0 8px; }
p.note { color: #555; margin: 0 0 12px; max-width: 900px; }
.controls { margin: 8px 0 12px; }
.grid { display: flex; flex-wrap: wrap; gap: 10px; }
.thumb { text-align: center; cursor: pointer; border: 2px solid transparent; padding: 2px; font-size: 12px; }
.thumb.selected { border-color: #e4572e; }
.thumb canvas { display: block; image-rendering: pixelated; width: 96px; height: 96px; }
.views { display: flex; flex-wrap: wrap; gap: 32px; align-items: flex-start; }
#heatmap { image-rendering: pixelated; border: 1px solid #888; }
#cell { min-height: 1.4em; font-family: "DejaVu Sans Mono", monospace; font-size: 12px; }
#head-view text { font-size: 12px; cursor: default; }
#head-view text.query { cursor: pointer; }
#head-view text.active { font-weight: bold; fill: #e4572e; }
.scale { display: flex; align-items: center; gap: 6px; font-size: 12px; }
.scale canvas { width: 160px; height: 12px; border: 1px solid #888; }
)CSS";

constexpr const char* kScript = R"JS(
"use strict";
const data = JSON.parse(document.getElementById("attn-data").textContent);
const colour = colourMap(data.anchors);

function headMax(h) {
  let m = 0;
  for (const w of data.weights[h]) m = Math.max(m, w);
  return m > 0 ? m : 1;
}

function paint(canvas, h) {
  canvas.width = data.cols;
  canvas.height = data.rows;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(data.cols, data.rows);
  const m = headMax(h), w = data.weights[h];
  for (let i = 0; i < w.length; ++i) {
    const c = colour(w[i] / m);
    image.data.set([c[0], c[1], c[2], 255], 4 * i);
  }
  ctx.putImageData(image, 0, 0);
}

const select = document.getElementById("head");
const grid = document.getElementById("grid");
const thumbs = [];
for (let h = 0; h < data.heads; ++h) {
  const option = document.createElement("option");
  option.value = h;
  option.textContent = "head " + h;
  select.appendChild(option);
  const thumb = document.createElement("div");
  thumb.className = "thumb";
  const canvas = document.createElement("canvas");
  paint(canvas, h);
  thumb.appendChild(canvas);
  thumb.appendChild(document.createTextNode("head " + h));
  thumb.addEventListener("click", () => show(h));
  grid.appendChild(thumb);
  thumbs.push(thumb);
}
select.addEventListener("change", () => show(Number(select.value)));

const heatmap = document.getElementById("heatmap");
const cellInfo = document.getElementById("cell");
const zoom = Math.max(1, Math.min(48, Math.floor(480 / Math.max(data.rows, data.cols))));
heatmap.style.width = data.cols * zoom + "px";
heatmap.style.height = data.rows * zoom + "px";
heatmap.addEventListener("mousemove", event => {
  const r = Math.floor(event.offsetY / zoom), c = Math.floor(event.offsetX / zoom);
  if (r < 0 || c < 0 || r >= data.rows || c >= data.cols) return;
  const w = data.weights[current][r * data.cols + c];
  cellInfo.textContent = "query " + data.rowLabels[r] + " \u2192 key " + data.colLabels[c] +
      ": " + w.toPrecision(3);
});

const svgNS = "http://www.w3.org/2000/svg";
const view = document.getElementById("head-view");
const rowStep = data.rows > 64 || data.cols > 64 ? 13 : 20;
// Left column wide enough for the longest query label (about 7 px per character).
const labelWidth = Math.max(...data.rowLabels.map(label => label.length)) * 7 + 16;
const columnX = [labelWidth, labelWidth + 270];
function svg(name, attributes) {
  const element = document.createElementNS(svgNS, name);
  for (const key in attributes) element.setAttribute(key, attributes[key]);
  return element;
}
view.setAttribute("width", columnX[1] + 160);
view.setAttribute("height", Math.max(data.rows, data.cols) * rowStep + 20);
const lines = svg("g", {});
view.appendChild(lines);
const queryTexts = data.rowLabels.map((label, r) => {
  const text = svg("text", {x: columnX[0] - 6, y: 14 + r * rowStep, "text-anchor": "end",
                            "dominant-baseline": "central", class: "query"});
  text.textContent = label;
  text.addEventListener("mouseenter", () => drawLines(r));
  text.addEventListener("mouseleave", () => drawLines(-1));
  view.appendChild(text);
  return text;
});
data.colLabels.forEach((label, c) => {
  const text = svg("text", {x: columnX[1] + 6, y: 14 + c * rowStep, "dominant-baseline": "central"});
  text.textContent = label;
  view.appendChild(text);
});

// Lines from query row r to its keys (every row's strongest keys when r < 0), thicker and
// more opaque for larger weights; weights under 1% of the row's largest are left out.
function drawLines(r) {
  lines.replaceChildren();
  queryTexts.forEach((text, i) => text.classList.toggle("active", i === r));
  const w = data.weights[current];
  const rows = r < 0 ? [...Array(data.rows).keys()] : [r];
  for (const i of rows) {
    let rowMax = 0;
    for (let j = 0; j < data.cols; ++j) rowMax = Math.max(rowMax, w[i * data.cols + j]);
    if (rowMax <= 0) continue;
    for (let j = 0; j < data.cols; ++j) {
      const share = w[i * data.cols + j] / rowMax;
      if (share < (r < 0 ? 0.5 : 0.01)) continue;
      lines.appendChild(svg("line", {
        x1: columnX[0], y1: 14 + i * rowStep, x2: columnX[1], y2: 14 + j * rowStep,
        stroke: r < 0 ? "#6b8fb5" : "#e4572e", "stroke-width": 0.5 + 5 * share,
        "stroke-opacity": r < 0 ? 0.25 * share : 0.2 + 0.8 * share}));
    }
  }
}

let current = 0;
function show(h) {
  current = h;
  select.value = String(h);
  thumbs.forEach((thumb, i) => thumb.classList.toggle("selected", i === h));
  paint(heatmap, h);
  document.getElementById("head-title").textContent = "head " + h;
  document.getElementById("scale-max").textContent = headMax(h).toPrecision(3);
  drawLines(-1);
}

const scale = document.getElementById("scale");
scale.width = 160;
scale.height = 1;
const scaleContext = scale.getContext("2d"), scaleImage = scaleContext.createImageData(160, 1);
for (let x = 0; x < 160; ++x) {
  const c = colour(x / 159);
  scaleImage.data.set([c[0], c[1], c[2], 255], 4 * x);
}
scaleContext.putImageData(scaleImage, 0, 0);
// "#head=H&query=Q" in the address opens head H with query Q's lines drawn, for links.
const wanted = new URLSearchParams(location.hash.slice(1));
const wantedHead = Number(wanted.get("head")), wantedQuery = Number(wanted.get("query"));
show(Number.isInteger(wantedHead) && wantedHead >= 0 && wantedHead < data.heads ? wantedHead : 0);
if (wanted.has("query") && Number.isInteger(wantedQuery) && wantedQuery >= 0 &&
    wantedQuery < data.rows) {
  drawLines(wantedQuery);
}
document.body.dataset.ready = "true";
)JS";

// One axis' labels per cell: the token (or its index) when cells are single tokens, else
// the range of indices the block covers and its first token.
std::vector<std::string> cell_labels(const std::vector<std::string>& tokens, Index count,
                                     Index block) {
  std::vector<std::string> labels;
  for (Index first = 0; first < count; first += block) {
    const Index last = std::min(first + block, count) - 1;
    std::string label = tokens.empty() ? std::to_string(first)
                                       : shortened(tokens[static_cast<std::size_t>(first)], 16);
    if (last > first) {
      const std::string range = std::to_string(first) + ".." + std::to_string(last);
      label = tokens.empty() ? range : range + " " + label;
    }
    labels.push_back(label);
  }
  return labels;
}

void write_strings(std::ostream& out, const std::vector<std::string>& strings) {
  out << '[';
  for (std::size_t i = 0; i < strings.size(); ++i) out << (i ? "," : "") << json_string(strings[i]);
  out << ']';
}

}  // namespace

// weights: [B, H, Lq, Lk]
std::string attention_page_html(const TensorView& weights, Index batch,
                                const PageOptions& options) {
  const Index heads = weights.shape[1], len_q = weights.shape[2], len_k = weights.shape[3];
  if (heads < 1)
    throw Error("weights: expected at least one head, given " + format_dims(weights.shape));
  check_label_count(options.row_labels, len_q, "row_labels", "query row");
  check_label_count(options.column_labels, len_k, "column_labels", "key");
  std::vector<Blocks> blocks;
  for (Index h = 0; h < heads; ++h) {
    blocks.push_back(downsample(head_matrix(weights, batch, h), options.max_cells, options.reduce));
  }
  const Blocks& first = blocks.front();

  std::ostringstream data;
  data << "{\"heads\":" << heads << ",\"rows\":" << first.cells.rows
       << ",\"cols\":" << first.cells.cols << ",\"rowLabels\":";
  write_strings(data, cell_labels(options.row_labels, len_q, first.row_block));
  data << ",\"colLabels\":";
  write_strings(data, cell_labels(options.column_labels, len_k, first.col_block));
  data << ",\"anchors\":";
  const auto anchors = colour_anchors();
  write_strings(data, {anchors.begin(), anchors.end()});
  data << ",\"weights\":[";
  char number[32];
  for (std::size_t h = 0; h < blocks.size(); ++h) {
    data << (h ? ",\n[" : "\n[");
    const std::vector<double>& values = blocks[h].cells.values;
    for (std::size_t i = 0; i < values.size(); ++i) {
      std::snprintf(number, sizeof number, "%.4g", values[i]);
      data << (i ? "," : "") << number;
    }
    data << ']';
  }
  data << "]}";

  const std::string title =
      options.title.empty() ? "Attention weights" : xml_escaped(options.title);
  const std::string shape = std::to_string(heads) + (heads == 1 ? " head, " : " heads, ") +
                            std::to_string(len_q) + " queries x " + std::to_string(len_k) + " keys";
  const std::string downsampled = first.row_block > 1 || first.col_block > 1
                                      ? " Shown in blocks of " + std::to_string(first.row_block) +
                                            " x " + std::to_string(first.col_block) + " weights (" +
                                            (options.reduce == Reduce::max ? "largest" : "mean") +
                                            " of each block)."
                                      : "";
  std::ostringstream page;
  page << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
       << "<link rel=\"icon\" href=\"data:,\">\n<title>" << title << "</title>\n<style>" << kStyle
       << "</style>\n</head>\n<body>\n<h1>" << title << "</h1>\n<p class=\"note\">Batch entry "
       << batch << ": " << shape << "; each row of weights sums to 1." << downsampled
       << " Click a head to choose it; point at a query token to see the keys it attends to."
       << "</p>\n<h2>All heads</h2>\n<div id=\"grid\" class=\"grid\"></div>\n"
       << "<div class=\"controls\"><label>Head <select id=\"head\"></select></label></div>\n"
       << "<div class=\"views\">\n<div>\n<h2 id=\"head-title\">head</h2>\n"
       << "<canvas id=\"heatmap\"></canvas>\n<div id=\"cell\"></div>\n"
       << "<div class=\"scale\">0 <canvas id=\"scale\"></canvas> <span id=\"scale-max\"></span>"
       << "</div>\n</div>\n<div>\n<h2>Head view: queries (left) attend to keys (right)</h2>\n"
       << "<svg id=\"head-view\" xmlns=\"http://www.w3.org/2000/svg\"></svg>\n</div>\n</div>\n"
       << "<script type=\"application/json\" id=\"attn-data\">" << data.str() << "</script>\n"
       << "<script>" << kColourScript << "</script>\n<script>" << kScript
       << "</script>\n</body>\n</html>\n";
  return page.str();
}

}  // namespace attn::viz
