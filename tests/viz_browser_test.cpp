// The HTML page in a real browser: headless Chromium (Debian's chromium, installed by
// scripts/install-deps.sh) opens it from disk, with no network, and must run its script to
// the end without a console message, and show a picture (the heatmaps are painted by the
// script, so a blank or grey screenshot means it did not draw). A missing browser fails the
// test: the set-up installs one.
#include <gtest/gtest.h>
#include <png.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "attn/attn.hpp"
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

  const BrowserRun shot =
      run_browser(browser, dir, "page.html", "", "--screenshot='" + dir.file("shot.png") + "'");
  ASSERT_EQ(shot.status, 0) << shot.err;
  EXPECT_EQ(console_lines(shot.err), "");
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  ASSERT_TRUE(png_image_begin_read_from_file(&image, dir.file("shot.png").c_str()))
      << image.message;
  image.format = PNG_FORMAT_RGB;
  std::vector<unsigned char> rgb(PNG_IMAGE_SIZE(image));
  ASSERT_TRUE(png_image_finish_read(&image, nullptr, rgb.data(), 0, nullptr)) << image.message;
  EXPECT_EQ(image.width, 1200u);
  // Ink is anything not white; colour is what only the painted heatmaps have much of.
  std::size_t ink = 0, colour = 0;
  for (std::size_t i = 0; i < rgb.size(); i += 3) {
    const int r = rgb[i], g = rgb[i + 1], b = rgb[i + 2];
    ink += r < 245 || g < 245 || b < 245;
    colour += std::max({r, g, b}) - std::min({r, g, b}) > 60;
  }
  const std::size_t pixels = rgb.size() / 3;
  EXPECT_GT(ink, pixels / 20) << "the screenshot is (nearly) blank";
  EXPECT_GT(colour, 20000u) << "the heatmaps were not painted";
}

}  // namespace
}  // namespace attn::viz
