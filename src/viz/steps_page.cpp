#include "viz/steps_page.hpp"

#include <sstream>

#include "attn/error.hpp"
#include "viz/markup.hpp"

namespace attn::viz {
namespace {

constexpr const char* kStyle = R"CSS(
body { font: 14px/1.4 "DejaVu Sans", Helvetica, Arial, sans-serif; color: #222; margin: 16px 24px; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; }
p.note { color: #555; margin: 0 0 12px; max-width: 900px; }
.controls { display: flex; align-items: center; gap: 10px; margin: 8px 0; }
.controls[hidden] { display: none; }
#step { width: 320px; }
#step-name { font-weight: bold; }
#cell { min-height: 1.4em; font-family: "DejaVu Sans Mono", monospace; font-size: 12px; margin-bottom: 8px; }
.step svg { display: block; margin-bottom: 12px; }
.step [data-value] { cursor: crosshair; }
)CSS";

// Marks <body data-ready="true"> at the end so that a headless browser can tell it ran.
constexpr const char* kScript = R"JS(
"use strict";
const steps = [...document.querySelectorAll(".step")];
const slider = document.getElementById("step");
const stepName = document.getElementById("step-name");
const cell = document.getElementById("cell");
function show(i) {
  i = Math.max(0, Math.min(steps.length - 1, i));
  steps.forEach((step, k) => { step.hidden = k !== i; });
  slider.value = String(i);
  stepName.textContent = (i + 1) + " / " + steps.length + ": " + steps[i].dataset.name;
  document.body.dataset.step = String(i);
  cell.textContent = "";
}
slider.addEventListener("input", () => show(Number(slider.value)));
document.getElementById("previous").addEventListener("click", () => show(Number(slider.value) - 1));
document.getElementById("next").addEventListener("click", () => show(Number(slider.value) + 1));
document.addEventListener("keydown", event => {
  if (event.key === "ArrowLeft") show(Number(slider.value) - 1);
  if (event.key === "ArrowRight") show(Number(slider.value) + 1);
});
// The exact number of the cell under the pointer, from its tooltip.
document.addEventListener("mouseover", event => {
  const target = event.target.closest("[data-value]");
  if (!target) return;
  const title = target.querySelector("title");
  cell.textContent = title ? title.textContent : target.dataset.value;
});
show(0);
// "#step=N" opens step N through the slider's own handler, as a reader's move would.
const wanted = Number(new URLSearchParams(location.hash.slice(1)).get("step"));
if (Number.isInteger(wanted) && wanted > 0) {
  slider.value = String(wanted);
  slider.dispatchEvent(new Event("input"));
}
document.body.dataset.ready = "true";
)JS";

}  // namespace

std::string steps_page_html(const std::string& title, const std::string& note,
                            const std::vector<PageStep>& steps) {
  if (steps.empty()) throw Error("steps: expected at least one step, given none");
  const std::string heading = xml_escaped(title);
  std::ostringstream page;
  page << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
       << "<link rel=\"icon\" href=\"data:,\">\n<title>" << heading << "</title>\n<style>" << kStyle
       << "</style>\n</head>\n<body>\n<h1>" << heading << "</h1>\n<p class=\"note\">"
       << xml_escaped(note) << "</p>\n<div class=\"controls\""
       << (steps.size() == 1 ? " hidden" : "")
       << "><button id=\"previous\" type=\"button\">&larr; previous</button>"
       << "<input id=\"step\" type=\"range\" min=\"0\" max=\"" << steps.size() - 1
       << "\" value=\"0\"><button id=\"next\" type=\"button\">next &rarr;</button>"
       << "<span id=\"step-name\"></span></div>\n<div id=\"cell\"></div>\n";
  for (std::size_t i = 0; i < steps.size(); ++i) {
    page << "<div class=\"step\" data-step-index=\"" << i << "\" data-name=\""
         << xml_escaped(steps[i].name) << "\">\n"
         << steps[i].markup << "</div>\n";
  }
  page << "<script>" << kScript << "</script>\n</body>\n</html>\n";
  return page.str();
}

}  // namespace attn::viz
