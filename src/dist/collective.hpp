// Collective agreement for src/dist: the checks that every rank must pass before data moves,
// and the communicator each call works on.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attn/dist.hpp"
#include "attn/options.hpp"
#include "attn/tensor.hpp"

namespace attn::dist {

// A private copy of the caller's communicator (so our messages never match theirs) that
// returns MPI errors instead of aborting; freed at the end of the call.
class Communicator {
 public:
  explicit Communicator(MPI_Comm comm);
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator();

  MPI_Comm get() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

// Throws attn::Error("MPI: <call>: <MPI's text>") unless code is MPI_SUCCESS.
void check_mpi(int code, const char* call);

// Runs work() on every rank. When it throws on any rank, every rank throws one AgreedError
// with the message of the lowest failing rank, prefixed "rank R: ". work must not
// communicate: a rank that failed early would leave the others waiting.
void agree(const Communicator& comm, const std::function<void()>& work);

// One value of each rank's arguments, and how to show it in a message. Kind::rank_own
// values (each rank's row count, say) are gathered but need not agree.
struct Field {
  enum class Kind : std::uint8_t { count, dtype, real, values, rank_own };
  const char* name;
  std::int64_t value;  // a real is its bit pattern; values, a hash of the list
  Kind kind = Kind::count;
};
Field real_field(const char* name, double value);
Field values_field(const char* name, const std::vector<float>& values);
Field rank_own_field(const char* name, Index value);

// The options every rank must give alike (all but the mask and packing, which dist
// refuses, and threads, which is each rank's own).
std::vector<Field> option_fields(const Options& options);

// Gathers every rank's fields in one allgather and throws the same AgreedError on every
// rank at the first field (by rank, then by order) that should agree and differs from
// rank 0's: "rank R: <name>: expected <rank 0's value> (as on rank 0), given <value>".
// Returns every rank's values: [rank][field].
std::vector<std::vector<std::int64_t>> agree_fields(const Communicator& comm,
                                                    const std::vector<Field>& fields);

// t: [B, H, L, d], any strides with a contiguous last dim, copied into contiguous rows at
// out (t.numel() elements of t's dtype): the form a message takes.
void pack(const TensorView& t, std::byte* out);

}  // namespace attn::dist
