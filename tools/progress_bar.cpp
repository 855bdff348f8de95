#include "progress_bar.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>
#include <thread>

namespace attn::tools {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kDelay = std::chrono::seconds(1);
constexpr auto kRedraw = std::chrono::milliseconds(100);
constexpr int kBarWidth = 30;

void draw(const std::string& label, Index done, Index total, double seconds) {
  const double fraction = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 0.0;
  const int filled = static_cast<int>(fraction * kBarWidth);
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.append(static_cast<std::size_t>(kBarWidth - filled), '.');
  // "\r" returns to the start of the line and "\033[K" erases what a longer line left.
  std::fprintf(stderr, "\r%s [%s] %3d%%  %lld/%lld  %.1f s\033[K", label.c_str(), bar.c_str(),
               static_cast<int>(fraction * 100.0), static_cast<long long>(done),
               static_cast<long long>(total), seconds);
  std::fflush(stderr);
}

}  // namespace

bool stderr_is_terminal() {
  return ::isatty(STDERR_FILENO) == 1;
}

void run_with_progress_bar(const std::string& label,
                           const std::function<void(const ProgressCallback&)>& work) {
  std::atomic<Index> done{0}, total{0};
  std::mutex mutex;
  std::condition_variable finished_signal;
  bool finished = false;
  std::exception_ptr failure;
  const auto start = Clock::now();

  std::thread worker([&] {
    try {
      work([&](Index pieces_done, Index pieces) {
        done = pieces_done;
        total = pieces;
      });
    } catch (...) {
      failure = std::current_exception();
    }
    const std::lock_guard<std::mutex> lock(mutex);
    finished = true;
    finished_signal.notify_one();
  });

  bool drawn = false;
  {
    std::unique_lock<std::mutex> lock(mutex);
    while (!finished_signal.wait_for(lock, kRedraw, [&] { return finished; })) {
      const auto elapsed = Clock::now() - start;
      if (elapsed < kDelay) continue;
      draw(label, done, total, std::chrono::duration<double>(elapsed).count());
      drawn = true;
    }
  }
  worker.join();
  if (drawn) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace attn::tools
