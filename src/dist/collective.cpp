#include "dist/collective.hpp"

#include <bit>
#include <cstring>
#include <exception>
#include <sstream>

#include "attn/error.hpp"

namespace attn::dist {

Communicator::Communicator(MPI_Comm comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw Error("comm: expected an initialized MPI (MPI_Init), given none");
  check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Communicator::~Communicator() {
  MPI_Comm_free(&comm_);
}

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(std::string("MPI: ") + call + ": " +
              std::string(text, static_cast<std::size_t>(length)));
}

void agree(const Communicator& comm, const std::function<void()>& work) {
  std::string message;
  bool failed = false;
  try {
    work();
  } catch (const std::exception& e) {
    message = "rank " + std::to_string(comm.rank()) + ": " + e.what();
    failed = true;
  }
  int mine = failed ? comm.rank() : comm.size(), first = comm.size();
  check_mpi(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm.get()), "MPI_Allreduce");
  if (first == comm.size()) return;
  int length = static_cast<int>(message.size());
  check_mpi(MPI_Bcast(&length, 1, MPI_INT, first, comm.get()), "MPI_Bcast");
  message.resize(static_cast<std::size_t>(length));
  check_mpi(MPI_Bcast(message.data(), length, MPI_CHAR, first, comm.get()), "MPI_Bcast");
  throw AgreedError(message);
}

Field real_field(const char* name, double value) {
  return {name, std::bit_cast<std::int64_t>(value), Field::Kind::real};
}

Field rank_own_field(const char* name, Index value) {
  return {name, value, Field::Kind::rank_own};
}

// FNV-1a over the values' bytes: lists that differ anywhere differ here but by chance.
Field values_field(const char* name, const std::vector<float>& values) {
  std::uint64_t hash = 1469598103934665603ull;
  for (const float x : values) {
    const auto bits = std::bit_cast<std::uint32_t>(x);
    for (int byte = 0; byte < 4; ++byte) {
      hash = (hash ^ ((bits >> (8 * byte)) & 0xffu)) * 1099511628211ull;
    }
  }
  hash ^= values.size();
  return {name, static_cast<std::int64_t>(hash), Field::Kind::values};
}

std::vector<Field> option_fields(const Options& options) {
  return {{"causal", options.causal},
          {"causal_align", static_cast<std::int64_t>(options.causal_align)},
          {"position_offset", options.position_offset},
          {"window.left", options.window.left},
          {"window.right", options.window.right},
          real_field("softcap", options.softcap),
          {"scale given", options.scale.has_value()},
          real_field("scale", options.scale.value_or(0.0)),
          values_field("alibi_slopes", options.alibi_slopes),
          values_field("sinks", options.sinks),
          {"pv_precision", static_cast<std::int64_t>(options.pv_precision)},
          {"backend", static_cast<std::int64_t>(options.backend)}};
}

namespace {

std::string shown(const Field& field, std::int64_t value) {
  switch (field.kind) {
    case Field::Kind::dtype:
      return dtype_name(static_cast<DType>(value));
    case Field::Kind::real: {
      std::ostringstream out;
      out << std::bit_cast<double>(value);
      return out.str();
    }
    case Field::Kind::values:
      return "other values";
    case Field::Kind::count:
    case Field::Kind::rank_own:
      break;
  }
  return std::to_string(value);
}

}  // namespace

std::vector<std::vector<std::int64_t>> agree_fields(const Communicator& comm,
                                                    const std::vector<Field>& fields) {
  const auto count = static_cast<int>(fields.size());
  std::vector<std::int64_t> mine, all(fields.size() * static_cast<std::size_t>(comm.size()));
  for (const Field& f : fields) mine.push_back(f.value);
  check_mpi(
      MPI_Allgather(mine.data(), count, MPI_INT64_T, all.data(), count, MPI_INT64_T, comm.get()),
      "MPI_Allgather");
  std::vector<std::vector<std::int64_t>> table;
  for (int r = 0; r < comm.size(); ++r) {
    const auto first = all.begin() + static_cast<std::ptrdiff_t>(r) * count;
    table.emplace_back(first, first + count);
  }
  for (int r = 1; r < comm.size(); ++r) {
    for (std::size_t i = 0; i < fields.size(); ++i) {
      const std::int64_t expected = table[0][i], given = table[static_cast<std::size_t>(r)][i];
      if (fields[i].kind == Field::Kind::rank_own || given == expected) continue;
      throw AgreedError("rank " + std::to_string(r) + ": " + fields[i].name + ": expected " +
                        shown(fields[i], expected) + " (as on rank 0), given " +
                        shown(fields[i], given));
    }
  }
  return table;
}

void pack(const TensorView& t, std::byte* out) {
  const std::size_t row = static_cast<std::size_t>(t.shape[3]) * dtype_size(t.dtype);
  const auto element = static_cast<Index>(dtype_size(t.dtype));
  for (Index b = 0; b < t.shape[0]; ++b)
    for (Index h = 0; h < t.shape[1]; ++h)
      for (Index s = 0; s < t.shape[2]; ++s, out += row) {
        const Index at = (b * t.strides[0] + h * t.strides[1] + s * t.strides[2]) * element;
        std::memcpy(out, static_cast<const std::byte*>(t.data) + at, row);
      }
}

}  // namespace attn::dist
