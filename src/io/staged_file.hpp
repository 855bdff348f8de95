// A file written under a temporary name in its final directory and renamed into place only
// when complete, so a failed or interrupted write never leaves a partial file at the path.
// Only regular files are ever replaced: a path naming a directory, a device, a FIFO or a
// socket (after following symlinks) is refused, and a symlink to a regular file keeps
// pointing there while the file it names is replaced.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace attn::io {

// Throws attn::Error naming `path` unless it is missing or a regular file (symlinks are
// followed), so that a command can refuse an output before doing any work.
void check_output_path(const std::string& path);

class StagedFile {
 public:
  // Creates "<target>.attn-tmp-<pid>-<n>" next to the file `path` names (the symlink's
  // target for a symlink); throws attn::Error naming `path`.
  explicit StagedFile(std::string path);
  StagedFile(StagedFile&& other) noexcept;
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;
  StagedFile& operator=(StagedFile&&) = delete;
  // Removes the temporary file unless commit() succeeded.
  ~StagedFile();

  const std::string& path() const { return path_; }
  // Where the file is written until commit(): for other writers (processes) of its bytes.
  const std::string& temp_path() const { return temp_path_; }

  void write(const void* bytes, std::size_t count);
  // Flushes and closes the temporary file; write errors such as a full disk surface here.
  void finish();
  // finish(), check_target(), then renames the temporary file over the target.
  void commit();
  // Throws attn::Error naming path() unless the rename can replace the target: it is
  // missing or a regular file, and its directory is writable.
  void check_target() const;

 private:
  friend void commit_all(std::vector<StagedFile>& files);
  void flush();
  void write_all(const char* data, std::size_t count);
  void rename_into_place();

  std::string path_;    // as given, for messages
  std::string target_;  // the file replaced: path_, or the regular file a symlink leads to
  std::string temp_path_;
  int fd_ = -1;
  int signal_slot_ = -1;  // where remove_staged_files_on_signals() finds temp_path_
  bool committed_ = false;
  std::vector<char> buffer_;
};

// Finishes every file and checks every target before renaming any, so that a set of outputs
// is replaced together: a missing directory, a directory or device at a target, or a full
// disk leaves every earlier file as it was.
void commit_all(std::vector<StagedFile>& files);

// Makes SIGINT and SIGTERM remove every temporary file not yet committed, then end the
// process with status 128 + the signal number. For programs (the attn command); a library
// does not take over signals.
void remove_staged_files_on_signals();

}  // namespace attn::io
