// The .npy reader on arbitrary bytes: it must return an array that matches its header or
// throw attn::Error, never crash, read out of bounds or allocate what the file cannot hold.
// The bytes are served as a file from memory (memfd), since read_npy reads from a path.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "attn/error.hpp"
#include "io/npy.hpp"

namespace {

// One memory file for the whole run, rewritten for every input.
int memory_file() {
  static const int fd = memfd_create("fuzz.npy", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const int fd = memory_file();
  if (ftruncate(fd, 0) != 0) std::abort();
  if (size > 0 && pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    const attn::io::NpyArray array = attn::io::read_npy(path);
    if (array.tensor.shape() != attn::io::right_aligned(array.shape)) std::abort();
    if (array.shape.size() == 1 && array.tensor.dtype() != attn::DType::boolean) {
      if (attn::io::read_npy_vector(path).size() != static_cast<std::size_t>(array.shape[0])) {
        std::abort();
      }
    }
  } catch (const attn::Error&) {
  }
  return 0;
}
