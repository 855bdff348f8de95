#include "io/staged_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "attn/error.hpp"

namespace attn::io {
namespace {

// Few large writes instead of one system call per row.
constexpr std::size_t kBufferBytes = std::size_t{1} << 20;

[[noreturn]] void fail(const std::string& path, const std::string& what, int error) {
  throw Error(path + ": " + what + ": " + std::strerror(error));
}

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// The file that writing `path` replaces: `path` itself, or the regular file a symlink leads
// to, so that the link stays. Anything else that exists there is refused.
std::string target_of(const std::string& path) {
  struct stat followed {};
  if (::stat(path.c_str(), &followed) != 0) {
    struct stat link {};
    if (errno == ENOENT && ::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
      throw Error(path +
                  ": expected a regular file or a new path, given a symlink to a missing "
                  "file (attn does not replace links)");
    }
    return path;  // missing, or an unreadable directory: creating the file says what is wrong
  }
  if (!S_ISREG(followed.st_mode)) {
    throw Error(path + ": expected a regular file or a new path, given " +
                kind_of(followed.st_mode) + " (attn replaces only regular files)");
  }
  struct stat link {};
  if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    return std::filesystem::canonical(path).string();
  }
  return path;
}

// The temporary files that a signal handler removes: fixed storage, since a handler may
// neither allocate nor take locks. A slot is free (0), being filled (1) or armed (2).
constexpr int kSignalSlots = 64;
std::array<std::atomic<int>, kSignalSlots> slot_states{};
char slot_paths[kSignalSlots][PATH_MAX];

int arm_slot(const std::string& temp_path) {
  if (temp_path.size() >= PATH_MAX) return -1;
  for (int i = 0; i < kSignalSlots; ++i) {
    int free_state = 0;
    if (slot_states[static_cast<std::size_t>(i)].compare_exchange_strong(free_state, 1)) {
      std::memcpy(slot_paths[i], temp_path.c_str(), temp_path.size() + 1);
      slot_states[static_cast<std::size_t>(i)].store(2);
      return i;
    }
  }
  return -1;  // more files staged at once than slots: those are not removed on a signal
}

void disarm_slot(int slot) {
  if (slot >= 0) slot_states[static_cast<std::size_t>(slot)].store(0);
}

extern "C" void remove_staged_and_exit(int signal_number) {
  for (int i = 0; i < kSignalSlots; ++i) {
    if (slot_states[static_cast<std::size_t>(i)].load() == 2) ::unlink(slot_paths[i]);
  }
  ::_exit(128 + signal_number);
}

}  // namespace

void check_output_path(const std::string& path) {
  target_of(path);
}

StagedFile::StagedFile(std::string path) : path_(std::move(path)), target_(target_of(path_)) {
  static std::atomic<unsigned> counter{0};
  // O_EXCL makes a name clash with another writer a retry, never a shared file; mode 0666
  // lets the umask decide the permissions as for any newly created file. The slot is armed
  // before the file exists, so no signal can come between creating and registering it.
  for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
    temp_path_ = target_ + ".attn-tmp-" + std::to_string(::getpid()) + "-" +
                 std::to_string(counter.fetch_add(1));
    signal_slot_ = arm_slot(temp_path_);
    fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ >= 0) break;
    const int error = errno;
    disarm_slot(std::exchange(signal_slot_, -1));
    if (error != EEXIST) fail(path_, "cannot create a file there", error);
  }
  if (fd_ < 0) fail(path_, "cannot create a temporary file next to it", EEXIST);
  buffer_.reserve(kBufferBytes);
}

StagedFile::StagedFile(StagedFile&& other) noexcept
    : path_(std::move(other.path_)),
      target_(std::move(other.target_)),
      temp_path_(std::move(other.temp_path_)),
      fd_(std::exchange(other.fd_, -1)),
      signal_slot_(std::exchange(other.signal_slot_, -1)),
      committed_(std::exchange(other.committed_, true)),
      buffer_(std::move(other.buffer_)) {}

StagedFile::~StagedFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
  disarm_slot(signal_slot_);
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

void StagedFile::check_target() const {
  if (target_of(path_) != target_) {
    throw Error(path_ + ": changed into a different file while attn was writing it");
  }
  const std::filesystem::path directory = std::filesystem::path(target_).parent_path();
  const std::string where = directory.empty() ? "." : directory.string();
  if (::access(where.c_str(), W_OK) != 0) fail(path_, "cannot replace it", errno);
}

void StagedFile::rename_into_place() {
  if (std::rename(temp_path_.c_str(), target_.c_str()) != 0) {
    fail(path_, "cannot move the finished file into place", errno);
  }
  committed_ = true;
  disarm_slot(std::exchange(signal_slot_, -1));
}

void StagedFile::commit() {
  finish();
  check_target();
  rename_into_place();
}

void commit_all(std::vector<StagedFile>& files) {
  for (StagedFile& file : files) file.finish();
  for (const StagedFile& file : files) file.check_target();
  for (StagedFile& file : files) file.rename_into_place();
}

void remove_staged_files_on_signals() {
  struct sigaction action {};
  action.sa_handler = remove_staged_and_exit;
  sigemptyset(&action.sa_mask);
  for (const int signal_number : {SIGINT, SIGTERM}) ::sigaction(signal_number, &action, nullptr);
}

}  // namespace attn::io
