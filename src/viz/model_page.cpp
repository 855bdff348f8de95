#include "viz/model_page.hpp"

#include <cstdint>
#include <cstring>
#include <sstream>

#include "attn/rollout.hpp"
#include "viz/colormap.hpp"
#include "viz/markup.hpp"
#include "viz/matrix.hpp"
#include "viz/tokens.hpp"

namespace attn::viz {
namespace {

constexpr const char* kStyle = R"CSS(
body { font: 14px/1.4 "DejaVu Sans", Helvetica, Arial, sans-serif; color: #222; margin: 0 24px 16px; background: #fff; }
h1 { font-size: 20px; margin: 12px 0 4px; }
h2 { font-size: 16px; margin: 16px 0 8px; }
p.note { color: #555; margin: 0 0 8px; max-width: 1000px; }
header { position: sticky; top: 0; z-index: 1; background: #fff; border-bottom: 1px solid #ccc;
         display: flex; flex-wrap: wrap; align-items: center; gap: 8px 18px; padding: 8px 0; }
header label { white-space: nowrap; }
.scale { display: flex; align-items: center; gap: 6px; font-size: 12px; }
#scale { width: 200px; height: 14px; border: 1px solid #888; }
#scale-note { color: #555; }
#grid { border-collapse: collapse; font-size: 11px; }
#grid th { font-weight: normal; color: #555; padding: 0 4px; }
#grid td { padding: 2px; cursor: pointer; }
#grid tr.current th { color: #e4572e; font-weight: bold; }
#grid td.selected canvas { outline: 3px solid #e4572e; }
#grid canvas { display: block; image-rendering: pixelated; }
#grid.rollout .head-cell { display: none; }
.views { display: flex; flex-wrap: wrap; gap: 32px; align-items: flex-start; }
#large text, #head-view text { font-size: 12px; }
#large rect.cell:hover { stroke: #e4572e; stroke-width: 2; }
#head-view text.query { cursor: pointer; }
#head-view text.active { font-weight: bold; fill: #e4572e; }
#cell { min-height: 1.4em; font-family: "DejaVu Sans Mono", monospace; font-size: 12px; }
)CSS";

// Reads the JSON block and the weights (base64 of little-endian float32, [layers, H, L, L]),
// draws, and marks <body data-ready="true"> at the end so that a headless browser can tell
// it ran through. The body's data-layer, data-head, data-scale and data-special say what is
// shown; "#layer=2&head=mean&scale=head&special=hide&query=3" in the address sets the
// controls through their own handlers, as a reader's clicks would.
constexpr const char* kScript = R"JS(
"use strict";
const data = JSON.parse(document.getElementById("attn-data").textContent);
function floats(id) {
  const element = document.getElementById(id);
  if (!element) return null;
  const text = atob(element.textContent.trim());
  const bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; ++i) bytes[i] = text.charCodeAt(i);
  return new Float32Array(bytes.buffer);
}
// What the page can show: the weights alpha [layers, H, L, L], each input's contribution
// ||alpha v|| (same shape, when given) and the rollout through the layers [layers, L, L].
const sources = {weights: floats("attn-weights"), contributions: floats("attn-contributions"),
                 rollout: floats("attn-rollout")};
const L = data.tokens.length, H = data.heads, MEAN = H;
const colour = colourMap(data.anchors);

const state = {mode: "weights", layer: 0, head: 0, perHead: false, hide: false, query: -1};
let shown = [], views = [], maxima = [], modelMax = 1;

// One matrix of the chosen source as shown: the rows and keys of the shown tokens, each row
// renormalised over the shown keys when special tokens are hidden.
function shownMatrix(array, base) {
  const n = shown.length, v = new Float64Array(n * n);
  for (let r = 0; r < n; ++r) {
    let sum = 0;
    for (let c = 0; c < n; ++c) sum += v[r * n + c] = array[base + shown[r] * L + shown[c]];
    if (state.hide && sum > 0) for (let c = 0; c < n; ++c) v[r * n + c] /= sum;
  }
  return v;
}

// Every layer's matrices as shown, the mean over the heads last; rollout has one matrix a
// layer (already over the heads), shown in the mean's place.
function computeViews() {
  shown = [...Array(L).keys()].filter(i => !(state.hide && data.special[i]));
  const n = shown.length, array = sources[state.mode];
  views = [];
  maxima = [];
  modelMax = 0;
  for (let l = 0; l < data.layers; ++l) {
    let layer;
    if (state.mode === "rollout") {
      const v = shownMatrix(array, l * L * L);
      layer = Array(H + 1).fill(v);
    } else {
      const mean = new Float64Array(n * n);
      layer = [];
      for (let h = 0; h < H; ++h) {
        const v = shownMatrix(array, (l * H + h) * L * L);
        for (let i = 0; i < n * n; ++i) mean[i] += v[i] / H;
        layer.push(v);
      }
      layer.push(mean);
    }
    views.push(layer);
    maxima.push(layer.map(v => v.reduce((m, w) => Math.max(m, w), 0) || 1));
    modelMax = Math.max(modelMax, ...maxima[l]);
  }
}

function scaleMax(l, h) { return state.perHead ? maxima[l][h] : modelMax; }
function headName(h) {
  if (state.mode === "rollout") return "rollout through layers 0.." + state.layer;
  return h === MEAN ? "mean of heads" : "head " + h;
}

function paint(canvas, l, h) {
  const n = shown.length, v = views[l][h], top = scaleMax(l, h);
  canvas.width = n;
  canvas.height = n;
  const context = canvas.getContext("2d"), image = context.createImageData(n, n);
  for (let i = 0; i < n * n; ++i) image.data.set([...colour(v[i] / top), 255], 4 * i);
  context.putImageData(image, 0, 0);
}

const svgNS = "http://www.w3.org/2000/svg";
function svg(name, attributes, text) {
  const element = document.createElementNS(svgNS, name);
  for (const key in attributes) element.setAttribute(key, attributes[key]);
  if (text !== undefined) element.textContent = text;
  return element;
}

// The layer x head grid: one row per layer, the mean over its heads last.
const grid = document.getElementById("grid");
const thumbPx = Math.max(40, Math.min(72, Math.floor(1000 / (H + 2))));
const cells = [], rows = [];
{
  const head = grid.createTHead().insertRow();
  head.appendChild(document.createElement("th"));
  for (let h = 0; h <= H; ++h) {
    const th = head.appendChild(document.createElement("th"));
    th.textContent = h === MEAN ? "mean" : "head " + h;
    if (h !== MEAN) th.className = "head-cell";
  }
  const body = grid.createTBody();
  for (let l = 0; l < data.layers; ++l) {
    const row = body.insertRow();
    row.appendChild(document.createElement("th")).textContent = "layer " + l;
    const line = [];
    for (let h = 0; h <= H; ++h) {
      const cell = row.insertCell();
      if (h !== MEAN) cell.className = "head-cell";
      cell.title = "layer " + l + ", " + (h === MEAN ? "mean of heads" : "head " + h);
      const canvas = cell.appendChild(document.createElement("canvas"));
      canvas.style.width = canvas.style.height = thumbPx + "px";
      cell.addEventListener("click", () => choose(l, h));
      line.push(canvas);
    }
    cells.push(line);
    rows.push(row);
  }
}

const layerSelect = document.getElementById("layer"), headSelect = document.getElementById("head");
const modeSelect = document.getElementById("mode");
const modeNames = {weights: "weights \u03b1", contributions: "contributions \u2016\u03b1 v\u2016",
                   rollout: "rollout through the layers"};
for (const mode of ["weights", "contributions", "rollout"]) {
  if (sources[mode]) modeSelect.add(new Option(modeNames[mode], mode));
}
for (let l = 0; l < data.layers; ++l) layerSelect.add(new Option("layer " + l, String(l)));
for (let h = 0; h <= H; ++h) headSelect.add(new Option(headName(h), h === MEAN ? "mean" : String(h)));
const perHead = document.getElementById("per-head"), hide = document.getElementById("hide-special");
hide.disabled = !data.special.some(Boolean) || data.special.every(Boolean);

const large = document.getElementById("large"), view = document.getElementById("head-view");
const cellInfo = document.getElementById("cell");
const labelWidth = Math.max(...data.tokens.map(t => t.length)) * 7 + 12;

// The chosen head large: queries down, keys across, each cell carrying its exact weight.
function drawLarge() {
  const l = state.layer, h = state.head, n = shown.length, v = views[l][h], top = scaleMax(l, h);
  const size = Math.max(6, Math.min(36, Math.floor(520 / Math.max(n, 1))));
  large.replaceChildren();
  large.setAttribute("width", labelWidth + n * size + 10);
  large.setAttribute("height", labelWidth + n * size + 10);
  const g = large.appendChild(svg("g", {id: "cells"}));
  for (let r = 0; r < n; ++r) {
    large.appendChild(svg("text", {x: labelWidth - 6, y: labelWidth + (r + 0.5) * size,
                                   "text-anchor": "end", "dominant-baseline": "central",
                                   class: "row-label"}, data.tokens[shown[r]]));
    const x = labelWidth + (r + 0.5) * size;
    large.appendChild(svg("text", {transform: `translate(${x},${labelWidth - 6}) rotate(-90)`,
                                   "dominant-baseline": "central", class: "column-label"},
                          data.tokens[shown[r]]));
    for (let c = 0; c < n; ++c) {
      const w = v[r * n + c];
      const rect = svg("rect", {class: "cell", x: labelWidth + c * size, y: labelWidth + r * size,
                                width: size, height: size, fill: "rgb(" + colour(w / top) + ")",
                                "data-row": shown[r], "data-col": shown[c], "data-value": w});
      rect.appendChild(svg("title", {}, data.tokens[shown[r]] + " \u2192 " +
                                        data.tokens[shown[c]] + ": " + w.toPrecision(4)));
      g.appendChild(rect);
    }
  }
}
large.addEventListener("mouseover", event => {
  const title = event.target.querySelector && event.target.querySelector("title");
  if (title) cellInfo.textContent = title.textContent;
});

// The head view: queries on the left, keys on the right, a line for every weight, as
// opaque as the weight is large on the colour scale; pointing at a query keeps its lines.
function drawHeadView() {
  const l = state.layer, h = state.head, n = shown.length, v = views[l][h], top = scaleMax(l, h);
  const step = n > 64 ? 13 : 20, x0 = labelWidth, x1 = labelWidth + 240;
  view.replaceChildren();
  view.setAttribute("width", x1 + labelWidth);
  view.setAttribute("height", n * step + 20);
  const lines = view.appendChild(svg("g", {id: "lines"}));
  const rowsToDraw = state.query >= 0 ? [state.query] : [...Array(n).keys()];
  const colourOf = state.query >= 0 ? "#e4572e" : "#3b6ea5";
  for (const r of rowsToDraw) {
    for (let c = 0; c < n; ++c) {
      const share = v[r * n + c] / top;
      if (share < 0.01) continue;
      lines.appendChild(svg("line", {x1: x0, y1: 14 + r * step, x2: x1, y2: 14 + c * step,
                                     stroke: colourOf, "stroke-width": 1 + 3 * share,
                                     "stroke-opacity": Math.min(1, share)}));
    }
  }
  for (let r = 0; r < n; ++r) {
    const text = view.appendChild(svg("text", {x: x0 - 6, y: 14 + r * step, "text-anchor": "end",
                                               "dominant-baseline": "central",
                                               class: r === state.query ? "query active" : "query"},
                                      data.tokens[shown[r]]));
    text.addEventListener("mouseenter", () => { state.query = r; drawHeadView(); });
    text.addEventListener("mouseleave", () => { state.query = -1; drawHeadView(); });
    view.appendChild(svg("text", {x: x1 + 6, y: 14 + r * step, "dominant-baseline": "central"},
                         data.tokens[shown[r]]));
  }
}

const scaleMaxText = document.getElementById("scale-max");
const scaleNote = document.getElementById("scale-note");
function drawAll() {
  for (let l = 0; l < data.layers; ++l) for (let h = 0; h <= H; ++h) paint(cells[l][h], l, h);
  show();
}

function show() {
  const l = state.layer, h = state.head;
  rows.forEach((row, i) => row.classList.toggle("current", i === l));
  cells.forEach((line, i) => line.forEach((canvas, k) =>
      canvas.parentElement.classList.toggle("selected", i === l && k === h)));
  layerSelect.value = String(l);
  headSelect.value = h === MEAN ? "mean" : String(h);
  document.getElementById("large-title").textContent = "layer " + l + ", " + headName(h);
  scaleMaxText.textContent = scaleMax(l, h).toPrecision(3);
  const what = state.mode === "weights" ? "weight" : state.mode === "rollout" ? "share" : "contribution";
  scaleNote.textContent = state.perHead ? "(this head's largest " + what + "; each thumbnail its own)"
                                        : "(the largest " + what + " in the model, for every head)";
  grid.classList.toggle("rollout", state.mode === "rollout");
  headSelect.disabled = state.mode === "rollout";
  modeSelect.value = state.mode;
  drawLarge();
  drawHeadView();
  Object.assign(document.body.dataset, {mode: state.mode, layer: String(l),
                                        head: h === MEAN ? "mean" : String(h),
                                        scale: state.perHead ? "head" : "shared",
                                        special: state.hide ? "hide" : "show"});
}

function choose(l, h) {
  state.layer = l;
  state.head = h;
  state.query = -1;
  show();
}

layerSelect.addEventListener("change", () => choose(Number(layerSelect.value), state.head));
headSelect.addEventListener("change", () =>
    choose(state.layer, headSelect.value === "mean" ? MEAN : Number(headSelect.value)));
perHead.addEventListener("change", () => { state.perHead = perHead.checked; drawAll(); });
modeSelect.addEventListener("change", () => {
  state.mode = modeSelect.value;
  if (state.mode === "rollout") state.head = MEAN;
  state.query = -1;
  computeViews();
  drawAll();
});
hide.addEventListener("change", () => {
  state.hide = hide.checked;
  state.query = -1;
  computeViews();
  drawAll();
});

const scale = document.getElementById("scale");
scale.width = 200;
scale.height = 1;
const scaleContext = scale.getContext("2d"), scaleImage = scaleContext.createImageData(200, 1);
for (let x = 0; x < 200; ++x) scaleImage.data.set([...colour(x / 199), 255], 4 * x);
scaleContext.putImageData(scaleImage, 0, 0);

computeViews();
drawAll();
const wanted = new URLSearchParams(location.hash.slice(1));
function set(control, value, property = "value") {
  control[property] = value;
  control.dispatchEvent(new Event("change"));
}
if ([...modeSelect.options].some(o => o.value === wanted.get("mode"))) set(modeSelect, wanted.get("mode"));
if (wanted.get("special") === "hide" && !hide.disabled) set(hide, true, "checked");
if (wanted.get("scale") === "head") set(perHead, true, "checked");
if ([...layerSelect.options].some(o => o.value === wanted.get("layer"))) set(layerSelect, wanted.get("layer"));
if ([...headSelect.options].some(o => o.value === wanted.get("head"))) set(headSelect, wanted.get("head"));
const query = Number(wanted.get("query"));
if (wanted.has("query") && Number.isInteger(query) && query >= 0 && query < shown.length) {
  state.query = query;
  drawHeadView();
}
document.body.dataset.ready = "true";
)JS";

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64(const std::vector<unsigned char>& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    const std::size_t left = bytes.size() - i;
    const std::uint32_t chunk = (std::uint32_t{bytes[i]} << 16) |
                                (left > 1 ? std::uint32_t{bytes[i + 1]} << 8 : 0) |
                                (left > 2 ? std::uint32_t{bytes[i + 2]} : 0);
    out += kBase64[(chunk >> 18) & 63];
    out += kBase64[(chunk >> 12) & 63];
    out += left > 1 ? kBase64[(chunk >> 6) & 63] : '=';
    out += left > 2 ? kBase64[chunk & 63] : '=';
  }
  return out;
}

// weights: [layers, H, L, L] -> float32 little-endian bytes in that order. The page reads
// them as a Float32Array, in the byte order of every browser's machines.
std::vector<unsigned char> float32_bytes(const TensorView& weights) {
  const Index layers = weights.shape[0], heads = weights.shape[1], len = weights.shape[2];
  std::vector<unsigned char> bytes;
  bytes.reserve(static_cast<std::size_t>(layers * heads * len * len) * 4);
  for (Index l = 0; l < layers; ++l) {
    for (Index h = 0; h < heads; ++h) {
      for (const double w : head_matrix(weights, l, h).values) {
        const auto f = static_cast<float>(w);
        std::uint32_t bits = 0;
        std::memcpy(&bits, &f, sizeof bits);
        for (int shift = 0; shift < 32; shift += 8) {
          bytes.push_back(static_cast<unsigned char>(bits >> shift));
        }
      }
    }
  }
  return bytes;
}

void check(const TensorView& weights, const ModelPageOptions& options) {
  const Dims& shape = weights.shape;
  if (shape[0] < 1 || shape[1] < 1 || shape[2] < 1 || shape[2] != shape[3]) {
    throw Error(
        "weights: expected [layers, heads, L, L] with at least one layer, head and token "
        "(self-attention over one text), given " +
        format_dims(shape));
  }
  if (options.contributions && options.contributions->shape != shape) {
    throw Error("contributions: expected the weights' shape " + format_dims(shape) + ", given " +
                format_dims(options.contributions->shape));
  }
  if (shape[0] * shape[1] * shape[2] * shape[3] > kMostModelPageWeights) {
    throw Error("weights: expected at most " + std::to_string(kMostModelPageWeights) +
                " weights (layers x heads x L x L) for one page, given " + format_dims(shape) +
                "; draw a shorter text");
  }
  check_label_count(options.tokens, shape[2], "tokens", "position");
  if (!options.special.empty() && static_cast<Index>(options.special.size()) != shape[2]) {
    throw Error("special: expected " + std::to_string(shape[2]) + " flags (one per token), given " +
                std::to_string(options.special.size()));
  }
}

}  // namespace

// weights: [layers, H, L, L]
std::string model_page_html(const TensorView& weights, const ModelPageOptions& options) {
  check(weights, options);
  const Index layers = weights.shape[0], heads = weights.shape[1], len = weights.shape[2];
  std::ostringstream data;
  data << "{\"layers\":" << layers << ",\"heads\":" << heads << ",\"tokens\":[";
  for (Index i = 0; i < len; ++i) {
    const std::string token = options.tokens.empty()
                                  ? std::to_string(i)
                                  : shortened(options.tokens[static_cast<std::size_t>(i)], 16);
    data << (i ? "," : "") << json_string(token);
  }
  data << "],\"special\":[";
  for (Index i = 0; i < len; ++i) {
    const bool special = !options.special.empty() && options.special[static_cast<std::size_t>(i)];
    data << (i ? "," : "") << (special ? "true" : "false");
  }
  data << "],\"anchors\":[";
  const auto anchors = colour_anchors();
  for (std::size_t i = 0; i < anchors.size(); ++i)
    data << (i ? "," : "") << '"' << anchors[i] << '"';
  data << "]}";

  const std::string title =
      xml_escaped(options.title.empty() ? "Attention in every layer" : options.title);
  std::ostringstream page;
  page << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
       << "<link rel=\"icon\" href=\"data:,\">\n<title>" << title << "</title>\n<style>" << kStyle
       << "</style>\n</head>\n<body>\n<h1>" << title << "</h1>\n<header>\n"
       << "<label>Layer <select id=\"layer\"></select></label>\n"
       << "<label>Head <select id=\"head\"></select></label>\n"
       << "<label>Show <select id=\"mode\"></select></label>\n"
       << "<label><input type=\"checkbox\" id=\"per-head\"> colour scale per head</label>\n"
       << "<label><input type=\"checkbox\" id=\"hide-special\"> hide special tokens "
       << "([CLS], [SEP], ...; rows renormalised)</label>\n"
       << "<div class=\"scale\">0 <canvas id=\"scale\"></canvas> <span id=\"scale-max\"></span> "
       << "<span id=\"scale-note\"></span></div>\n</header>\n"
       << "<p class=\"note\">" << layers << (layers == 1 ? " layer, " : " layers, ") << heads
       << (heads == 1 ? " head, " : " heads, ") << len << (len == 1 ? " token" : " tokens")
       << ". Each row of weights (a query) sums to 1 over the keys. Show: the weights alpha"
       << (options.contributions ? "; each input's contribution ||alpha v|| (a large weight on "
                                   "a small value vector adds little)"
                                 : "")
       << "; or the rollout through the layers (each layer's mean over heads mixed with the "
       << "identity for the residual connection, multiplied from layer 0 up: what a position "
       << "draws from the input tokens). Click a thumbnail to draw it large; point at a query "
       << "token in the head view to see the keys it attends to.</p>\n"
       << "<h2>Every layer and head</h2>\n<table id=\"grid\"></table>\n"
       << "<div class=\"views\">\n<div>\n<h2 id=\"large-title\"></h2>\n"
       << "<svg id=\"large\" xmlns=\"http://www.w3.org/2000/svg\"></svg>\n<div id=\"cell\"></div>\n"
       << "</div>\n<div>\n<h2>Head view: queries (left) attend to keys (right)</h2>\n"
       << "<svg id=\"head-view\" xmlns=\"http://www.w3.org/2000/svg\"></svg>\n</div>\n</div>\n"
       << "<script type=\"application/json\" id=\"attn-data\">" << data.str() << "</script>\n"
       << "<script type=\"application/octet-stream\" id=\"attn-weights\">"
       << base64(float32_bytes(weights)) << "</script>\n";
  if (options.contributions) {
    page << "<script type=\"application/octet-stream\" id=\"attn-contributions\">"
         << base64(float32_bytes(*options.contributions)) << "</script>\n";
  }
  const Tensor rolled = rollout(weights);
  page << "<script type=\"application/octet-stream\" id=\"attn-rollout\">"
       << base64(float32_bytes(rolled.view())) << "</script>\n"
       << "<script>" << kColourScript << "</script>\n<script>" << kScript
       << "</script>\n</body>\n</html>\n";
  return page.str();
}

}  // namespace attn::viz
