#include "io/staged_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "attn/error.hpp"

namespace attn::io {
namespace {

// Few large writes instead of one system call per row.
constexpr std::size_t kBufferBytes = std::size_t{1} << 20;

[[noreturn]] void fail(const std::string& path, const std::string& what, int error) {
  throw Error(path + ": " + what + ": " + std::strerror(error));
}

}  // namespace

StagedFile::StagedFile(std::string path) : path_(std::move(path)) {
  static std::atomic<unsigned> counter{0};
  // O_EXCL makes a name clash with another writer a retry, never a shared file; mode 0666
  // lets the umask decide the permissions as for any newly created file.
  for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
    temp_path_ = path_ + ".attn-tmp-" + std::to_string(::getpid()) + "-" +
                 std::to_string(counter.fetch_add(1));
    fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && errno != EEXIST) fail(path_, "cannot create a file there", errno);
  }
  if (fd_ < 0) fail(path_, "cannot create a temporary file next to it", EEXIST);
  buffer_.reserve(kBufferBytes);
}

StagedFile::StagedFile(StagedFile&& other) noexcept
    : path_(std::move(other.path_)),
      temp_path_(std::move(other.temp_path_)),
      fd_(std::exchange(other.fd_, -1)),
      committed_(std::exchange(other.committed_, true)),
      buffer_(std::move(other.buffer_)) {}

StagedFile::~StagedFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void StagedFile::write(const void* bytes, std::size_t count) {
  if (fd_ < 0) throw Error(path_ + ": write after the file was finished");
  const char* data = static_cast<const char*>(bytes);
  if (buffer_.size() + count > kBufferBytes) flush();
  // Large blocks (a whole tensor) go straight to the file instead of through the buffer.
  if (count >= kBufferBytes) {
    write_all(data, count);
  } else {
    buffer_.insert(buffer_.end(), data, data + count);
  }
}

void StagedFile::flush() {
  write_all(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void StagedFile::write_all(const char* data, std::size_t count) {
  while (count > 0) {
    const ssize_t written = ::write(fd_, data, count);
    if (written < 0 && errno == EINTR) continue;
    if (written < 0) fail(path_, "cannot write", errno);
    data += written;
    count -= static_cast<std::size_t>(written);
  }
}

void StagedFile::finish() {
  if (fd_ < 0) return;
  flush();
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) fail(path_, "cannot write", errno);
}

void StagedFile::commit() {
  finish();
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    fail(path_, "cannot move the finished file into place", errno);
  }
  committed_ = true;
}

}  // namespace attn::io
