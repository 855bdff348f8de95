// attn::dist::decode: one decode step over a context split by position. The query is
// broadcast from the root; each rank decodes its own range as a state, with the count of
// keys held by later ranks as its position offset; the states are gathered to every rank
// and merged in rank order, so every rank gets the same bits whatever the timing.
#include <climits>
#include <cstddef>
#include <cstring>
#include <string>

#include "attn/dist.hpp"
#include "attn/state.hpp"
#include "core/argument_checks.hpp"
#include "core/memory.hpp"
#include "dist/collective.hpp"

namespace attn::dist {
namespace {

using core::fail;

// Sequence s of q: [S, H, n, D] -> [1, H, n, D].
TensorView sequence_of(const TensorView& q, Index s) {
  const auto element = static_cast<Index>(dtype_size(q.dtype));
  return TensorView(static_cast<const std::byte*>(q.data) + s * q.strides[0] * element, q.dtype,
                    {1, q.shape[1], q.shape[2], q.shape[3]}, q.strides);
}

// q: [S, Hq, n_q, D] on the root (ignored elsewhere); returns it, contiguous, on every rank.
// The header (dtype, then the four extents) goes first, so the others can allocate.
Tensor broadcast_query(const Communicator& c, const TensorView& q, int root) {
  std::int64_t header[5] = {static_cast<std::int64_t>(q.dtype), q.shape[0], q.shape[1], q.shape[2],
                            q.shape[3]};
  check_mpi(MPI_Bcast(header, 5, MPI_INT64_T, root, c.get()), "MPI_Bcast");
  const auto dtype = static_cast<DType>(header[0]);
  const Dims dims{header[1], header[2], header[3], header[4]};
  Tensor all;
  agree(c, [&] {
    const std::uint64_t bytes = core::bytes_of(dims, dtype_size(dtype));
    if (bytes > static_cast<std::uint64_t>(INT_MAX)) {
      throw Error("q: expected below 2^31 bytes (one MPI message), given " + std::to_string(bytes) +
                  " bytes");
    }
    all = Tensor(dtype, dims);
    if (c.rank() == root) pack(q, static_cast<std::byte*>(all.data()));
  });
  check_mpi(MPI_Bcast(all.data(), static_cast<int>(all.nbytes()), MPI_BYTE, root, c.get()),
            "MPI_Bcast");
  return all;
}

// q: [S, Hq, n_q, D]  later_keys: [S]; returns m, l [S, Hq, n_q, 1] and acc
// [S, Hq, n_q, Dv]: the local ranges' states, sequence by sequence, each with its own
// offset (the keys that later ranks hold of it); an empty range gives the empty state.
State local_state(const TensorView& q, const KVCache& cache,
                  const std::vector<KVCache::SequenceId>& seq_ids, const Options& options,
                  const std::vector<Index>& later_keys) {
  const Index sequences = q.shape[0], rows = q.shape[1] * q.shape[2], dim_v = cache.config().dim_v;
  State out = State::empty(DType::f32, sequences, q.shape[1], q.shape[2], dim_v);
  Options local = options;
  local.sinks.clear();
  for (Index s = 0; s < sequences; ++s) {
    const KVCache::SequenceId id = seq_ids[static_cast<std::size_t>(s)];
    if (cache.length(id) == 0) continue;
    local.position_offset = options.position_offset + later_keys[static_cast<std::size_t>(s)];
    const State one = decode_state(sequence_of(q, s), cache, {id}, local);
    std::memcpy(out.m.data_as<float>() + s * rows, one.m.data(), one.m.nbytes());
    std::memcpy(out.l.data_as<float>() + s * rows, one.l.data(), one.l.nbytes());
    std::memcpy(out.acc.data_as<float>() + s * rows * dim_v, one.acc.data(), one.acc.nbytes());
  }
  return out;
}

// mine: m, l [S, Hq, n_q, 1], acc [S, Hq, n_q, Dv] (float32); returns every rank's state of
// that shape merged in rank order (a fixed order: the same bits on every rank). Allocating
// and merging are agreed, so that no rank fails alone on either side of the allgather.
State merged_states(const Communicator& c, const State& mine) {
  const Index rows = mine.m.numel(), width = 2 * rows + mine.acc.numel();
  std::vector<float> packed, all;
  agree(c, [&] {
    if (width > INT_MAX)
      throw Error("q: expected a state below 2^31 floats, given " + std::to_string(width));
    packed.resize(static_cast<std::size_t>(width));
    std::memcpy(packed.data(), mine.m.data(), mine.m.nbytes());
    std::memcpy(packed.data() + rows, mine.l.data(), mine.l.nbytes());
    std::memcpy(packed.data() + 2 * rows, mine.acc.data(), mine.acc.nbytes());
    all.resize(packed.size() * static_cast<std::size_t>(c.size()));
  });
  check_mpi(MPI_Allgather(packed.data(), static_cast<int>(width), MPI_FLOAT, all.data(),
                          static_cast<int>(width), MPI_FLOAT, c.get()),
            "MPI_Allgather");
  const Dims& shape = mine.acc.shape();
  State merged;
  agree(c, [&] {
    merged = State::empty(DType::f32, shape[0], shape[1], shape[2], shape[3]);
    for (int r = 0; r < c.size(); ++r) {
      State part = State::empty(DType::f32, shape[0], shape[1], shape[2], shape[3]);
      const float* from = all.data() + static_cast<std::size_t>(r) * packed.size();
      std::memcpy(part.m.data(), from, part.m.nbytes());
      std::memcpy(part.l.data(), from + rows, part.l.nbytes());
      std::memcpy(part.acc.data(), from + 2 * rows, part.acc.nbytes());
      merged = merge(merged, part);
    }
  });
  return merged;
}

}  // namespace

Decoded decode(MPI_Comm comm, const TensorView& q, const KVCache& cache,
               const std::vector<KVCache::SequenceId>& seq_ids, const Options& options, int root) {
  // q: [S, Hq, n_q, D] on root; the cache's sequences seq_ids: [S] ranges of each context
  const Communicator c(comm);
  agree(c, [&] {
    if (root < 0 || root >= c.size()) {
      fail("root", "a rank in [0, " + std::to_string(c.size()) + ")", std::to_string(root));
    }
    if (c.rank() == root) {
      core::check_float_dtype("q", q.dtype);
      core::check_storage("q", q);
    }
    if (options.mask)
      fail("mask", "none (decode reads which keys a sequence has from the cache)", "a mask");
    if (options.block_mask) {
      fail("block_mask", "none (decode reads which keys a sequence has from the cache)",
           "a block mask");
    }
    if (options.position_bias) {
      fail("position_bias", "none (decode does not take one)", "a position bias");
    }
    cache.read(seq_ids, "seq_ids");
  });
  const KVCacheConfig& config = cache.config();
  std::vector<Field> fields{{"root", root},
                            {"seq_ids count", static_cast<std::int64_t>(seq_ids.size())},
                            {"cache heads_kv", config.heads_kv},
                            {"cache dim", config.dim},
                            {"cache dim_v", config.dim_v}};
  for (const Field& f : option_fields(options)) fields.push_back(f);
  agree_fields(c, fields);
  // With the count of sequences agreed, every rank gives as many lengths.
  const std::size_t sequences = seq_ids.size();
  std::vector<Field> lengths;
  for (const KVCache::SequenceId id : seq_ids) {
    lengths.push_back(rank_own_field("length", cache.length(id)));
  }
  const auto table = agree_fields(c, lengths);
  const Tensor all_q = broadcast_query(c, q, root);

  // later_keys[s]: keys of sequence s on ranks after this one. A context shorter than the
  // queries is served as attn::decode serves one: the queries before it see no key.
  std::vector<Index> later_keys(sequences, 0);
  for (std::size_t s = 0; s < sequences; ++s)
    for (int r = c.rank() + 1; r < c.size(); ++r)
      later_keys[s] += table[static_cast<std::size_t>(r)][s];
  State mine;
  agree(c, [&] { mine = local_state(all_q.view(), cache, seq_ids, options, later_keys); });
  const State merged = merged_states(c, mine);
  Decoded decoded;
  agree(c, [&] {
    Finalized done = finalize(merged, options.sinks);
    decoded = {std::move(done.context), std::move(done.lse)};
  });
  return decoded;
}

}  // namespace attn::dist
