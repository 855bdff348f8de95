// .npy files as NumPy writes them: a magic string, a version, a little-endian header length,
// a Python dict literal {'descr': ..., 'fortran_order': ..., 'shape': (...)} padded with
// spaces, then the raw elements in C order. Every size in a file is checked against the
// file's real size before anything is allocated or read, so a hostile header cannot make
// the reader allocate absurd memory or read past the end.
#include "io/npy.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>
#include <utility>

#include "core/rows.hpp"

namespace attn::io {

static_assert(std::endian::native == std::endian::little,
              ".npy data is read and written as little-endian without byte swapping");

namespace {

constexpr std::string_view kMagic{"\x93NUMPY", 6};
constexpr std::size_t kMaxRank = 4;
// NumPy's own headers are a few hundred bytes; anything past this is not a real header.
constexpr std::uint64_t kMaxHeaderBytes = std::uint64_t{1} << 20;
// Keeps every product of extents (and the byte count) far from int64 overflow.
constexpr Index kMaxElements = Index{1} << 58;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error(path + ": " + what);
}

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(FileDescriptor&&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// Reads up to `count` bytes at `offset`; returns how many there were before the end.
std::size_t read_at(const std::string& path, int fd, void* out, std::size_t count,
                    std::uint64_t offset) {
  char* bytes = static_cast<char*>(out);
  std::size_t done = 0;
  while (done < count) {
    const ssize_t got = ::pread(fd, bytes + done, count - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail(path, std::string("cannot read: ") + std::strerror(errno));
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return done;
}

// Header text as it may appear in a message: printable ASCII as is, every other byte (an
// escape sequence that would restyle the terminal, a newline) as \xNN.
std::string escaped(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f && c != '\\') {
      out.push_back(c);
      continue;
    }
    constexpr char kHex[] = "0123456789abcdef";
    out += "\\x";
    out.push_back(kHex[byte >> 4]);
    out.push_back(kHex[byte & 0xf]);
  }
  return out;
}

struct Header {
  std::string descr;
  bool fortran_order = false;
  Shape shape;
};

// The dict literal of a header, as Python's repr writes it (either quote style, spaces
// anywhere, a trailing comma allowed).
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  Header parse() {
    Header header;
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    expect('{', "'{' opening the header dict");
    while (!consume('}')) {
      const std::string key = parse_string("a quoted key");
      expect(':', "':' after key '" + escaped(key) + "'");
      if (key == "descr") {
        mark_seen(seen_descr, key);
        header.descr = parse_string("a dtype string such as '<f4' for 'descr'");
      } else if (key == "fortran_order") {
        mark_seen(seen_fortran, key);
        header.fortran_order = parse_bool();
      } else if (key == "shape") {
        mark_seen(seen_shape, key);
        header.shape = parse_shape();
      } else {
        fail_here("an unexpected key '" + escaped(key) + "'");
      }
      if (!consume(',')) {
        expect('}', "',' or '}' after the value of '" + escaped(key) + "'");
        break;
      }
    }
    skip_space();
    if (pos_ != text_.size()) fail_here("text after the closing '}'");
    if (!seen_descr) fail_here("no 'descr' key");
    if (!seen_fortran) fail_here("no 'fortran_order' key");
    if (!seen_shape) fail_here("no 'shape' key");
    return header;
  }

 private:
  [[noreturn]] void fail_here(const std::string& what) const {
    fail(path_, "malformed .npy header: " + what + " (at byte " + std::to_string(pos_) +
                    " of the header)");
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool consume(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void expect(char c, const std::string& what) {
    if (!consume(c)) fail_here("expected " + what);
  }

  void mark_seen(bool& seen, const std::string& key) const {
    if (seen) fail_here("key '" + key + "' given twice");
    seen = true;
  }

  std::string parse_string(const std::string& what) {
    skip_space();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      fail_here("expected " + what);
    }
    const char quote = text_[pos_++];
    const std::size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) fail_here("an unterminated string");
    std::string value(text_.substr(pos_, end - pos_));
    if (value.find('\\') != std::string::npos) fail_here("an escape sequence in a string");
    pos_ = end + 1;
    return value;
  }

  bool parse_bool() {
    skip_space();
    for (const auto& [word, value] :
         {std::pair{std::string_view("True"), true}, std::pair{std::string_view("False"), false}}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    }
    fail_here("expected True or False for 'fortran_order'");
  }

  Index parse_extent() {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == '-') fail_here("a negative extent in 'shape'");
    const std::size_t begin = pos_;
    Index value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const Index digit = text_[pos_] - '0';
      if (value > (std::numeric_limits<Index>::max() - digit) / 10) {
        fail_here("an extent in 'shape' too large for 64 bits");
      }
      value = value * 10 + digit;
      ++pos_;
    }
    if (pos_ == begin) fail_here("expected an integer extent in 'shape'");
    return value;
  }

  Shape parse_shape() {
    expect('(', "a tuple such as (2, 3) for 'shape'");
    Shape shape;
    while (!consume(')')) {
      shape.push_back(parse_extent());
      if (!consume(',')) {
        expect(')', "',' or ')' in 'shape'");
        break;
      }
    }
    return shape;
  }

  std::string_view text_;
  const std::string& path_;
  std::size_t pos_ = 0;
};

DType dtype_from_descr(const std::string& path, const std::string& descr) {
  if (descr == "<f2") return DType::f16;
  if (descr == "<f4") return DType::f32;
  if (descr == "<f8") return DType::f64;
  if (descr == "|b1" || descr == "?") return DType::boolean;
  if (descr == ">f2" || descr == ">f4" || descr == ">f8") {
    fail(path, "unsupported byte order in dtype '" + descr + "': expected little-endian '<" +
                   descr.substr(1) + "'");
  }
  fail(path, "unsupported dtype '" + escaped(descr) + "': expected '<f2', '<f4', '<f8' or '|b1'");
}

const char* descr_of(const std::string& path, DType dtype) {
  switch (dtype) {
    case DType::f16:
      return "<f2";
    case DType::f32:
      return "<f4";
    case DType::f64:
      return "<f8";
    case DType::boolean:
      return "|b1";
    case DType::bf16:
      break;
  }
  fail(path, "bfloat16 has no .npy dtype; convert to float32 first");
}

// Product of the extents, refusing shapes whose nonzero extents alone multiply past
// kMaxElements (a zero extent must not hide an absurd shape from the stride arithmetic).
Index checked_element_count(const std::string& path, const Shape& shape) {
  Index nonzero_product = 1;
  bool has_zero = false;
  for (const Index extent : shape) {
    if (extent == 0) {
      has_zero = true;
      continue;
    }
    if (nonzero_product > kMaxElements / extent) {
      fail(path, "absurd shape " + format_shape(shape) + " in the header (over 2^58 elements)");
    }
    nonzero_product *= extent;
  }
  return has_zero ? 0 : nonzero_product;
}

std::uint64_t little_endian(const unsigned char* bytes, int count) {
  std::uint64_t value = 0;
  for (int i = count - 1; i >= 0; --i) value = value << 8 | bytes[i];
  return value;
}

}  // namespace

Dims right_aligned(const Shape& shape) {
  Dims dims{1, 1, 1, 1};
  const std::size_t rank = std::min(shape.size(), kMaxRank);
  for (std::size_t i = 0; i < rank; ++i) dims[kMaxRank - rank + i] = shape[shape.size() - rank + i];
  return dims;
}

std::string format_shape(const Shape& shape) {
  std::string text = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return text + (shape.size() == 1 ? ",)" : ")");
}

namespace {

// An open .npy file whose header passed every check, and whose data is exactly the size
// the header claims.
struct OpenNpy {
  FileDescriptor file;
  DType dtype;
  Shape shape;
  std::uint64_t data_offset;
};

OpenNpy open_npy(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is then refused as irregular.
  FileDescriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (file.get() < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat info {};
  if (::fstat(file.get(), &info) != 0)
    fail(path, std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(info.st_mode)) fail(path, "not a regular file");
  const std::uint64_t file_bytes = static_cast<std::uint64_t>(info.st_size);

  unsigned char prefix[12] = {};
  const std::size_t prefix_read = read_at(path, file.get(), prefix, sizeof prefix, 0);
  const std::size_t magic_read = std::min(prefix_read, kMagic.size());
  if (file_bytes == 0) fail(path, "not a .npy file (the file is empty)");
  if (std::memcmp(prefix, kMagic.data(), magic_read) != 0) {
    fail(path, "not a .npy file (it does not start with \\x93NUMPY)");
  }
  if (prefix_read < 10) {
    fail(path, "truncated header: the file ends after " + std::to_string(prefix_read) + " bytes");
  }
  const int major = prefix[6], minor = prefix[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    fail(path, "unsupported .npy format version " + std::to_string(major) + "." +
                   std::to_string(minor) + ": expected 1.0, 2.0 or 3.0");
  }
  const int length_bytes = major == 1 ? 2 : 4;
  const std::size_t header_offset = 8 + static_cast<std::size_t>(length_bytes);
  if (prefix_read < header_offset) {
    fail(path, "truncated header: the file ends after " + std::to_string(prefix_read) + " bytes");
  }
  const std::uint64_t header_bytes = little_endian(prefix + 8, length_bytes);
  if (header_bytes > kMaxHeaderBytes) {
    fail(path, "absurd header length " + std::to_string(header_bytes) + " bytes (limit " +
                   std::to_string(kMaxHeaderBytes) + ")");
  }
  if (header_offset + header_bytes > file_bytes) {
    fail(path, "truncated header: it claims " + std::to_string(header_bytes) +
                   " bytes, the file has " + std::to_string(file_bytes - header_offset) +
                   " after the prefix");
  }
  std::string text(header_bytes, '\0');
  if (read_at(path, file.get(), text.data(), text.size(), header_offset) != text.size()) {
    fail(path, "truncated header: the file shrank while being read");
  }
  const Header header = HeaderParser(text, path).parse();

  const DType dtype = dtype_from_descr(path, header.descr);
  if (header.fortran_order) {
    fail(path,
         "fortran_order True is not supported: expected a C-order array "
         "(save np.ascontiguousarray(a))");
  }
  if (header.shape.size() > kMaxRank) {
    fail(path, "shape " + format_shape(header.shape) + " has " +
                   std::to_string(header.shape.size()) + " dims: expected at most 4");
  }
  const Index count = checked_element_count(path, header.shape);
  const std::uint64_t data_offset = header_offset + header_bytes;
  const std::uint64_t data_bytes = static_cast<std::uint64_t>(count) * dtype_size(dtype);
  const std::uint64_t present = file_bytes - data_offset;
  if (present != data_bytes) {
    fail(path, std::string(present < data_bytes ? "truncated data" : "data size mismatch") +
                   ": shape " + format_shape(header.shape) + " of " + dtype_name(dtype) +
                   " needs " + std::to_string(data_bytes) + " bytes, the file has " +
                   std::to_string(present));
  }
  return {std::move(file), dtype, header.shape, data_offset};
}

// NumPy stores any nonzero byte as true; a C++ bool must hold exactly 0 or 1.
void normalize_bools(Tensor& tensor) {
  if (tensor.dtype() != DType::boolean) return;
  auto* bytes = static_cast<unsigned char*>(tensor.data());
  const auto count = static_cast<std::size_t>(tensor.numel());
  for (std::size_t i = 0; i < count; ++i) bytes[i] = bytes[i] != 0;
}

}  // namespace

NpyArray read_npy(const std::string& path) {
  const OpenNpy npy = open_npy(path);
  NpyArray array{npy.shape, Tensor(npy.dtype, right_aligned(npy.shape))};
  const std::uint64_t data_bytes =
      static_cast<std::uint64_t>(array.tensor.numel()) * dtype_size(npy.dtype);
  if (read_at(path, npy.file.get(), array.tensor.data(), data_bytes, npy.data_offset) !=
      data_bytes) {
    fail(path, "truncated data: the file shrank while being read");
  }
  normalize_bools(array.tensor);
  return array;
}

Shape read_npy_shape(const std::string& path) {
  return open_npy(path).shape;
}

NpyArray read_npy_rows(const std::string& path, std::size_t axis,
                       const std::vector<RowRange>& ranges) {
  const OpenNpy npy = open_npy(path);
  if (axis >= npy.shape.size()) {
    fail(path, "shape " + format_shape(npy.shape) + " has no dim " + std::to_string(axis) +
                   " to read rows of");
  }
  const Index length = npy.shape[axis];
  Index selected = 0;
  for (const RowRange& range : ranges) {
    if (range.first < 0 || range.count < 0 || range.first > length - range.count) {
      fail(path, "rows " + std::to_string(range.first) + " to " +
                     std::to_string(range.first + range.count) + " of dim " + std::to_string(axis) +
                     " are outside shape " + format_shape(npy.shape));
    }
    selected += range.count;
  }
  Shape shape = npy.shape;
  shape[axis] = selected;
  NpyArray array{shape, Tensor(npy.dtype, right_aligned(shape))};
  const RowLayout layout = row_layout(npy.shape, axis, dtype_size(npy.dtype));
  auto* out = static_cast<char*>(array.tensor.data());
  for (Index outer = 0; outer < layout.outer; ++outer) {
    for (const RowRange& range : ranges) {
      const std::size_t bytes = static_cast<std::size_t>(range.count) * layout.row_bytes;
      const std::uint64_t at =
          npy.data_offset + static_cast<std::uint64_t>(outer * length + range.first) *
                                static_cast<std::uint64_t>(layout.row_bytes);
      if (read_at(path, npy.file.get(), out, bytes, at) != bytes) {
        fail(path, "truncated data: the file shrank while being read");
      }
      out += bytes;
    }
  }
  normalize_bools(array.tensor);
  return array;
}

RowLayout row_layout(const Shape& shape, std::size_t axis, std::size_t element_bytes) {
  RowLayout layout{1, element_bytes};
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i < axis) layout.outer *= shape[i];
    if (i > axis) layout.row_bytes *= static_cast<std::size_t>(shape[i]);
  }
  return layout;
}

std::vector<float> read_npy_vector(const std::string& path) {
  const NpyArray array = read_npy(path);
  if (array.shape.size() != 1) {
    fail(path, "expected a 1-D array, given shape " + format_shape(array.shape));
  }
  if (array.tensor.dtype() == DType::boolean) {
    fail(path, "expected a float16, float32 or float64 array, given bool");
  }
  std::vector<double> values(static_cast<std::size_t>(array.shape[0]));
  core::load_row(array.tensor.view(), 0, 0, 0, values.data());
  return {values.begin(), values.end()};
}

std::string npy_header(const std::string& path, DType dtype, const Shape& shape) {
  const char* descr = descr_of(path, dtype);
  if (shape.size() > kMaxRank) {
    fail(path, "cannot write shape " + format_shape(shape) + ": expected at most 4 dims");
  }
  // NumPy pads the header with spaces so that the data starts on a 64-byte boundary.
  std::string dict = std::string("{'descr': '") + descr +
                     "', 'fortran_order': False, 'shape': " + format_shape(shape) + ", }";
  const std::size_t unpadded = kMagic.size() + 4 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');
  const char version_and_length[4] = {1, 0, static_cast<char>(dict.size() & 0xff),
                                      static_cast<char>(dict.size() >> 8)};
  return std::string(kMagic) + std::string(version_and_length, 4) + dict;
}

StagedFile stage_npy(const std::string& path, const TensorView& data, const Shape& shape) {
  const std::string header = npy_header(path, data.dtype, shape);
  if (right_aligned(shape) != data.shape) {
    fail(path, "cannot write dims " + format_dims(data.shape) + " as shape " + format_shape(shape));
  }
  if (data.shape[3] > 1 && data.strides[3] != 1) {
    fail(path, "cannot write a view whose last dim is not contiguous (stride " +
                   std::to_string(data.strides[3]) + ")");
  }
  StagedFile file(path);
  file.write(header.data(), header.size());
  const std::size_t element = dtype_size(data.dtype);
  if (data.numel() > 0 && data.strides == contiguous_strides(data.shape)) {
    file.write(data.data, static_cast<std::size_t>(data.numel()) * element);
  } else if (data.numel() > 0) {
    const char* base = static_cast<const char*>(data.data);
    const std::size_t row_bytes = static_cast<std::size_t>(data.shape[3]) * element;
    for (Index b = 0; b < data.shape[0]; ++b)
      for (Index h = 0; h < data.shape[1]; ++h)
        for (Index s = 0; s < data.shape[2]; ++s) {
          const Index offset = b * data.strides[0] + h * data.strides[1] + s * data.strides[2];
          file.write(base + offset * static_cast<Index>(element), row_bytes);
        }
  }
  file.finish();
  return file;
}

void write_npy(const std::string& path, const TensorView& data, const Shape& shape) {
  stage_npy(path, data, shape).commit();
}

}  // namespace attn::io
