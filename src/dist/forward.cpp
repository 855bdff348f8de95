// attn::dist::forward: ring attention. Step t of N, rank r holds the K/V block of rank
// r - t: it computes its queries' states over that block while the block travels on to
// r + 1 and the next one arrives from r - 1 (non-blocking, two receive buffers), then
// merges them into its rows' states with the shared state merge (attn::merge). A block no
// rank further along the ring needs goes no further.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstring>
#include <exception>
#include <string>

#include "attn/dist.hpp"
#include "attn/state.hpp"
#include "core/argument_checks.hpp"
#include "core/problem.hpp"
#include "core/rows.hpp"
#include "dist/collective.hpp"
#include "dist/shards.hpp"

namespace attn::dist {
namespace {

using core::fail;
using Clock = std::chrono::steady_clock;

// Query rows are computed in blocks of at most this many, with a poll of the transfers in
// between: MPI moves a large message only while some MPI call runs.
constexpr Index kQueryBlockRows = 512;
constexpr std::size_t kAlignment = 64;

std::size_t round_up(std::size_t bytes) {
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

// Bytes of a K/V block of `rows` keys: k, padded to 64 bytes, then v.
struct BlockShape {
  Index batch, heads_kv, dim, dim_v;
  DType k_dtype, v_dtype;

  std::size_t k_bytes(Index rows) const {
    return round_up(static_cast<std::size_t>(batch * heads_kv * rows * dim) * dtype_size(k_dtype));
  }
  std::size_t bytes(Index rows) const {
    return k_bytes(rows) +
           static_cast<std::size_t>(batch * heads_kv * rows * dim_v) * dtype_size(v_dtype);
  }
  TensorView k(const std::byte* block, Index rows) const {
    return TensorView(block, k_dtype, {batch, heads_kv, rows, dim});
  }
  TensorView v(const std::byte* block, Index rows) const {
    return TensorView(block + k_bytes(rows), v_dtype, {batch, heads_kv, rows, dim_v});
  }
};

// q: [B, Hq, Lq_r, D]  k: [B, Hkv, Lk_r, D]  v: [B, Hkv, Lk_r, Dv]. The checks one rank can
// make alone: its own shapes and options, and the size of its block as one MPI message.
void check_local(const TensorView& q, const TensorView& k, const TensorView& v,
                 const Options& options, Sharding sharding) {
  if (options.mask) {
    fail("mask", "none (an arbitrary dense mask cannot be split over ranks)", "a mask");
  }
  if (options.block_mask) {
    fail("block_mask", "none (ring attention splits keys by rank, not by mask blocks)",
         "a block mask");
  }
  if (options.position_bias) {
    fail("position_bias", "none (ring attention does not take one)", "a position bias");
  }
  if (!options.cu_seqlens_q.empty() || !options.cu_seqlens_k.empty()) {
    fail("cu_seqlens", "none (packed sequences cannot be split over ranks)", "offsets");
  }
  if (options.dropout_p != 0.0) {
    fail("dropout_p", "0 (ring attention serves inference)", std::to_string(options.dropout_p));
  }
  core::make_problem(q, k, v, options);
  if (sharding == Sharding::zigzag) {
    for (const auto& [name, t] : {std::pair{"q_local", &q}, std::pair{"k_local", &k}}) {
      if (t->shape[2] % 2 != 0) {
        fail(name, "an even row count (two equal zigzag chunks)", "shape " + format_dims(t->shape));
      }
    }
  }
  const BlockShape block{k.shape[0], k.shape[1], k.shape[3], v.shape[3], k.dtype, v.dtype};
  if (block.bytes(k.shape[2]) > static_cast<std::size_t>(INT_MAX)) {
    fail("k_local", "a K/V block below 2^31 bytes (one MPI message)",
         std::to_string(block.bytes(k.shape[2])) + " bytes");
  }
}

// q, k, v: the local shards as for check_local. The values every rank must give alike,
// then (last) the q and k row counts, which zigzag also needs alike.
std::vector<Field> global_fields(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const Options& options, Sharding sharding) {
  using Kind = Field::Kind;
  std::vector<Field> fields{
      {"q batch", q.shape[0]},
      {"q heads", q.shape[1]},
      {"q head dim", q.shape[3]},
      {"k heads", k.shape[1]},
      {"v head dim", v.shape[3]},
      {"q dtype", static_cast<std::int64_t>(q.dtype), Kind::dtype},
      {"k dtype", static_cast<std::int64_t>(k.dtype), Kind::dtype},
      {"v dtype", static_cast<std::int64_t>(v.dtype), Kind::dtype},
      {"sharding", static_cast<std::int64_t>(sharding)},
  };
  for (const Field& f : option_fields(options)) fields.push_back(f);
  // Zigzag chunks are equal on every rank; contiguous runs are each rank's own.
  const bool zigzag = sharding == Sharding::zigzag;
  fields.push_back(zigzag ? Field{"q_local rows (zigzag)", q.shape[2]}
                          : rank_own_field("q_local rows", q.shape[2]));
  fields.push_back(zigzag ? Field{"k_local rows (zigzag)", k.shape[2]}
                          : rank_own_field("k_local rows", k.shape[2]));
  return fields;
}

// The local query rows in blocks of at most kQueryBlockRows, within pieces.
std::vector<Piece> query_blocks(const std::vector<Piece>& local) {
  std::vector<Piece> out;
  for (const Piece& p : local) {
    for (Index i = 0; i < p.count; i += kQueryBlockRows) {
      out.push_back({p.global + i, std::min(kQueryBlockRows, p.count - i), p.local + i});
    }
  }
  return out;
}

// The requests of one step: a receive and a send, either absent.
class Transfers {
 public:
  void receive(std::byte* into, std::size_t bytes, int from, int tag, MPI_Comm comm) {
    check_mpi(MPI_Irecv(into, static_cast<int>(bytes), MPI_BYTE, from, tag, comm, &add()),
              "MPI_Irecv");
  }
  void send(const std::byte* from, std::size_t bytes, int to, int tag, MPI_Comm comm) {
    check_mpi(MPI_Isend(from, static_cast<int>(bytes), MPI_BYTE, to, tag, comm, &add()),
              "MPI_Isend");
  }
  // Lets MPI move data while the computation goes on.
  void poll() {
    int done = 0;
    if (count_ > 0)
      check_mpi(MPI_Testall(count_, requests_, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
  }
  void wait() {
    if (count_ > 0) check_mpi(MPI_Waitall(count_, requests_, MPI_STATUSES_IGNORE), "MPI_Waitall");
    count_ = 0;
  }

 private:
  MPI_Request& add() { return requests_[count_++]; }
  MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  int count_ = 0;
};

// q: [B, Hq, Lq_r, D]  k_view, v_view: [B, Hkv, rows of the held block, D or Dv]
// states[i]: [B, Hq, blocks[i].count, ...]. Each query block's state over the key piece k
// (rows k.local.. of the views) is merged into its state.
void attend(const TensorView& q, const TensorView& k_view, const TensorView& v_view, const Piece& k,
            const std::vector<Piece>& blocks, const Options& options, Index shift,
            std::vector<State>& states, Transfers& transfers) {
  Options local = options;
  local.causal_align = CausalAlign::top_left;
  local.sinks.clear();
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    if (!sees(options, blocks[i], k, shift)) continue;
    local.position_offset = offset_between(blocks[i], k, shift);
    const State part =
        forward_state(q.rows(blocks[i].local, blocks[i].count), k_view.rows(k.local, k.count),
                      v_view.rows(k.local, k.count), local);
    states[i] = merge(states[i], part);
    transfers.poll();
  }
}

// The blocks' states finalized with the sinks (counted once here) into the local rows: context
// [B, Hq, Lq_r, Dv] in q's dtype, lse [B, Hq, Lq_r, 1] in the states' dtype.
Result finalized(const TensorView& q, Index dim_v, const std::vector<State>& states,
                 const std::vector<Piece>& blocks, const std::vector<float>& sinks, DType stats) {
  const Index batch = q.shape[0], heads_q = q.shape[1];
  Result result;
  result.context = Tensor(q.dtype, {batch, heads_q, q.shape[2], dim_v});
  result.lse = Tensor(stats, {batch, heads_q, q.shape[2], 1});
  std::vector<double> row(static_cast<std::size_t>(dim_v));
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const Finalized done = finalize(states[i], sinks);
    for (Index b = 0; b < batch; ++b)
      for (Index h = 0; h < heads_q; ++h)
        for (Index s = 0; s < blocks[i].count; ++s) {
          core::load_row(done.context.view(), b, h, s, row.data());
          core::store_row(result.context.mutable_view(), b, h, blocks[i].local + s, row.data());
          core::load_row(done.lse.view(), b, h, s, row.data());
          core::store_row(result.lse.mutable_view(), b, h, blocks[i].local + s, row.data());
        }
  }
  return result;
}

}  // namespace

Result forward(MPI_Comm comm, const TensorView& q_local, const TensorView& k_local,
               const TensorView& v_local, const Options& options, Sharding sharding,
               std::vector<RingStep>* steps) {
  // q_local: [B, Hq, Lq_r, D]  k_local: [B, Hkv, Lk_r, D]  v_local: [B, Hkv, Lk_r, Dv]
  const Communicator c(comm);
  agree(c, [&] { check_local(q_local, k_local, v_local, options, sharding); });
  const std::vector<Field> fields = global_fields(q_local, k_local, v_local, options, sharding);
  const auto table = agree_fields(c, fields);

  const int ranks = c.size(), rank = c.rank();
  std::vector<Index> rows_q, rows_k;
  for (const auto& values : table) {
    rows_q.push_back(values[fields.size() - 2]);
    rows_k.push_back(values[fields.size() - 1]);
  }
  const auto q_pieces = pieces(sharding, rows_q), k_pieces = pieces(sharding, rows_k);
  Index len_q = 0, len_k = 0;
  for (int r = 0; r < ranks; ++r) len_q += rows_q[r], len_k += rows_k[r];
  const Index shift = (options.causal_align == CausalAlign::bottom_right ? len_k - len_q : 0) +
                      options.position_offset;
  const auto need = needs(options, q_pieces, k_pieces, shift);
  // Block s is on its way at step t (held by rank s + t) while a rank at or past s + t needs it.
  const auto travelling = [&](int s, int t) {
    for (int u = t; u < ranks; ++u)
      if (need[s][(s + u) % ranks]) return true;
    return false;
  };

  const Index batch = q_local.shape[0], heads_q = q_local.shape[1], dim_v = v_local.shape[3];
  const BlockShape shape{batch, k_local.shape[1], k_local.shape[3],
                         dim_v, k_local.dtype,    v_local.dtype};
  std::size_t largest = 0;
  for (int r = 0; r < ranks; ++r) largest = std::max(largest, shape.bytes(rows_k[r]));
  // Everything the ring needs is allocated here, where running out is agreed: past this
  // point only a computation can fail on its own, and that failure is held until the ring
  // is done (every rank still sends and receives its blocks), then agreed.
  const DType stats = q_local.dtype == DType::f64 ? DType::f64 : DType::f32;
  const std::vector<Piece> blocks = query_blocks(q_pieces[rank]);
  std::vector<std::byte> own, buffers[2];
  std::vector<State> states;
  agree(c, [&] {
    if (ranks > 1 && travelling(rank, 1)) {
      own.resize(shape.bytes(k_local.shape[2]));
      pack(k_local, own.data());
      pack(v_local, own.data() + shape.k_bytes(k_local.shape[2]));
    }
    for (int t = 0; t + 1 < ranks; ++t) {
      if (travelling((rank - t - 1 + ranks) % ranks, t + 1)) buffers[(t + 1) % 2].resize(largest);
    }
    for (const Piece& b : blocks)
      states.push_back(State::empty(stats, batch, heads_q, b.count, dim_v));
  });

  if (steps) steps->assign(static_cast<std::size_t>(ranks), RingStep{});
  const std::byte* held = nullptr;  // the block of step t > 0, in a buffer
  std::exception_ptr failure;       // the first computation that failed here
  for (int t = 0; t < ranks; ++t) {
    const int s = (rank - t + ranks) % ranks, next = (rank - t - 1 + ranks) % ranks;
    const auto start = Clock::now();
    Transfers transfers;
    std::byte* incoming = nullptr;
    if (t + 1 < ranks && travelling(next, t + 1)) {
      incoming = buffers[(t + 1) % 2].data();
      transfers.receive(incoming, shape.bytes(rows_k[next]), (rank - 1 + ranks) % ranks, t + 1,
                        c.get());
    }
    const bool holding = t == 0 || travelling(s, t);
    if (t + 1 < ranks && travelling(s, t + 1)) {
      transfers.send(t == 0 ? own.data() : held, shape.bytes(rows_k[s]), (rank + 1) % ranks, t + 1,
                     c.get());
    }
    const bool compute = holding && need[s][rank] && !failure;
    if (compute) {
      const TensorView k = t == 0 ? k_local : shape.k(held, rows_k[s]);
      const TensorView v = t == 0 ? v_local : shape.v(held, rows_k[s]);
      try {
        for (const Piece& piece : k_pieces[s])
          attend(q_local, k, v, piece, blocks, options, shift, states, transfers);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    const auto computed = Clock::now();
    transfers.wait();
    held = incoming;
    if (steps) {
      RingStep& step = (*steps)[static_cast<std::size_t>(t)];
      step.compute_seconds = std::chrono::duration<double>(computed - start).count();
      step.wait_seconds = std::chrono::duration<double>(Clock::now() - computed).count();
      step.block_bytes = incoming ? static_cast<Index>(shape.bytes(rows_k[next])) : 0;
      step.computed = compute;
    }
  }

  Result result;
  agree(c, [&] {
    if (failure) std::rethrow_exception(failure);
    result = finalized(q_local, dim_v, states, blocks, options.sinks, stats);
  });
  return result;
}

}  // namespace attn::dist
