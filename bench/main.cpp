// attn_bench: GFLOP/s of attn::forward (and weights, backward) on the cases, each as a
// fraction of this machine's FMA peak measured in the same run; --memory measures peak RSS instead.
#include <benchmark/benchmark.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "bench_cases.hpp"
#include "fma_peak.hpp"
#include "json_file.hpp"
#include "median_reporter.hpp"
#include "peak_memory.hpp"

namespace attn::bench {
namespace {

// Google Benchmark defaults that the command line may override (the last flag wins):
// three repetitions for a median, each at least 0.2 s of forwards.
const char* const kBenchmarkDefaults[] = {"--benchmark_repetitions=3", "--benchmark_min_time=0.2"};

// Random inputs and an output for one shape, kept while consecutive cases share it (the
// list is ordered so they do: causal and thread count vary fastest).
class InputCache {
 public:
  struct Entry {
    testing::Inputs inputs;
    Tensor output;
    Tensor weights;                     // the weights cases' output, fitted per case
    Tensor lse, dq, dk, dv;             // the backward cases' lse and gradients
    std::vector<std::int64_t> indices;  // of the top-k cases
  };

  Entry& get(const testing::Case& shape) {
    testing::Case key = shape;
    key.causal = false;
    key.dropout = 0.0;
    if (key_ != key.name()) {
      entry_.reset();  // free the previous shape before allocating the next
      auto entry = std::make_unique<Entry>();
      entry->inputs = testing::make_inputs(key);
      entry->output = Tensor(shape.dtype, {shape.batch, shape.heads_q, shape.len_q, shape.dim_v});
      entry_ = std::move(entry);
      key_ = key.name();
    }
    return *entry_;
  }

  // True once per case name: its first call runs an untimed forward (page faults, thread
  // pool start-up, caches).
  bool needs_warm_up(const std::string& name) { return warmed_up_.insert(name).second; }

 private:
  std::string key_;
  std::unique_ptr<Entry> entry_;
  std::set<std::string> warmed_up_;
};

WeightSelection selection_of(const BenchCase& bench_case) {
  WeightSelection selection;
  if (bench_case.work == Work::top8) selection.top_k = 8;
  return selection;
}

// Makes the entry's weights storage fit the case, outside the timing (so that, as for
// forward, the timing leaves out allocating and first touching the L^2 output).
void prepare_weights(const BenchCase& bench_case, InputCache::Entry& entry) {
  const testing::Case& shape = bench_case.shape;
  const auto top_k = selection_of(bench_case).top_k;
  const Dims dims{shape.batch, shape.heads_q, shape.len_q, top_k ? *top_k : shape.len_k};
  if (entry.weights.shape() == dims) return;
  entry.weights = Tensor();  // free the previous storage before allocating the next
  entry.weights = Tensor(DType::f32, dims);
  entry.indices.assign(top_k ? static_cast<std::size_t>(entry.weights.numel()) : 0, 0);
}

void run_weights(const BenchCase& bench_case, InputCache::Entry& entry, const Options& options) {
  const WeightSelection selection = selection_of(bench_case);
  weights_into(entry.inputs.q, entry.inputs.k, options, selection, entry.weights.mutable_view(),
               selection.top_k ? entry.indices.data() : nullptr);
}

// The forward's out and lse for a backward case (causal or not, so per case), and its
// gradients' storage, outside the timing. dout is q: the same shape and distribution.
void prepare_backward(InputCache::Entry& entry, const Options& options) {
  const testing::Inputs& in = entry.inputs;
  entry.lse = Tensor(DType::f32, {in.q.shape[0], in.q.shape[1], in.q.shape[2], 1});
  forward_into(in.q, in.k, in.v, options,
               {entry.output.mutable_view(), entry.lse.mutable_view(), std::nullopt});
  entry.dq = Tensor(DType::f32, in.q.shape);
  entry.dk = Tensor(DType::f32, in.k.shape);
  entry.dv = Tensor(DType::f32, in.v.shape);
}

void run_backward(InputCache::Entry& entry, const Options& options) {
  const testing::Inputs& in = entry.inputs;
  backward_into(
      {in.q, in.k, in.v, entry.output.view(), entry.lse.view(), in.q}, options,
      {entry.dq.mutable_view(), entry.dk.mutable_view(), entry.dv.mutable_view(), {}, {}});
}

void run_case(benchmark::State& state, const BenchCase& bench_case, PvPrecision pv_precision,
              InputCache& cache, InterleavedProbes& probes) {
  InputCache::Entry& entry = cache.get(bench_case.shape);
  const Outputs outputs{entry.output.mutable_view(), std::nullopt, std::nullopt};
  Options options;
  options.causal = bench_case.shape.causal;
  options.threads = bench_case.threads;
  options.pv_precision = pv_precision;
  options.dropout_p = bench_case.shape.dropout;
  options.dropout_seed = 1;
  if (bench_case.visible_blocks > 0.0) {
    options.block_mask = random_blocks(bench_case.shape.len_q, bench_case.visible_blocks);
  }
  const testing::Inputs& in = entry.inputs;
  if (bench_case.work == Work::weights || bench_case.work == Work::top8) {
    prepare_weights(bench_case, entry);
  }
  if (bench_case.work == Work::backward) prepare_backward(entry, options);
  auto once = [&] {
    if (bench_case.work == Work::forward) {
      forward_into(in.q, in.k, in.v, options, outputs);
    } else if (bench_case.work == Work::backward) {
      run_backward(entry, options);
    } else {
      run_weights(bench_case, entry, options);
    }
  };
  if (cache.needs_warm_up(bench_case.name())) once();
  probes.record(bench_case.name(), fma_probe_gflops(bench_case.threads));
  for (auto _ : state) once();
}

struct CommandLine {
  std::string json_path;
  bool quick = false;
  bool list = false;
  bool memory = false;
  bool memory_backward = false;
  std::optional<Index> memory_length;
  std::string pv_precision = "bf16";
  std::vector<std::string> benchmark_flags;
};

int run_memory_case(const CommandLine& command_line) {
  std::optional<JsonFile> json;
  if (!command_line.json_path.empty()) json.emplace(command_line.json_path);
  // The issues' cases: forward at L = 65536, backward at L = 32768 (both D = 64, causal).
  const bool backward = command_line.memory_backward;
  const Index length = command_line.memory_length.value_or(backward ? 32768 : 65536);
  const MemoryReport report = measure_peak_memory(length, 64, 0, backward);
  print(report);
  if (json) json->commit(nlohmann::json::array({to_json(report)}));
  return 0;
}

int run_speed_cases(const CommandLine& command_line) {
  std::vector<std::string> arguments = {"attn_bench"};
  arguments.insert(arguments.end(), std::begin(kBenchmarkDefaults), std::end(kBenchmarkDefaults));
  arguments.insert(arguments.end(), command_line.benchmark_flags.begin(),
                   command_line.benchmark_flags.end());
  std::vector<char*> argv;
  for (std::string& argument : arguments) argv.push_back(argument.data());
  int argc = static_cast<int>(argv.size());
  benchmark::Initialize(&argc, argv.data());
  if (benchmark::ReportUnrecognizedArguments(argc, argv.data())) return 2;

  std::optional<JsonFile> json;
  if (!command_line.json_path.empty()) json.emplace(command_line.json_path);

  std::map<int, FmaPeak> ceilings;
  for (const int threads : {1, 2}) {
    ceilings[threads] = measure_fma_peak(threads);
    std::printf("FMA ceiling, fp32 %s, %d thread%s: %.1f GFLOP/s (best of 7 probes)\n",
                ceilings[threads].target.c_str(), threads, threads == 1 ? "" : "s",
                ceilings[threads].gflops);
  }
  std::printf("Each case's peak: the median of the FMA probes run between its repetitions\n");
  // "of peak" stays the fp32 FMA's: but for forward's bf16 scores on AVX512-BF16 or AMX, the
  // kernels widen bf16 and fp16 to fp32.
  for (const int threads : {1, 2}) {
    const std::optional<FmaPeak> bf16 = measure_bf16_dot_peak(threads);
    if (!bf16) {
      std::printf("bf16 dot peak: this CPU has no AVX512-BF16\n");
      break;
    }
    std::printf("bf16 dot peak, %s, %d thread%s: %.1f GFLOP/s (best of 7 probes)\n",
                bf16->target.c_str(), threads, threads == 1 ? "" : "s", bf16->gflops);
  }
  for (const int threads : {1, 2}) {
    const std::optional<FmaPeak> amx = measure_amx_peak(threads);
    if (!amx) {
      std::printf("AMX peak: this CPU has no AMX (or Linux refused its tile data)\n");
      break;
    }
    std::printf("AMX peak, %s, %d thread%s: %.1f GFLOP/s (best of 7 probes)\n", amx->target.c_str(),
                threads, threads == 1 ? "" : "s", amx->gflops);
  }

  const PvPrecision pv_precision =
      command_line.pv_precision == "bf16" ? PvPrecision::bf16 : PvPrecision::exact;
  std::printf("pv_precision: %s\n", command_line.pv_precision.c_str());
  InputCache cache;
  InterleavedProbes probes;
  std::map<std::string, BenchCase> cases;
  for (const BenchCase& bench_case : bench_cases(command_line.quick)) {
    cases[bench_case.name()] = bench_case;
    benchmark::RegisterBenchmark(
        bench_case.name().c_str(),
        [bench_case, pv_precision, &cache, &probes](benchmark::State& state) {
          run_case(state, bench_case, pv_precision, cache, probes);
        })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  MedianReporter reporter(std::move(cases), std::move(ceilings), probes);
  if (benchmark::RunSpecifiedBenchmarks(&reporter) == 0) {
    std::fprintf(stderr, "attn_bench: no case matches --benchmark_filter (see --list)\n");
    return 2;
  }
  benchmark::Shutdown();
  reporter.report_ratios();
  if (json) {
    nlohmann::json document = nlohmann::json::array();
    for (const CaseResult& result : reporter.results()) document.push_back(to_json(result));
    json->commit(document);
  }
  return reporter.failures().empty() ? 0 : 1;
}

}  // namespace
}  // namespace attn::bench

int main(int argc, char** argv) {
  using attn::bench::CommandLine;
  CommandLine command_line;
  CLI::App app{"attn_bench: GFLOP/s of attn::forward and its fraction of this machine's FMA peak"};
  app.add_option("--json", command_line.json_path,
                 "Write one JSON object per case (name, gflops, peak_gflops, peak_fraction, "
                 "seconds, shape) to this file");
  app.add_flag("--quick", command_line.quick, "Leave out the L = 8192 cases");
  app.add_flag("--list", command_line.list, "Print the cases as JSON and exit");
  CLI::Option* memory =
      app.add_flag("--memory", command_line.memory,
                   "Measure peak RSS of one causal L = 65536, D = 64 forward instead");
  CLI::Option* memory_backward =
      app.add_flag("--memory-backward", command_line.memory_backward,
                   "Measure peak RSS of one causal L = 32768, D = 64 backward instead");
  memory->excludes(memory_backward);
  app.add_option("--memory-length", command_line.memory_length,
                 "L for --memory or --memory-backward")
      ->check(CLI::PositiveNumber);
  app.add_option("--pv-precision", command_line.pv_precision,
                 "bf16 (default, as Options) or exact: Options::pv_precision for every case "
                 "(bf16 rounds P for P V of bf16 V on AMX tiles or AVX512-BF16)")
      ->check(CLI::IsMember({"exact", "bf16"}));
  app.allow_extras();
  app.footer(
      "Google Benchmark flags pass through, e.g. --benchmark_filter=REGEX, "
      "--benchmark_repetitions=N (default 3), --benchmark_min_time=SECONDS (default 0.2).");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "attn_bench: %s\n", e.what());
    return 2;
  }
  for (const std::string& extra : app.remaining()) {
    if (extra.rfind("--benchmark_", 0) != 0) {
      std::fprintf(stderr,
                   "attn_bench: unknown argument %s (expected an attn_bench option or a "
                   "--benchmark_* flag)\n",
                   extra.c_str());
      return 2;
    }
    command_line.benchmark_flags.push_back(extra);
  }
  try {
    if (command_line.list) {
      nlohmann::json cases = nlohmann::json::array();
      for (const auto& c : attn::bench::bench_cases(command_line.quick))
        cases.push_back(describe(c));
      std::printf("%s\n", cases.dump(2).c_str());
      return 0;
    }
    if (command_line.memory_length && !command_line.memory && !command_line.memory_backward) {
      std::fprintf(stderr, "attn_bench: --memory-length needs --memory or --memory-backward\n");
      return 2;
    }
    return command_line.memory || command_line.memory_backward
               ? attn::bench::run_memory_case(command_line)
               : attn::bench::run_speed_cases(command_line);
  } catch (const attn::Error& e) {
    std::fprintf(stderr, "attn_bench: %s\n", e.what());
    return 2;
  }
}
