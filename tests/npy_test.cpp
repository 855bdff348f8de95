// .npy reading and writing: round trips for every dtype and rank, byte-exact agreement with
// NumPy's own layout, and one test per kind of bad file, each checking the message.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "io/npy.hpp"
#include "support/temp_dir.hpp"

namespace attn {
namespace {

using io::Shape;
using testing::TempDir;

// The bytes of a .npy file with the given header dict text (padded as NumPy pads it) and
// data bytes, in format version `major`.0.
std::string npy_bytes(const std::string& dict, const std::string& data, int major = 1) {
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  std::string header = dict;
  const std::size_t unpadded = 8 + length_bytes + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::string bytes("\x93NUMPY", 6);
  bytes.push_back(static_cast<char>(major));
  bytes.push_back('\0');
  for (std::size_t i = 0; i < length_bytes; ++i) {
    bytes.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  }
  return bytes + header + data;
}

std::string dict(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
         ", 'shape': " + shape + ", }";
}

std::string float_bytes(const std::vector<float>& values) {
  return {reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)};
}

// A tensor of right_aligned(shape) holding 0, 1, 2, ... (bool: alternating).
Tensor counting_tensor(DType dtype, const Shape& shape) {
  Tensor t(dtype, io::right_aligned(shape));
  for (Index i = 0; i < t.numel(); ++i) {
    const auto x = static_cast<float>(i) - 3.5f;
    switch (dtype) {
      case DType::f16:
        t.data_as<float16>()[i] = to_float16(x);
        break;
      case DType::bf16:
        t.data_as<bfloat16>()[i] = to_bfloat16(x);
        break;
      case DType::f32:
        t.data_as<float>()[i] = x;
        break;
      case DType::f64:
        t.data_as<double>()[i] = x;
        break;
      case DType::boolean:
        t.data_as<bool>()[i] = i % 3 != 0;
        break;
    }
  }
  return t;
}

TEST(Npy, RoundTripEveryDtypeAndRank) {
  const TempDir dir;
  const std::vector<Shape> shapes = {{},           {5},    {3, 7},      {2, 3, 4},
                                     {2, 3, 1, 5}, {0, 4}, {2, 0, 1, 3}};
  for (const DType dtype : {DType::f16, DType::f32, DType::f64, DType::boolean}) {
    for (const Shape& shape : shapes) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + io::format_shape(shape));
      const Tensor written = counting_tensor(dtype, shape);
      const std::string path = dir.file("a.npy");
      io::write_npy(path, written.view(), shape);
      const io::NpyArray read = io::read_npy(path);
      EXPECT_EQ(read.shape, shape);
      EXPECT_EQ(read.tensor.dtype(), dtype);
      EXPECT_EQ(read.tensor.shape(), written.shape());
      EXPECT_EQ(std::memcmp(read.tensor.data(), written.data(), written.nbytes()), 0);
    }
  }
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"a.npy"});
}

TEST(Npy, WritesNumpysExactLayout) {
  const TempDir dir;
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  io::write_npy(dir.file("a.npy"), TensorView(values.data(), DType::f32, {1, 1, 2, 3}), {2, 3});
  // np.save of np.arange(1, 7, dtype='<f4').reshape(2, 3) with NumPy's 64-byte alignment.
  std::string expected("\x93NUMPY\x01\x00\x76\x00", 10);
  expected += "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  expected.resize(127, ' ');
  expected += "\n" + float_bytes(values);
  EXPECT_EQ(dir.read("a.npy"), expected);
}

TEST(Npy, WritesStridedViewsInCOrder) {
  const TempDir dir;
  // Storage [B=1, S=3, H=2, D=2] seen as [1, 2, 3, 2]; the file holds [H, S, D] order.
  const std::vector<float> storage = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  const Dims bhsd{1, 2, 3, 2};
  const TensorView view(storage.data(), DType::f32, bhsd, bshd_strides(bhsd));
  io::write_npy(dir.file("a.npy"), view, {2, 3, 2});
  const io::NpyArray read = io::read_npy(dir.file("a.npy"));
  const std::vector<float> expected = {0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11};
  EXPECT_EQ(std::memcmp(read.tensor.data(), expected.data(), expected.size() * 4), 0);
}

// Past the writer's 1 MiB buffer: one large contiguous block, and many rows of a view.
TEST(Npy, LargeArraysRoundTrip) {
  const TempDir dir;
  const Shape shape{2, 300, 3, 200};
  const Tensor stored = counting_tensor(DType::f32, shape);
  io::write_npy(dir.file("big.npy"), stored.view(), shape);
  const io::NpyArray read = io::read_npy(dir.file("big.npy"));
  ASSERT_EQ(read.shape, shape);
  EXPECT_EQ(std::memcmp(read.tensor.data(), stored.data(), stored.nbytes()), 0);

  const Dims bhsd{2, 3, 300, 200};
  const TensorView strided(stored.data(), DType::f32, bhsd, bshd_strides(bhsd));
  io::write_npy(dir.file("heads_first.npy"), strided, {2, 3, 300, 200});
  const io::NpyArray transposed = io::read_npy(dir.file("heads_first.npy"));
  const float* got = transposed.tensor.data_as<float>();
  const float* want = stored.data_as<float>();
  for (const Index b : {0, 1})
    for (const Index h : {0, 2})
      for (const Index s : {0, 151, 299}) {
        EXPECT_EQ(got[((b * 3 + h) * 300 + s) * 200 + 7], want[((b * 300 + s) * 3 + h) * 200 + 7]);
      }
}

TEST(Npy, ReadsFormatVersions2And3AndBothQuoteStyles) {
  const TempDir dir;
  const std::string data = float_bytes({1.5f, -2.0f});
  for (const int major : {2, 3}) {
    const io::NpyArray read =
        io::read_npy(dir.write("v.npy", npy_bytes(dict("<f4", "(2,)"), data, major)));
    EXPECT_EQ(read.shape, Shape{2});
    EXPECT_EQ(read.tensor.data_as<float>()[1], -2.0f);
  }
  const std::string double_quoted = R"({"descr":"<f4","shape":(1,2),"fortran_order":False})";
  const io::NpyArray read = io::read_npy(dir.write("q.npy", npy_bytes(double_quoted, data)));
  EXPECT_EQ(read.shape, (Shape{1, 2}));
}

TEST(Npy, BoolBytesOtherThanOneReadAsTrue) {
  const TempDir dir;
  const std::string path =
      dir.write("m.npy", npy_bytes(dict("|b1", "(3,)"), std::string("\x00\x02\x01", 3)));
  const io::NpyArray read = io::read_npy(path);
  const auto* bytes = static_cast<const unsigned char*>(read.tensor.data());
  EXPECT_EQ(bytes[0], 0);
  EXPECT_EQ(bytes[1], 1);
  EXPECT_EQ(bytes[2], 1);
}

TEST(Npy, ReadsVectors) {
  const TempDir dir;
  const std::vector<double> values = {0.5, -1.0, 0.25};
  io::write_npy(dir.file("s.npy"), TensorView(values.data(), DType::f64, {1, 1, 1, 3}), {3});
  EXPECT_EQ(io::read_npy_vector(dir.file("s.npy")), (std::vector<float>{0.5f, -1.0f, 0.25f}));
}

// Selected rows of one dim, every dim in turn, against the same elements of the whole array.
TEST(Npy, ReadsChosenRowsOfOneDim) {
  const TempDir dir;
  const Shape shape{2, 5, 3, 4};
  for (const DType dtype : {DType::f16, DType::f32, DType::f64, DType::boolean}) {
    const Tensor whole = counting_tensor(dtype, shape);
    const std::string path = dir.file("a.npy");
    io::write_npy(path, whole.view(), shape);
    EXPECT_EQ(io::read_npy_shape(path), shape);
    for (std::size_t axis = 0; axis < shape.size(); ++axis) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " axis " + std::to_string(axis));
      // Out of order, an empty range, and the dim's last row.
      const std::vector<io::RowRange> ranges = {
          {shape[axis] - 1, 1}, {0, 1}, {1, 0}, {0, shape[axis] - 1}};
      const io::NpyArray read = io::read_npy_rows(path, axis, ranges);
      Shape want_shape = shape;
      want_shape[axis] = shape[axis] + 1;
      ASSERT_EQ(read.shape, want_shape);
      std::vector<Index> rows;  // for each row read, the row of the whole it is
      for (const io::RowRange& range : ranges)
        for (Index i = 0; i < range.count; ++i) rows.push_back(range.first + i);
      const std::size_t element = dtype_size(dtype);
      const io::RowLayout read_rows = io::row_layout(read.shape, axis, element);
      const io::RowLayout whole_rows = io::row_layout(shape, axis, element);
      ASSERT_EQ(read_rows.outer, whole_rows.outer);
      ASSERT_EQ(read_rows.row_bytes, whole_rows.row_bytes);
      const auto* got = static_cast<const char*>(read.tensor.data());
      const auto* want = static_cast<const char*>(whole.data());
      for (Index outer = 0; outer < read_rows.outer; ++outer)
        for (std::size_t i = 0; i < rows.size(); ++i) {
          const auto at = static_cast<Index>(read_rows.row_bytes) *
                          (outer * static_cast<Index>(rows.size()) + static_cast<Index>(i));
          const auto from =
              static_cast<Index>(whole_rows.row_bytes) * (outer * shape[axis] + rows[i]);
          EXPECT_EQ(std::memcmp(got + at, want + from, read_rows.row_bytes), 0)
              << "outer " << outer << " row " << rows[i];
        }
    }
  }
}

TEST(Npy, RowsOutsideTheDimAreRefused) {
  const TempDir dir;
  const Shape shape{3, 4};
  const std::string path = dir.file("a.npy");
  io::write_npy(path, counting_tensor(DType::f32, shape).view(), shape);
  const auto message_of = [&](std::size_t axis, io::RowRange range) {
    try {
      io::read_npy_rows(path, axis, {range});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message_of(0, {2, 2}), path + ": rows 2 to 4 of dim 0 are outside shape (3, 4)");
  EXPECT_EQ(message_of(1, {-1, 1}), path + ": rows -1 to 0 of dim 1 are outside shape (3, 4)");
  EXPECT_EQ(message_of(2, {0, 1}), path + ": shape (3, 4) has no dim 2 to read rows of");
  const std::string truncated = dir.write("t.npy", npy_bytes(dict("<f4", "(2, 2)"), "abc"));
  EXPECT_THROW(io::read_npy_rows(truncated, 0, {{0, 1}}), Error);
  EXPECT_THROW(io::read_npy_shape(truncated), Error);
}

// Reading `bytes` as a file must throw attn::Error whose message names the file and
// contains `expected`.
void expect_read_error(const std::string& bytes, const std::string& expected) {
  const TempDir dir;
  const std::string path = dir.write("bad.npy", bytes);
  try {
    io::read_npy(path);
    ADD_FAILURE() << "no error; expected one containing: " << expected;
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind(path + ": ", 0), 0u) << message;
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  }
}

struct BadFile {
  const char* name;
  std::string bytes;
  const char* message;
};

TEST(Npy, RejectsEveryKindOfBadFile) {
  const std::string two_floats = float_bytes({1, 2});
  const std::string good = npy_bytes(dict("<f4", "(2,)"), two_floats);
  std::string huge_header_length("\x93NUMPY\x02\x00\xff\xff\xff\xff", 12);
  std::string header_past_end = good.substr(0, 60);
  const std::vector<BadFile> cases = {
      {"empty", "", "the file is empty"},
      {"bad magic", "\x89PNG\r\n\x1a\n" + good.substr(8), "not a .npy file"},
      {"magic only", "\x93NUMPY", "truncated header"},
      {"truncated prefix", good.substr(0, 9), "truncated header"},
      {"header past the end", header_past_end, "truncated header: it claims 118 bytes"},
      {"absurd header length", huge_header_length + "{}", "absurd header length 4294967295"},
      {"version 4.0", "\x93NUMPY\x04" + good.substr(7), "unsupported .npy format version 4.0"},
      {"truncated data", good.substr(0, good.size() - 1), "truncated data"},
      {"extra data", good + "x", "data size mismatch"},
      {"huge shape", npy_bytes(dict("<f4", "(1099511627776, 1099511627776)"), two_floats),
       "absurd shape"},
      {"shape past the data", npy_bytes(dict("<f4", "(1000000000,)"), two_floats),
       "truncated data"},
      {"extent beyond 64 bits", npy_bytes(dict("<f4", "(99999999999999999999,)"), ""),
       "too large for 64 bits"},
      {"big-endian", npy_bytes(dict(">f4", "(2,)"), two_floats), "expected little-endian '<f4'"},
      {"integer dtype", npy_bytes(dict("<i4", "(2,)"), two_floats), "unsupported dtype '<i4'"},
      {"structured dtype",
       npy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", two_floats),
       "a dtype string"},
      {"fortran order", npy_bytes(dict("<f4", "(2,)", true), two_floats), "fortran_order True"},
      {"ndim 5", npy_bytes(dict("<f4", "(1, 1, 1, 1, 2)"), two_floats), "expected at most 4"},
      {"not a dict", npy_bytes("[1, 2]", two_floats), "expected '{'"},
      {"missing key", npy_bytes("{'descr': '<f4', 'shape': (2,)}", two_floats),
       "no 'fortran_order' key"},
      {"duplicate key",
       npy_bytes("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}",
                 two_floats),
       "given twice"},
      {"unknown key",
       npy_bytes("{'descr': '<f4', 'colour': 1, 'fortran_order': False, 'shape': (2,)}",
                 two_floats),
       "unexpected key 'colour'"},
      {"unterminated string", npy_bytes("{'descr': '<f4}", two_floats), "unterminated string"},
      {"negative extent", npy_bytes(dict("<f4", "(-2,)"), two_floats), "negative extent"},
      {"shape not a tuple", npy_bytes(dict("<f4", "[2]"), two_floats), "a tuple"},
      {"bad bool", npy_bytes("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", two_floats),
       "True or False"},
      {"text after the dict", npy_bytes(dict("<f4", "(2,)") + " x", two_floats),
       "after the closing"},
      // Header text reaches a terminal escaped: no escape sequence restyles it.
      {"escape sequence in the dtype", npy_bytes(dict("\x1b[2J\x1b]0;x\a", "(2,)"), two_floats),
       "unsupported dtype '\\x1b[2J\\x1b]0;x\\x07'"},
      {"escape sequence in a key",
       npy_bytes("{'descr': '<f4', '\x1b[31m': 1, 'fortran_order': False, 'shape': (2,)}",
                 two_floats),
       "unexpected key '\\x1b[31m'"},
  };
  for (const BadFile& c : cases) {
    SCOPED_TRACE(c.name);
    expect_read_error(c.bytes, c.message);
  }
}

// Every truncation and every single-byte corruption of a good file either reads or throws
// attn::Error; nothing else (a crash, a sanitizer report, another exception) is allowed.
TEST(Npy, CorruptedFilesReadOrThrowError) {
  const TempDir dir;
  const std::string data = float_bytes({1, 2, 3, 4, 5, 6});
  const std::string good = npy_bytes(dict("<f4", "(2, 3)"), data);
  // Corrupting the data bytes only changes values; the prefix and header are what is parsed.
  const std::size_t header_end = good.size() - data.size();
  std::vector<std::string> variants;
  for (std::size_t length = 0; length < good.size(); ++length)
    variants.push_back(good.substr(0, length));
  for (std::size_t at = 0; at < header_end; ++at) {
    for (const char byte : {'\0', '\xff', ')', '9', '\''}) {
      std::string variant = good;
      variant[at] = byte;
      variants.push_back(variant);
    }
  }
  int rejected = 0;
  for (std::size_t i = 0; i < variants.size(); ++i) {
    // A new file each time: rewriting one file in place makes ext4 flush it on every close.
    const std::string path = dir.write(std::to_string(i) + ".npy", variants[i]);
    try {
      io::read_npy(path);
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, static_cast<int>(good.size()));
}

TEST(Npy, RejectsMissingFilesAndDirectories) {
  const TempDir dir;
  EXPECT_THROW(
      {
        try {
          io::read_npy(dir.file("missing.npy"));
        } catch (const Error& e) {
          EXPECT_EQ(std::string(e.what()),
                    dir.file("missing.npy") + ": cannot open: No such file or directory");
          throw;
        }
      },
      Error);
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  for (const std::string& path : {dir.path().string(), dir.file("fifo")}) {
    try {
      io::read_npy(path);
      ADD_FAILURE() << path << " was read";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), path + ": not a regular file");
    }
  }
}

TEST(Npy, RejectsVectorsOfTheWrongShapeOrDtype) {
  const TempDir dir;
  const std::string matrix =
      dir.write("m.npy", npy_bytes(dict("<f4", "(1, 2)"), float_bytes({1, 2})));
  EXPECT_THROW(
      {
        try {
          io::read_npy_vector(matrix);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("expected a 1-D array, given shape (1, 2)"),
                    std::string::npos);
          throw;
        }
      },
      Error);
  const std::string flags =
      dir.write("b.npy", npy_bytes(dict("|b1", "(2,)"), std::string("\x01\x00", 2)));
  EXPECT_THROW(io::read_npy_vector(flags), Error);
}

// A failed write leaves nothing behind: no file at the path, no temporary file.
TEST(Npy, FailedWritesLeaveNoFiles) {
  const TempDir dir;
  const std::vector<float> values = {1, 2};
  const TensorView view(values.data(), DType::f32, {1, 1, 1, 2});
  EXPECT_THROW(io::write_npy(dir.file("no/such/dir/a.npy"), view, {2}), Error);
  EXPECT_THROW(io::write_npy(dir.file("a.npy"), view, {3}), Error);
  const std::vector<std::uint16_t> halves = {0, 0};
  EXPECT_THROW(
      io::write_npy(dir.file("a.npy"), TensorView(halves.data(), DType::bf16, {1, 1, 1, 2}), {2}),
      Error);
  std::filesystem::create_directory(dir.file("taken"));
  std::filesystem::create_directory(dir.file("taken/inside"));
  EXPECT_THROW(io::write_npy(dir.file("taken"), view, {2}), Error);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"taken"});
}

TEST(Npy, StagedFilesAppearOnlyOnCommit) {
  const TempDir dir;
  const std::vector<float> values = {1, 2};
  const TensorView view(values.data(), DType::f32, {1, 1, 1, 2});
  {
    io::StagedFile staged = io::stage_npy(dir.file("a.npy"), view, {2});
    EXPECT_FALSE(std::filesystem::exists(dir.file("a.npy")));
  }
  EXPECT_TRUE(dir.entries().empty());
  io::StagedFile staged = io::stage_npy(dir.file("a.npy"), view, {1, 2});
  staged.commit();
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"a.npy"});
  EXPECT_EQ(io::read_npy(dir.file("a.npy")).shape, (Shape{1, 2}));
}

// Outputs are replaced together: a target that turned into a directory after staging stops
// commit_all before the first rename, so the earlier output keeps its old contents.
TEST(Npy, CommitAllReplacesEveryFileOrNone) {
  const TempDir dir;
  const std::vector<float> values = {1, 2};
  const TensorView view(values.data(), DType::f32, {1, 1, 1, 2});
  dir.write("a.npy", "OLD");
  std::vector<io::StagedFile> staged;
  staged.push_back(io::stage_npy(dir.file("a.npy"), view, {2}));
  staged.push_back(io::stage_npy(dir.file("b.npy"), view, {2}));
  std::filesystem::create_directory(dir.file("b.npy"));
  EXPECT_THROW(io::commit_all(staged), Error);
  staged.clear();
  EXPECT_EQ(dir.read("a.npy"), "OLD");
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"a.npy", "b.npy"}));

  staged.push_back(io::stage_npy(dir.file("a.npy"), view, {2}));
  staged.push_back(io::stage_npy(dir.file("c.npy"), view, {1, 2}));
  io::commit_all(staged);
  EXPECT_EQ(io::read_npy(dir.file("a.npy")).shape, (Shape{2}));
  EXPECT_EQ(io::read_npy(dir.file("c.npy")).shape, (Shape{1, 2}));
}

// Only regular files are replaced: a FIFO or a symlink to a device is refused and left as it
// is; a symlink to a regular file stays a link, and the file it names gets the data.
TEST(Npy, WritesOnlyOverRegularFiles) {
  const TempDir dir;
  const std::vector<float> values = {1, 2};
  const TensorView view(values.data(), DType::f32, {1, 1, 1, 2});
  ASSERT_EQ(::mkfifo(dir.file("fifo.npy").c_str(), 0600), 0);
  std::filesystem::create_symlink("/dev/null", dir.file("null.npy"));
  std::filesystem::create_directory(dir.file("sub"));
  dir.write("sub/real.npy", "OLD");
  std::filesystem::create_symlink("sub/real.npy", dir.file("link.npy"));
  std::filesystem::create_symlink("sub/missing.npy", dir.file("dangling.npy"));

  const auto message = [&](const std::string& name) {
    try {
      io::write_npy(dir.file(name), view, {2});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("fifo.npy")
                .find("fifo.npy: expected a regular file or a new path, given a "
                      "FIFO"),
            std::string::npos);
  EXPECT_NE(message("null.npy").find("given a character device"), std::string::npos);
  EXPECT_NE(message("dangling.npy").find("a symlink to a missing file"), std::string::npos);
  EXPECT_NE(message("sub").find("given a directory"), std::string::npos);
  EXPECT_THROW(io::check_output_path(dir.file("fifo.npy")), Error);
  EXPECT_TRUE(std::filesystem::is_fifo(dir.file("fifo.npy")));
  EXPECT_TRUE(std::filesystem::is_symlink(dir.file("null.npy")));
  EXPECT_TRUE(std::filesystem::is_symlink(dir.file("dangling.npy")));

  io::write_npy(dir.file("link.npy"), view, {2});
  EXPECT_TRUE(std::filesystem::is_symlink(dir.file("link.npy")));
  EXPECT_EQ(io::read_npy(dir.file("sub/real.npy")).shape, (Shape{2}));
  EXPECT_EQ(dir.entries(),
            (std::vector<std::string>{"dangling.npy", "fifo.npy", "link.npy", "null.npy", "sub"}));
}

}  // namespace
}  // namespace attn
