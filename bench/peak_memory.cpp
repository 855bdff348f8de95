#include "peak_memory.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "attn/backward.hpp"
#include "support/cases.hpp"

namespace attn::bench {
namespace {

// A "Vm...:   1234 kB" line of /proc/self/status, in bytes.
std::size_t status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    std::istringstream value(line.substr(field.size() + 1));
    std::size_t kib = 0;
    value >> kib;
    return kib * 1024;
  }
  throw Error("peak memory: /proc/self/status has no " + field + " line (expected Linux)");
}

// Writing 5 to clear_refs sets VmHWM back to VmRSS (Linux >= 4.0); some sandboxes refuse it.
bool reset_peak_rss() {
  std::ofstream clear_refs("/proc/self/clear_refs");
  clear_refs << "5";
  clear_refs.close();
  return static_cast<bool>(clear_refs);
}

double mib(std::size_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

}  // namespace

MemoryReport measure_peak_memory(Index length, Index dim, int threads, bool backward) {
  testing::Case shape;
  shape.len_q = shape.len_k = length;
  shape.dim = shape.dim_v = dim;
  shape.causal = true;
  const testing::Inputs inputs = testing::make_inputs(shape);
  Options options;
  options.causal = true;
  options.threads = threads;
  // Every output page is touched before the call, so that it counts as resident like the
  // inputs. backward's inputs are forward's out and lse, made here, and dout = q.
  Tensor output(DType::f32, {1, 1, length, dim});
  Tensor lse;
  std::vector<Tensor> gradients;
  if (backward) {
    lse = Tensor(DType::f32, {1, 1, length, 1});
    forward_into(inputs.q, inputs.k, inputs.v, options,
                 {output.mutable_view(), lse.mutable_view(), {}});
    for (int i = 0; i < 3; ++i) {
      gradients.emplace_back(DType::f32, Dims{1, 1, length, dim});
      std::fill_n(gradients.back().data_as<float>(), gradients.back().numel(), 0.0f);
    }
  } else {
    std::fill_n(output.data_as<float>(), output.numel(), 1.0f);
  }

  MemoryReport report;
  report.backward = backward;
  report.length = length;
  report.dim = dim;
  report.threads = threads > 0 ? threads : omp_get_max_threads();
  report.input_bytes = inputs.q_storage.nbytes() + inputs.k_storage.nbytes() +
                       inputs.v_storage.nbytes() + (backward ? output.nbytes() + lse.nbytes() : 0);
  report.output_bytes = backward ? 0 : output.nbytes();
  for (const Tensor& g : gradients) report.output_bytes += g.nbytes();
  report.peak_was_reset = reset_peak_rss();
  report.rss_before = status_bytes("VmRSS");
  const auto start = std::chrono::steady_clock::now();
  if (backward) {
    backward_into({inputs.q, inputs.k, inputs.v, output.view(), lse.view(), inputs.q}, options,
                  {gradients[0].mutable_view(),
                   gradients[1].mutable_view(),
                   gradients[2].mutable_view(),
                   {},
                   {}});
  } else {
    forward_into(inputs.q, inputs.k, inputs.v, options, {output.mutable_view(), {}, {}});
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report.peak_after = status_bytes("VmHWM");
  return report;
}

void print(const MemoryReport& r) {
  const char* work = r.backward ? "backward" : "forward";
  std::printf("peak memory: B1_H1_L%lld_D%lld causal fp32, %d threads, %s took %.2f s\n",
              static_cast<long long>(r.length), static_cast<long long>(r.dim), r.threads, work,
              r.seconds);
  std::printf("  inputs %.1f MiB + outputs %.1f MiB; VmRSS before the call %.1f MiB\n",
              mib(r.input_bytes), mib(r.output_bytes), mib(r.rss_before));
  std::printf(
      "  peak RSS added by the call, beyond inputs, outputs and the program: %.2f MiB\n  (target < "
      "64 MiB)\n",
      mib(r.extra_bytes()));
  if (r.peak_was_reset) {
    std::printf(
        "  measured: VmHWM after the call - VmRSS before it, with VmHWM reset to VmRSS\n"
        "  just before the call (/proc/self/clear_refs)\n");
  } else {
    std::printf(
        "  measured: VmHWM after the call - VmRSS before it; VmHWM could not be reset,\n"
        "  so a peak reached while setting up inputs counts too: an upper bound\n");
  }
}

nlohmann::json to_json(const MemoryReport& r) {
  return {
      {"name", "peak_memory/B1_H1_Lq" + std::to_string(r.length) + "_Lk" +
                   std::to_string(r.length) + "_D" + std::to_string(r.dim) + "_causalTL" +
                   (r.backward ? "_backward" : "")},
      {"work", r.backward ? "backward" : "forward"},
      {"seconds", r.seconds},
      {"threads", r.threads},
      {"input_bytes", r.input_bytes},
      {"output_bytes", r.output_bytes},
      {"rss_before_bytes", r.rss_before},
      {"peak_rss_bytes", r.peak_after},
      {"extra_peak_bytes", r.extra_bytes()},
      {"peak_was_reset", r.peak_was_reset},
  };
}

}  // namespace attn::bench
