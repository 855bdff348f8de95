// Turns Google Benchmark's repetitions of each case into one row: the median time of one
// forward, its GFLOP/s and its fraction of the measured FMA peak at the case's thread count.
#pragma once

#include <benchmark/benchmark.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_cases.hpp"
#include "fma_peak.hpp"

namespace attn::bench {

struct CaseResult {
  BenchCase bench_case;
  double seconds = 0.0;  // median over repetitions of (time of a repetition / its iterations)
  int repetitions = 0;
  double gflops = 0.0;
  double peak_gflops = 0.0;
  double peak_fraction = 0.0;
  // Weights cases: seconds / seconds of the forward case of the same shape and threads in
  // this run (0 when that case did not run).
  double vs_forward = 0.0;
};

// The --json object of one case: name, gflops, peak_gflops, peak_fraction, seconds, and the
// case's shape so that other tools (bench/peers.py) need not parse the name.
nlohmann::json to_json(const CaseResult& result);

class MedianReporter : public benchmark::BenchmarkReporter {
 public:
  // cases: by registered benchmark name. peaks: by thread count.
  MedianReporter(std::map<std::string, BenchCase> cases, std::map<int, FmaPeak> peaks);

  bool ReportContext(const Context& context) override;
  void ReportRuns(const std::vector<Run>& runs) override;

  // Each weights or backward case's median time over its forward case's, once every case has run
  // (fills vs_forward and prints a table).
  void report_ratios();

  const std::vector<CaseResult>& results() const { return results_; }
  // Names of cases whose runs reported an error.
  const std::vector<std::string>& failures() const { return failures_; }

 private:
  void report_case(const std::string& name, const std::vector<double>& seconds);

  std::map<std::string, BenchCase> cases_;
  std::map<int, FmaPeak> peaks_;
  std::vector<CaseResult> results_;
  std::vector<std::string> failures_;
};

}  // namespace attn::bench
