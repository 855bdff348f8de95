// A file written under a temporary name in its final directory and renamed into place only
// when complete, so a failed or interrupted write never leaves a partial file at the path.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace attn::io {

class StagedFile {
 public:
  // Creates "<path>.attn-tmp-<pid>-<n>" next to `path`; throws attn::Error naming `path`.
  explicit StagedFile(std::string path);
  StagedFile(StagedFile&& other) noexcept;
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;
  StagedFile& operator=(StagedFile&&) = delete;
  // Removes the temporary file unless commit() succeeded.
  ~StagedFile();

  const std::string& path() const { return path_; }

  void write(const void* bytes, std::size_t count);
  // Flushes and closes the temporary file; write errors such as a full disk surface here.
  void finish();
  // finish(), then renames the temporary file over `path`.
  void commit();

 private:
  void flush();
  void write_all(const char* data, std::size_t count);

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  bool committed_ = false;
  std::vector<char> buffer_;
};

}  // namespace attn::io
