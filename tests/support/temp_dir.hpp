// A fresh directory for a test's files, removed with everything in it at the end.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace attn::testing {

class TempDir {
 public:
  TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();

  const std::filesystem::path& path() const { return path_; }
  // path() / name, as a string.
  std::string file(const std::string& name) const;
  // The names of the entries in the directory, sorted.
  std::vector<std::string> entries() const;
  // Writes `bytes` to path() / name and returns that path.
  std::string write(const std::string& name, const std::string& bytes) const;
  // The contents of path() / name.
  std::string read(const std::string& name) const;

 private:
  std::filesystem::path path_;
};

}  // namespace attn::testing
