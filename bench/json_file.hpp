// A JSON result file written whole or not at all: a bad path fails before any benchmark runs,
// and an interrupted run leaves no partial file.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace attn::bench {

class JsonFile {
 public:
  // Opens path + ".partial" for writing; throws attn::Error naming --json if it cannot.
  explicit JsonFile(std::string path);
  ~JsonFile();
  JsonFile(const JsonFile&) = delete;
  JsonFile& operator=(const JsonFile&) = delete;

  // Writes the document and renames the partial file onto the path.
  void commit(const nlohmann::json& document);

 private:
  std::string path_;
  std::string partial_path_;
  bool committed_ = false;
};

}  // namespace attn::bench
