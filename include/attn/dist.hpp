// attn::dist: attention over a sequence split across MPI processes (context parallelism).
// Each rank holds a shard of the query rows and of the keys and values. forward passes K/V
// blocks around a ring of ranks, each rank merging the attention states of its own queries
// over every block it sees (Ring Attention); decode combines the states of a KV cache split
// by position. Both rest on the state merge (attn/state.hpp) and on
// Options::position_offset, which places a shard in the whole sequence, so every result
// equals single-process attention up to float32 rounding, whatever the timing.
//
// Every function here is collective over `comm`: all ranks call it, with the same options.
// Argument checks agree before any data moves: when one rank's arguments are bad, every
// rank throws the same AgreedError, "rank R: <argument>: expected ..., given ...", R being
// the first rank that failed, after which the communicator can go on being used. So do
// failures of memory and of the computation itself: forward allocates before the ring, and
// a rank whose computation fails goes on passing blocks until the ring is done, then the
// failure is agreed. Only MPI failing (a peer lost) throws a plain attn::Error on the ranks
// that see it; the others may be waiting for them, so a program that catches one should
// end every rank (MPI_Abort).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "attn/attention.hpp"
#include "attn/decode.hpp"
#include "attn/error.hpp"
#include "attn/kv_cache.hpp"
#include "attn/options.hpp"
#include "attn/tensor.hpp"

namespace attn::dist {

// The error every rank of the communicator throws alike (see above).
class AgreedError : public Error {
 public:
  using Error::Error;
};

// How the global sequence is split. contiguous: rank r holds the r-th run of rows, of any
// length (the runs in rank order make the sequence). zigzag: the sequence is cut into 2N
// equal chunks and rank r of N holds chunks r and 2N - 1 - r, in that order (each rank's
// rows and keys are an even count, equal on every rank); under causal masking every rank
// then has the same work.
enum class Sharding : std::uint8_t { contiguous, zigzag };

// What one ring step of forward spent: computing on the block it held, then waiting for the
// next one (and for its own send) once the computation was done.
struct RingStep {
  double compute_seconds = 0.0;
  double wait_seconds = 0.0;
  Index block_bytes = 0;  // bytes received for the next step (0: nothing came)
  bool computed = false;  // false when the block's keys were hidden from every local row
};

// q_local: [B, Hq, Lq_r, D]  k_local: [B, Hkv, Lk_r, D]  v_local: [B, Hkv, Lk_r, Dv]: this
// rank's rows of the global q, k and v under `sharding`. B, the heads, dims and dtypes and
// all options agree across ranks. Options apply to the global sequence: causal (either
// alignment, over the global lengths), window, softcap, ALiBi (global distances), sinks
// (counted once per row), GQA, scale, position_offset, threads (per rank). A mask and
// packed sequences (cu_seqlens) cannot be split this way and are refused.
// Returns context [B, Hq, Lq_r, Dv] in q's dtype and lse [B, Hq, Lq_r, 1] (float32, or
// float64 for float64 inputs) for the local rows. steps, when given, gets one entry per
// ring step (N in all).
Result forward(MPI_Comm comm, const TensorView& q_local, const TensorView& k_local,
               const TensorView& v_local, const Options& options = {},
               Sharding sharding = Sharding::contiguous, std::vector<RingStep>* steps = nullptr);

// A decode step over a context split by position: rank r's cache holds, for each sequence
// seq_ids[i] (ids of its own cache), the r-th range of that sequence's tokens (the ranges
// in rank order make the context; any may be empty; the newest tokens, whose keys the
// queries are, come last). q: [S, Hq, n_q, D] as for attn::decode, read on `root` only
// (other ranks may pass an empty view); it is broadcast. Each rank decodes its range as a
// state, the states are gathered to every rank and merged in rank order, then finalized
// with the sinks: every rank returns the same bits, equal to attn::decode over one cache
// holding the whole context up to float32 rounding.
Decoded decode(MPI_Comm comm, const TensorView& q, const KVCache& cache,
               const std::vector<KVCache::SequenceId>& seq_ids, const Options& options = {},
               int root = 0);

}  // namespace attn::dist
