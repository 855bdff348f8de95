#include "json_file.hpp"

#include <cstdio>
#include <fstream>
#include <utility>

#include "attn/error.hpp"

namespace attn::bench {

JsonFile::JsonFile(std::string path) : path_(std::move(path)), partial_path_(path_ + ".partial") {
  std::ofstream probe(partial_path_);
  if (!probe) throw Error("--json: cannot write " + partial_path_ + " (expected a writable path)");
}

JsonFile::~JsonFile() {
  if (!committed_) std::remove(partial_path_.c_str());
}

void JsonFile::commit(const nlohmann::json& document) {
  {
    std::ofstream out(partial_path_);
    out << document.dump(2) << "\n";
    out.close();
    if (!out) throw Error("--json: writing " + partial_path_ + " failed");
  }
  if (std::rename(partial_path_.c_str(), path_.c_str()) != 0) {
    throw Error("--json: cannot rename " + partial_path_ + " to " + path_);
  }
  committed_ = true;
}

}  // namespace attn::bench
