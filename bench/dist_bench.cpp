// attn_dist_bench (run under mpirun): ring attention's steps, and ring attention on N ranks
// of one thread each against single-process attn::forward on N threads, on causal zigzag
// problems (B = 1, fp32). Never run by the tests.
//   steps:   for each length, per ring step, the median time computing on the held block
//            and waiting for the next one (and for the send) after computing, per rank.
//   compare: at --length, repetitions alternate a ring run and a single-process run on
//            rank 0 (the other ranks sleep, not spin), and report each side's median, the
//            ratio single / ring (the ring's efficiency, 1 = as fast), per-rank GFLOP/s
//            and the share of the ring's time spent waiting.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attn/attn.hpp"
#include "attn/dist.hpp"

namespace attn::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Waits for every rank without spinning: a rank that idles must not take a core from a
// rank that computes (Open MPI's blocking calls poll).
void sleeping_barrier() {
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  int done = 0;
  while (!done) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// Standard normal [1, H, len, D] in float32, the same on every rank.
Tensor random_tensor(Index heads, Index len, Index dim, unsigned seed) {
  Tensor t(DType::f32, {1, heads, len, dim});
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (Index i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = normal(rng);
  return t;
}

// Chunks r and 2N - 1 - r of t's rows, one after the other.
Tensor zigzag_shard(const Tensor& t, int rank, int ranks) {
  const Dims& shape = t.shape();
  const Index chunk = shape[2] / (2 * ranks);
  Tensor out(t.dtype(), {shape[0], shape[1], 2 * chunk, shape[3]});
  for (Index h = 0; h < shape[1]; ++h)
    for (int part = 0; part < 2; ++part) {
      const Index first = (part == 0 ? rank : 2 * ranks - 1 - rank) * chunk;
      std::copy_n(t.data_as<float>() + (h * shape[2] + first) * shape[3], chunk * shape[3],
                  out.data_as<float>() + (h * 2 * chunk + part * chunk) * shape[3]);
    }
  return out;
}

struct Problem {
  Tensor q, k, v;  // whole, on every rank
  Tensor q_local, k_local, v_local;
  double flops = 0.0;  // causal: 4 D per visible pair per head, L (L + 1) / 2 pairs
};

Problem make_problem(Index heads, Index len, Index dim, int rank, int ranks) {
  Problem p;
  p.q = random_tensor(heads, len, dim, 1);
  p.k = random_tensor(heads, len, dim, 2);
  p.v = random_tensor(heads, len, dim, 3);
  p.q_local = zigzag_shard(p.q, rank, ranks);
  p.k_local = zigzag_shard(p.k, rank, ranks);
  p.v_local = zigzag_shard(p.v, rank, ranks);
  p.flops = 4.0 * static_cast<double>(dim * heads) * static_cast<double>(len) *
            static_cast<double>(len + 1) / 2.0;
  return p;
}

// One ring run; returns its wall time (after a barrier, so every rank starts together).
double ring_run(const Problem& p, std::vector<dist::RingStep>* steps) {
  Options options;
  options.causal = true;
  options.threads = 1;
  sleeping_barrier();
  const auto start = Clock::now();
  dist::forward(MPI_COMM_WORLD, p.q_local.view(), p.k_local.view(), p.v_local.view(), options,
                dist::Sharding::zigzag, steps);
  sleeping_barrier();
  return seconds_since(start);
}

void print_steps(Index len, Index heads, Index dim, int repetitions, int rank, int ranks) {
  const Problem p = make_problem(heads, len, dim, rank, ranks);
  std::vector<std::vector<double>> compute(static_cast<std::size_t>(ranks)),
      wait(static_cast<std::size_t>(ranks));
  std::vector<dist::RingStep> steps;
  ring_run(p, &steps);  // warm-up
  for (int r = 0; r < repetitions; ++r) {
    ring_run(p, &steps);
    for (int t = 0; t < ranks; ++t) {
      compute[static_cast<std::size_t>(t)].push_back(
          steps[static_cast<std::size_t>(t)].compute_seconds);
      wait[static_cast<std::size_t>(t)].push_back(steps[static_cast<std::size_t>(t)].wait_seconds);
    }
  }
  // Each rank's medians, printed by rank 0 in rank order.
  std::vector<double> mine;
  for (int t = 0; t < ranks; ++t) {
    mine.push_back(median(compute[static_cast<std::size_t>(t)]));
    mine.push_back(median(wait[static_cast<std::size_t>(t)]));
  }
  std::vector<double> all(mine.size() * static_cast<std::size_t>(ranks));
  MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(),
             static_cast<int>(mine.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank != 0) return;
  const double block_mib = 2.0 * static_cast<double>(heads * (len / ranks) * dim) * 4.0 / (1 << 20);
  std::printf("L = %lld (shard %lld rows, K/V block %.2f MiB)\n", static_cast<long long>(len),
              static_cast<long long>(len / ranks), block_mib);
  for (int r = 0; r < ranks; ++r) {
    std::printf("  rank %d:", r);
    for (int t = 0; t < ranks; ++t) {
      const double* at = all.data() + (static_cast<std::size_t>(r) * ranks + t) * 2;
      std::printf("  step %d compute %.2f ms wait %.3f ms", t, 1e3 * at[0], 1e3 * at[1]);
    }
    std::printf("\n");
  }
}

void compare(Index len, Index heads, Index dim, int repetitions, int rank, int ranks) {
  const Problem p = make_problem(heads, len, dim, rank, ranks);
  Options single_options;
  single_options.causal = true;
  single_options.threads = ranks;
  std::vector<double> ring_times, single_times, wait_shares;
  std::vector<dist::RingStep> steps;
  for (int r = -1; r < repetitions; ++r) {  // r = -1: warm-up of both
    const double ring = ring_run(p, &steps);
    double waited = 0.0;
    for (const dist::RingStep& s : steps) waited += s.wait_seconds;
    double all_waited = 0.0;
    MPI_Reduce(&waited, &all_waited, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    double single = 0.0;
    if (rank == 0) {
      const auto start = Clock::now();
      forward(p.q.view(), p.k.view(), p.v.view(), single_options);
      single = seconds_since(start);
    }
    sleeping_barrier();
    if (r < 0) continue;
    ring_times.push_back(ring);
    single_times.push_back(single);
    wait_shares.push_back(all_waited / (ring * ranks));
  }
  if (rank != 0) return;
  std::printf(
      "causal L = %lld, D = %lld, H = %lld, zigzag; %d ranks x 1 thread vs 1 process x %d "
      "threads, %d interleaved repetitions\n",
      static_cast<long long>(len), static_cast<long long>(dim), static_cast<long long>(heads),
      ranks, ranks, repetitions);
  std::printf("  per repetition single/ring:");
  for (std::size_t i = 0; i < ring_times.size(); ++i)
    std::printf(" %.3f", single_times[i] / ring_times[i]);
  const double ring = median(ring_times), single = median(single_times);
  std::printf(
      "\n  ring median %.3f s (%.1f GFLOP/s per rank), single median %.3f s (%.1f GFLOP/s)\n", ring,
      p.flops / ranks / ring * 1e-9, single, p.flops / single * 1e-9);
  std::printf(
      "  ratio of medians single/ring = %.3f; ring time waiting (median over "
      "repetitions, all ranks) = %.1f%%\n",
      single / ring, 100.0 * median(wait_shares));
}

}  // namespace
}  // namespace attn::bench

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  CLI::App app{"Ring attention (attn::dist::forward) per ring step and against one process"};
  std::vector<long long> step_lengths{2048, 4096, 8192, 16384};
  long long length = 16384, heads = 2, dim = 128;
  int repetitions = 5;
  bool skip_steps = false, skip_compare = false;
  app.add_option("--step-lengths", step_lengths, "lengths for the per-step table")->delimiter(',');
  app.add_option("--length", length, "length of the comparison");
  app.add_option("--heads", heads, "heads (q and kv)");
  app.add_option("--dim", dim, "head dim");
  app.add_option("--repetitions", repetitions, "timed repetitions of each");
  app.add_flag("--no-steps", skip_steps, "leave out the per-step table");
  app.add_flag("--no-compare", skip_compare, "leave out the comparison");
  int rank = 0, ranks = 1;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    MPI_Finalize();
    return code;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  try {
    if (!skip_steps) {
      for (const long long len : step_lengths) {
        attn::bench::print_steps(len, heads, dim, repetitions, rank, ranks);
      }
    }
    if (!skip_compare) attn::bench::compare(length, heads, dim, repetitions, rank, ranks);
  } catch (const attn::Error& e) {
    std::fprintf(stderr, "attn_dist_bench: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return 0;
}
