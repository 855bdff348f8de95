// Each rank reads only its rows of the query, key and value files (split by --sharding),
// computes them by ring attention (attn::dist::forward), and writes its rows of the context
// and lse into one file each (src/dist/row_files.hpp), which appears under its name only
// when every rank has written. An error that every rank shares (an AgreedError) is printed
// once, by rank 0; a failure on some ranks only (during the ring) is printed by each of
// them and ends every rank (MPI_Abort), so that none waits forever.
#include "distributed_run.hpp"

#include <mpi.h>

#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "attn/dist.hpp"
#include "command.hpp"
#include "dist/collective.hpp"
#include "dist/row_files.hpp"
#include "dist/shards.hpp"
#include "io/npy.hpp"
#include "layout.hpp"

namespace attn::tools {
namespace {

// MPI for the life of the command, unless the program had started it already.
class MpiSession {
 public:
  MpiSession() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    int provided = 0;
    // Only the main thread calls MPI; OpenMP's threads only compute.
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      throw Error("--distributed: MPI did not start (MPI_Init_thread failed)");
    }
    owned_ = true;
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  ~MpiSession() {
    if (owned_) MPI_Finalize();
  }

 private:
  bool owned_ = false;
};

dist::Sharding sharding_of(const RunArgs& args) {
  return args.sharding == "zigzag" ? dist::Sharding::zigzag : dist::Sharding::contiguous;
}

// This rank's rows of an input file, and where they sit in the whole sequence.
struct LocalRows {
  io::NpyArray array;
  TensorView view;
  std::vector<dist::Piece> pieces;
  Index length = 0;  // of the whole sequence
};

LocalRows read_local_rows(const char* option, const std::string& path, Layout layout,
                          dist::Sharding sharding, const dist::Communicator& comm) {
  const io::Shape shape = io::read_npy_shape(path);
  if (shape.size() < 2) {
    throw Error(std::string(option) +
                ": expected 2 to 4 dims, one of them the sequence to split "
                "over ranks, given shape " +
                io::format_shape(shape) + " in " + path);
  }
  const std::size_t axis = sequence_axis(layout, shape.size());
  const Index length = shape[axis];
  const Index chunks = 2 * static_cast<Index>(comm.size());
  if (sharding == dist::Sharding::zigzag && length % chunks != 0) {
    throw Error(std::string(option) + ": expected a sequence length divisible by " +
                std::to_string(chunks) + " (2 x " + std::to_string(comm.size()) +
                " ranks) for --sharding zigzag, given " + std::to_string(length) + " in " + path);
  }
  LocalRows local;
  local.length = length;
  local.pieces = dist::pieces(
      sharding,
      dist::split_rows(sharding, length, comm.size()))[static_cast<std::size_t>(comm.rank())];
  std::vector<io::RowRange> ranges;
  for (const dist::Piece& piece : local.pieces) ranges.push_back({piece.global, piece.count});
  local.array = io::read_npy_rows(path, axis, ranges);
  const Placement placement = place(layout, local.array.shape);
  local.view = TensorView(local.array.tensor.data(), local.array.tensor.dtype(), placement.shape,
                          placement.strides);
  return local;
}

// t: [B, H, L, D] in contiguous rows, copied into a C-order array of `shape` in `layout`.
Tensor in_file_order(const Tensor& t, Layout layout, const io::Shape& shape) {
  Tensor out(t.dtype(), io::right_aligned(shape));
  const Placement placement = place(layout, shape);
  const std::size_t element = dtype_size(t.dtype());
  const std::size_t row = static_cast<std::size_t>(t.shape()[3]) * element;
  const auto* from = static_cast<const char*>(t.data());
  auto* to = static_cast<char*>(out.data());
  for (Index b = 0; b < t.shape()[0]; ++b)
    for (Index h = 0; h < t.shape()[1]; ++h)
      for (Index s = 0; s < t.shape()[2]; ++s, from += row) {
        const Index at =
            b * placement.strides[0] + h * placement.strides[1] + s * placement.strides[2];
        std::memcpy(to + static_cast<std::size_t>(at) * element, from, row);
      }
  return out;
}

// Options that need every row of a query on one rank.
void refuse_whole_row_options(const RunArgs& args) {
  if (!args.mask.empty()) {
    throw Error(
        "--mask: expected no mask with --distributed (a dense mask cannot be split "
        "over ranks); --causal, --window, --alibi and --sinks can");
  }
  if (!args.weights.empty()) {
    throw Error(
        "--weights: expected no --weights with --distributed (ranks keep only their "
        "context rows); run without --distributed for the weights");
  }
  if (!args.contributions.empty()) {
    throw Error(
        "--contributions: expected no --contributions with --distributed (ranks keep only "
        "their context rows); run without --distributed for them");
  }
  if (!args.viz.empty()) {
    throw Error(
        "--viz: expected no --viz with --distributed (ranks keep only their context "
        "rows); run without --distributed for a picture");
  }
}

void run_on_ranks(const RunArgs& args, const dist::Communicator& comm) {
  const Layout layout = parse_layout(args.layout);
  const dist::Sharding sharding = sharding_of(args);
  LocalRows q, k, v;
  Options options;
  dist::agree(comm, [&] {
    refuse_whole_row_options(args);
    check_outputs(args);
    q = read_local_rows("--query", args.query, layout, sharding, comm);
    k = read_local_rows("--key", args.key, layout, sharding, comm);
    v = read_local_rows("--value", args.value, layout, sharding, comm);
    options = options_without_mask(args);
  });
  const Result result = dist::forward(comm.get(), q.view, k.view, v.view, options, sharding);

  // The whole context: q's file shape with the value's dim; this rank's rows of it.
  const std::size_t rank = q.array.shape.size();
  const Dims& dims = result.context.shape();
  const std::size_t q_axis = sequence_axis(layout, rank);
  io::Shape context_shape = file_shape(layout, dims, rank);
  const Tensor context = in_file_order(result.context, layout, context_shape);
  context_shape[q_axis] = q.length;
  std::vector<dist::RowsOfFile> files = {
      {args.out, context.dtype(), context_shape, q_axis, q.pieces, context.data()}};
  if (!args.lse.empty()) {
    // [B, H, Lq] in every layout, as `attn run` writes it (the sequence its last dim).
    io::Shape lse_shape =
        file_shape(Layout::bhsd, {1, dims[0], dims[1], dims[2]}, rank > 0 ? rank - 1 : 0);
    lse_shape.back() = q.length;
    files.push_back({args.lse, result.lse.dtype(), lse_shape, lse_shape.size() - 1, q.pieces,
                     result.lse.data()});
  }
  dist::write_rows(comm, files);
}

}  // namespace

void run_distributed(const RunArgs& args) {
  const MpiSession session;
  const dist::Communicator comm(MPI_COMM_WORLD);
  try {
    run_on_ranks(args, comm);
  } catch (const dist::AgreedError& e) {
    // Rank 0 prints before any rank exits: mpirun ends the job as soon as one process exits
    // with an error, and what rank 0 had not yet written would be lost.
    if (comm.rank() == 0) print_error("error", e.what());
    MPI_Barrier(comm.get());
    throw SilentExit{kBadInputStatus};
  } catch (const std::exception& e) {
    print_error("error", "rank " + std::to_string(comm.rank()) + ": " + e.what());
    MPI_Abort(MPI_COMM_WORLD, kBadInputStatus);
  }
}

}  // namespace attn::tools
