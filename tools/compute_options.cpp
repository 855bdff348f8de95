#include "compute_options.hpp"

#include "command.hpp"

namespace attn::tools {

void add_compute_options(CLI::App& app, ComputeOptions& options, const std::string& scope) {
  app.add_option("--threads", options.threads,
                 scope + "Worker threads, at most 4096; 0: $ATTN_NUM_THREADS, else all cores")
      ->check(integer_in(0, 4096))
      ->type_name("N");
  app.add_option("--backend", options.backend,
                 scope +
                     "Which kernel: auto = the fast kernel where it supports the request, else "
                     "the float64 reference; reference; fast = the fast kernel or an error. "
                     "ATTN_BACKEND=reference overrides")
      ->check(CLI::IsMember({"auto", "reference", "fast"}))
      ->type_name("BACKEND");
}

void apply(const ComputeOptions& compute, Options& options) {
  options.threads = compute.threads;
  options.backend = compute.backend == "reference" ? Backend::reference
                    : compute.backend == "fast"    ? Backend::fast
                                                   : Backend::automatic;
}

}  // namespace attn::tools
