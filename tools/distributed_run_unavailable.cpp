// The attn command built without MPI (the one in the Python wheel, which must start on
// machines that have none): --distributed says where to find it instead.
#include "distributed_run.hpp"

#include "attn/error.hpp"

namespace attn::tools {

void run_distributed(const RunArgs&) {
  throw Error(
      "--distributed: this attn command was built without MPI; build attn from source "
      "with Open MPI installed (make build), or use attn.dist in Python");
}

}  // namespace attn::tools
