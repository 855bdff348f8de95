// `attn run --distributed`: one attn run split over the ranks that mpirun started.
#pragma once

#include "run_args.hpp"

namespace attn::tools {

// Call on every rank, with the same arguments. An error that every rank shares is printed
// once, by rank 0, and every rank throws SilentExit; an error found before MPI starts
// throws attn::Error on every rank.
void run_distributed(const RunArgs& args);

}  // namespace attn::tools
