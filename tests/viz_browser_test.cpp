// The HTML pages in a real browser: headless Chromium (Debian's chromium, installed by
// scripts/install-deps.sh) opens them from disk, with no network, and must run their script
// to the end without a console message, and show a picture (the heatmaps are painted by the
// script, so a blank or grey screenshot means it did not draw); on the pages that step,
// "#step=N" moves the step control and the shown weights must be step N's. A missing
// browser fails the test: the set-up installs one.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "generation_trace.hpp"
#include "support/decoded_png.hpp"
#include "support/temp_dir.hpp"
#include "viz/draw.hpp"

namespace attn::viz {
namespace {

using testing::TempDir;

// $ATTN_CHROMIUM, else the first of chromium, chromium-browser, google-chrome on $PATH.
std::string find_browser() {
  if (const char* chosen = std::getenv("ATTN_CHROMIUM"); chosen && *chosen) return chosen;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  std::vector<std::string> folders;
  for (std::string dir; std::getline(dirs, dir, ':');) folders.push_back(dir);
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    for (const std::string& dir : folders) {
      const std::string candidate = dir + "/" + name;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
  }
  return "";
}

struct BrowserRun {
  int status = -1;
  std::string out, err;
};

// Headless Chromium on file://<dir>/<page><fragment> with `mode` (--screenshot=... or
// --dump-dom); its console goes to stderr through --enable-logging.
BrowserRun run_browser(const std::string& browser, const TempDir& dir, const std::string& page,
                       const std::string& fragment, const std::string& mode) {
  const std::string command =
      "timeout 60 '" + browser +
      "' --headless --no-sandbox --disable-gpu --disable-background-networking "
      "--no-first-run --disable-extensions --user-data-dir='" +
      dir.file("profile") + "' --enable-logging=stderr --v=0 --window-size=1200,900 " + mode +
      " 'file://" + dir.file(page) + fragment + "' >'" + dir.file("out.txt") + "' 2>'" +
      dir.file("err.txt") + "'";
  const int raw = std::system(command.c_str());
  return {WIFEXITED(raw) ? WEXITSTATUS(raw) : 128, dir.read("out.txt"), dir.read("err.txt")};
}

// The lines of Chromium's log that come from the page's console (messages and uncaught
// exceptions alike are logged as CONSOLE).
std::string console_lines(const std::string& log) {
  std::stringstream lines(log);
  std::string found;
  for (std::string line; std::getline(lines, line);) {
    if (line.find("CONSOLE") != std::string::npos || line.find("Uncaught") != std::string::npos) {
      found += line + "\n";
    }
  }
  return found;
}

// A screenshot of `page` at 1200 x 900 with no console message, and how much of it is ink
// (anything not white) and colour (what only painted cells have much of).
struct Painted {
  std::size_t pixels = 0, ink = 0, colour = 0;
};

Painted screenshot(const std::string& browser, const TempDir& dir, const std::string& page,
                   const std::string& fragment) {
  const BrowserRun shot =
      run_browser(browser, dir, page, fragment, "--screenshot='" + dir.file("shot.png") + "'");
  EXPECT_EQ(shot.status, 0) << shot.err;
  EXPECT_EQ(console_lines(shot.err), "");
  const testing::DecodedPng image = testing::decode_png(dir.read("shot.png"));
  EXPECT_EQ(image.width, 1200);
  Painted painted;
  for (std::size_t i = 0; i < image.rgb.size(); i += 3) {
    const int r = image.rgb[i], g = image.rgb[i + 1], b = image.rgb[i + 2];
    painted.ink += r < 245 || g < 245 || b < 245;
    painted.colour += std::max({r, g, b}) - std::min({r, g, b}) > 60;
  }
  painted.pixels = image.rgb.size() / 3;
  return painted;
}

// Two heads over twelve tokens: head 0 attends to the previous token, head 1 spreads.
std::vector<double> two_heads(Index n) {
  std::vector<double> w(static_cast<std::size_t>(2 * n * n), 0.0);
  for (Index i = 0; i < n; ++i) {
    w[static_cast<std::size_t>(i * n + (i > 0 ? i - 1 : 0))] = 1.0;
    for (Index j = 0; j <= i; ++j) {
      w[static_cast<std::size_t>(n * n + i * n + j)] = 1.0 / static_cast<double>(i + 1);
    }
  }
  return w;
}

TEST(PageInBrowser, RunsWithoutConsoleErrorsAndDraws) {
  const std::string browser = find_browser();
  ASSERT_FALSE(browser.empty())
      << "no chromium on PATH (scripts/install-deps.sh installs Debian's chromium; "
         "ATTN_CHROMIUM=/path/to/chrome chooses another)";
  const TempDir dir;
  const Index n = 12;
  const std::vector<double> values = two_heads(n);
  Picture picture;
  picture.tokens = {"The", "quick", "brown", "fox",       "jumps", "over",
                    "the", "lazy",  "dog",   "</script>", "&",     "\xC3\xA9t\xC3\xA9"};
  draw(TensorView(values.data(), DType::f64, {1, 2, n, n}), dir.file("page.html"), picture);

  // Head 1 with query 5's lines drawn exercises the hover path as well.
  const BrowserRun dom = run_browser(browser, dir, "page.html", "#head=1&query=5", "--dump-dom");
  ASSERT_EQ(dom.status, 0) << dom.err;
  EXPECT_EQ(console_lines(dom.err), "");
  EXPECT_NE(dom.out.find("data-ready=\"true\""), std::string::npos)
      << "the script did not run to the end";
  EXPECT_NE(dom.out.find("stroke=\"#e4572e\""), std::string::npos) << "no hover lines drawn";

  const Painted shot = screenshot(browser, dir, "page.html", "");
  EXPECT_GT(shot.ink, shot.pixels / 20) << "the screenshot is (nearly) blank";
  EXPECT_GT(shot.colour, 20000u) << "the heatmaps were not painted";
}

// The markup of the step with data-step-index="index" in a dumped DOM, and whether the
// page hid it.
struct ShownStep {
  std::string markup;
  bool hidden = true;
};

ShownStep step_in(const std::string& dom, std::size_t index) {
  const std::string opening = "<div class=\"step\"";
  const std::string marker = "data-step-index=\"" + std::to_string(index) + "\"";
  for (std::size_t at = dom.find(opening); at != std::string::npos;
       at = dom.find(opening, at + 1)) {
    const std::size_t tag_end = dom.find('>', at);
    const std::string tag = dom.substr(at, tag_end - at);
    if (tag.find(marker) == std::string::npos) continue;
    const std::size_t end = dom.find("</div>", tag_end);
    return {dom.substr(tag_end, end - tag_end), tag.find(" hidden") != std::string::npos};
  }
  ADD_FAILURE() << "no step " << index << " in the page";
  return {};
}

// The data-value of every element of `kind` (class="kind") in `markup`, in order.
std::vector<double> drawn_values(const std::string& markup, const std::string& kind) {
  std::vector<double> values;
  const std::string opening = "class=\"" + kind + "\"";
  for (std::size_t at = markup.find(opening); at != std::string::npos;
       at = markup.find(opening, at + 1)) {
    const std::size_t value = markup.find("data-value=\"", at);
    values.push_back(std::stod(markup.substr(value + 12)));
  }
  return values;
}

TEST(GenerationPageInBrowser, TheStepControlShowsEachStepsWeightsAndBlend) {
  const std::string browser = find_browser();
  ASSERT_FALSE(browser.empty()) << "no chromium on PATH (see the test above)";
  const TempDir dir;
  const std::vector<std::string> tokens = {"one", "two", "three", "four", "five", "six"};
  std::vector<double> embeddings;
  for (int i = 0; i < 6 * 4; ++i) embeddings.push_back(1.5 * std::cos(1.3 * i));
  const tools::GenerationTrace trace = tools::trace_generation(tokens, embeddings, 4);
  dir.write("generation.html", tools::generation_page_html(trace));

  for (const std::size_t step : {std::size_t{0}, std::size_t{3}, std::size_t{5}}) {
    SCOPED_TRACE("step " + std::to_string(step));
    const BrowserRun dom = run_browser(browser, dir, "generation.html",
                                       step ? "#step=" + std::to_string(step) : "", "--dump-dom");
    ASSERT_EQ(dom.status, 0) << dom.err;
    EXPECT_EQ(console_lines(dom.err), "");
    EXPECT_NE(dom.out.find("data-ready=\"true\""), std::string::npos)
        << "the script did not run to the end";
    EXPECT_NE(dom.out.find("data-step=\"" + std::to_string(step) + "\""), std::string::npos);
    for (std::size_t other = 0; other < tokens.size(); ++other) {
      EXPECT_EQ(step_in(dom.out, other).hidden, other != step) << "step " << other;
    }
    // The shown step draws that step's weights: on the cache's slots and as the blend's bars.
    const ShownStep shown = step_in(dom.out, step);
    const std::vector<double>& weights = trace.steps[step].weights;
    EXPECT_EQ(drawn_values(shown.markup, "slot"), weights);
    EXPECT_EQ(drawn_values(shown.markup, "weight"), weights);
    EXPECT_EQ(drawn_values(shown.markup, "context").size(), 4u);
  }

  const Painted shot = screenshot(browser, dir, "generation.html", "#step=4");
  EXPECT_GT(shot.ink, shot.pixels / 30) << "the screenshot is (nearly) blank";
  EXPECT_GT(shot.colour, 5000u) << "the cache's slots and the blend's cells were not drawn";
}

TEST(BlendPageInBrowser, RunsWithoutConsoleErrorsAndDraws) {
  const std::string browser = find_browser();
  ASSERT_FALSE(browser.empty()) << "no chromium on PATH (see the test above)";
  const TempDir dir;
  const Index n = 12;
  const std::vector<double> weights = two_heads(n);
  std::vector<double> values;
  for (Index i = 0; i < n * 8; ++i) values.push_back(std::sin(0.7 * static_cast<double>(i)));
  BlendOptions options;
  options.row = 9;
  options.head = 1;
  options.top = 4;
  const Blend blend = make_blend(TensorView(weights.data(), DType::f64, {1, 2, n, n}),
                                 TensorView(values.data(), DType::f64, {1, 1, n, 8}), options);
  dir.write("blend.html", render(blend, Format::html));
  const BrowserRun dom = run_browser(browser, dir, "blend.html", "", "--dump-dom");
  ASSERT_EQ(dom.status, 0) << dom.err;
  EXPECT_EQ(console_lines(dom.err), "");
  EXPECT_NE(dom.out.find("data-ready=\"true\""), std::string::npos);
  EXPECT_EQ(drawn_values(step_in(dom.out, 0).markup, "weight").size(), 5u) << "4 and the rest";
  const Painted shot = screenshot(browser, dir, "blend.html", "");
  EXPECT_GT(shot.colour, 5000u) << "the blend's cells were not drawn";
}

}  // namespace
}  // namespace attn::viz
