#include "dist/row_files.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "io/staged_file.hpp"

namespace attn::dist {
namespace {

// A file opened by this rank alone: ranks open, write and close independently, so that one
// failing cannot leave the others waiting in a collective open.
class RankFile {
 public:
  explicit RankFile(const std::string& temp_path) {
    check_mpi(
        MPI_File_open(MPI_COMM_SELF, temp_path.c_str(), MPI_MODE_WRONLY, MPI_INFO_NULL, &file_),
        "MPI_File_open");
  }
  RankFile(const RankFile&) = delete;
  RankFile& operator=(const RankFile&) = delete;
  ~RankFile() {
    if (file_ != MPI_FILE_NULL) MPI_File_close(&file_);
  }

  void write_at(std::uint64_t offset, const char* bytes, std::size_t count) {
    // MPI counts are ints: large runs go in pieces of at most 1 GiB.
    constexpr std::size_t kMaxWrite = std::size_t{1} << 30;
    while (count > 0) {
      const std::size_t part = std::min(count, kMaxWrite);
      check_mpi(MPI_File_write_at(file_, static_cast<MPI_Offset>(offset), bytes,
                                  static_cast<int>(part), MPI_BYTE, MPI_STATUS_IGNORE),
                "MPI_File_write_at");
      offset += part;
      bytes += part;
      count -= part;
    }
  }

  void close() { check_mpi(MPI_File_close(&file_), "MPI_File_close"); }

 private:
  MPI_File file_ = MPI_FILE_NULL;
};

void write_own_rows(const RowsOfFile& part, const std::string& temp_path) {
  const std::size_t element = dtype_size(part.dtype);
  const std::uint64_t header = io::npy_header(part.path, part.dtype, part.shape).size();
  const io::RowLayout rows = io::row_layout(part.shape, part.axis, element);
  Index local_rows = 0;
  for (const Piece& piece : part.pieces) local_rows += piece.count;
  const Index global_rows = part.shape[part.axis];
  RankFile file(temp_path);
  const auto* data = static_cast<const char*>(part.data);
  for (Index outer = 0; outer < rows.outer; ++outer) {
    for (const Piece& piece : part.pieces) {
      const auto from = static_cast<std::size_t>(outer * local_rows + piece.local) * rows.row_bytes;
      const auto to =
          static_cast<std::uint64_t>(outer * global_rows + piece.global) * rows.row_bytes;
      file.write_at(header + to, data + from,
                    static_cast<std::size_t>(piece.count) * rows.row_bytes);
    }
  }
  file.close();
}

// Rank 0's string, on every rank.
std::string broadcast(const Communicator& comm, std::string text) {
  auto length = static_cast<std::int64_t>(text.size());
  check_mpi(MPI_Bcast(&length, 1, MPI_INT64_T, 0, comm.get()), "MPI_Bcast");
  if (length > std::numeric_limits<int>::max()) throw Error("a path longer than 2^31 bytes");
  text.resize(static_cast<std::size_t>(length));
  check_mpi(MPI_Bcast(text.data(), static_cast<int>(length), MPI_CHAR, 0, comm.get()), "MPI_Bcast");
  return text;
}

}  // namespace

void write_rows(const Communicator& comm, const std::vector<RowsOfFile>& files) {
  std::vector<io::StagedFile> staged;
  agree(comm, [&] {
    if (comm.rank() != 0) return;
    for (const RowsOfFile& part : files) {
      staged.emplace_back(part.path);
      const std::string header = io::npy_header(part.path, part.dtype, part.shape);
      staged.back().write(header.data(), header.size());
      staged.back().finish();
    }
  });
  std::vector<std::string> temp_paths;
  for (std::size_t i = 0; i < files.size(); ++i) {
    temp_paths.push_back(broadcast(comm, comm.rank() == 0 ? staged[i].temp_path() : ""));
  }
  agree(comm, [&] {
    for (std::size_t i = 0; i < files.size(); ++i) write_own_rows(files[i], temp_paths[i]);
  });
  agree(comm, [&] {
    if (comm.rank() == 0) io::commit_all(staged);
  });
}

}  // namespace attn::dist
