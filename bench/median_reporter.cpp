#include "median_reporter.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace attn::bench {
namespace {

// values: non-empty. The mean of the two middle values for an even count.
double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

}  // namespace

double InterleavedProbes::median(const std::string& name) const {
  const auto found = trials_.find(name);
  return found == trials_.end() ? 0.0 : bench::median(found->second);
}

nlohmann::json to_json(const CaseResult& result) {
  nlohmann::json object = describe(result.bench_case);
  object["gflops"] = result.gflops;
  object["peak_gflops"] = result.peak_gflops;
  object["peak_fraction"] = result.peak_fraction;
  object["ceiling_gflops"] = result.ceiling_gflops;
  object["seconds"] = result.seconds;
  object["repetitions"] = result.repetitions;
  if (result.vs_forward > 0.0) object["vs_forward"] = result.vs_forward;
  return object;
}

MedianReporter::MedianReporter(std::map<std::string, BenchCase> cases,
                               std::map<int, FmaPeak> ceilings, const InterleavedProbes& probes)
    : cases_(std::move(cases)), ceilings_(std::move(ceilings)), probes_(probes) {}

bool MedianReporter::ReportContext(const Context& context) {
  PrintBasicContext(&GetErrorStream(), context);
  std::printf("%-46s %9s %9s %9s %7s\n", "case", "median ms", "GFLOP/s", "peak", "of peak");
  return true;
}

// Benchmark hands over all repetitions of one case together (and, separately, its
// aggregates, which are skipped: the median here is of per-iteration times).
void MedianReporter::ReportRuns(const std::vector<Run>& runs) {
  std::map<std::string, std::vector<double>> seconds_by_case;
  for (const Run& run : runs) {
    if (run.run_type != Run::RT_Iteration) continue;
    const std::string& name = run.run_name.function_name;
    if (run.error_occurred) {
      std::printf("%-46s error: %s\n", name.c_str(), run.error_message.c_str());
      failures_.push_back(name);
      continue;
    }
    seconds_by_case[name].push_back(run.real_accumulated_time /
                                    static_cast<double>(run.iterations));
  }
  for (const auto& [name, seconds] : seconds_by_case) report_case(name, seconds);
}

void MedianReporter::report_case(const std::string& name, const std::vector<double>& seconds) {
  CaseResult result;
  result.bench_case = cases_.at(name);
  result.seconds = median(seconds);
  result.repetitions = static_cast<int>(seconds.size());
  result.gflops = result.bench_case.flops() / result.seconds * 1e-9;
  result.ceiling_gflops = ceilings_.at(result.bench_case.threads).gflops;
  const double interleaved = probes_.median(name);
  result.peak_gflops = interleaved > 0.0 ? interleaved : result.ceiling_gflops;
  result.peak_fraction = result.gflops / result.peak_gflops;
  std::printf("%-46s %9.3f %9.2f %9.2f %6.1f%%\n", name.c_str(), result.seconds * 1e3,
              result.gflops, result.peak_gflops, 100.0 * result.peak_fraction);
  std::fflush(stdout);
  results_.push_back(result);
}

void MedianReporter::report_ratios() {
  bool header = false;
  for (CaseResult& result : results_) {
    const BenchCase& c = result.bench_case;
    if (c.work == Work::forward && c.visible_blocks == 0.0) continue;
    for (const CaseResult& forward : results_) {
      if (forward.bench_case.name() != result.bench_case.forward_name()) continue;
      result.vs_forward = result.seconds / forward.seconds;
      if (!header) std::printf("%-46s %9s\n", "case", "/ forward");
      header = true;
      std::printf("%-46s %8.2fx\n", result.bench_case.name().c_str(), result.vs_forward);
    }
  }
}

}  // namespace attn::bench
