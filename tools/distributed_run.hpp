// `attn run --distributed`: one attn run split over the ranks that mpirun started.
#pragma once

#include "run_args.hpp"

namespace attn::tools {

// Call on every rank, with the same arguments. Throws attn::Error on rank 0 for an error
// that every rank shares and SilentExit on the others, so that it is printed once.
void run_distributed(const RunArgs& args);

}  // namespace attn::tools
