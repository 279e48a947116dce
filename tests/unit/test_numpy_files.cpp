// The NumPy file reader (include/mfattn/io/numpy_files.hpp) on files the tests write byte by
// byte as numpy.save, numpy.savez and numpy.savez_compressed lay them out (numpy's format
// specification, PKWARE's APPNOTE.TXT): no Python at test time. The refusals are checked for
// their type and for naming the file, the member and what is wrong.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "mfattn/io/numpy_files.hpp"

namespace {

namespace fs = std::filesystem;
using mfattn::IoError;
using mfattn::NumpyArray;
using mfattn::NumpyFormatError;
using mfattn::read_numpy_file;
using Bytes = std::vector<unsigned char>;

void append(Bytes& bytes, const std::string& text) {
  bytes.insert(bytes.end(), text.begin(), text.end());
}
void append(Bytes& bytes, const Bytes& more) {
  bytes.insert(bytes.end(), more.begin(), more.end());
}
void append_little(Bytes& bytes, std::uint64_t value, std::size_t width) {
  for (std::size_t b = 0; b < width; ++b)
    bytes.push_back(static_cast<unsigned char>(value >> (8 * b)));
}

/// The little-endian bytes of values (the element types' own layout on the little-endian
/// machines the tests run on, checked below).
template <class T>
Bytes raw_bytes(const std::vector<T>& values) {
  Bytes bytes(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

/// A .npy file of format `version` (1, 2 or 3) with the header dict `dict` (as written, padded
/// with spaces and a newline to a multiple of 64 bytes, as numpy does) and the data `data`.
Bytes npy_file(const std::string& dict, const Bytes& data, int version = 1) {
  const std::size_t preamble = version == 1 ? 10 : 12;
  std::string header = dict;
  while ((preamble + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  Bytes bytes;
  append(bytes, std::string("\x93NUMPY"));
  bytes.push_back(static_cast<unsigned char>(version));
  bytes.push_back(0);
  append_little(bytes, header.size(), version == 1 ? 2 : 4);
  append(bytes, header);
  append(bytes, data);
  return bytes;
}

std::string dict_of(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
         ", 'shape': " + shape + ", }";
}

Bytes deflate_raw(const Bytes& input) {
  z_stream stream{};
  EXPECT_EQ(deflateInit2(&stream, Z_BEST_COMPRESSION, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY),
            Z_OK);
  Bytes output(deflateBound(&stream, static_cast<uLong>(input.size())));
  stream.next_in = const_cast<Bytef*>(input.data());  // zlib's API without ZLIB_CONST
  stream.avail_in = static_cast<uInt>(input.size());
  stream.next_out = output.data();
  stream.avail_out = static_cast<uInt>(output.size());
  EXPECT_EQ(deflate(&stream, Z_FINISH), Z_STREAM_END);
  output.resize(stream.total_out);
  deflateEnd(&stream);
  return output;
}

std::uint32_t crc_of(const Bytes& bytes) {
  return static_cast<std::uint32_t>(
      crc32(crc32(0L, Z_NULL, 0), bytes.data(), static_cast<uInt>(bytes.size())));
}

/// One member of a ZIP archive the test writes.
struct ZipMember {
  std::string name;
  Bytes content;               ///< uncompressed
  bool deflated = false;       ///< method 8 (numpy.savez_compressed), else stored (numpy.savez)
  bool zip64_central = false;  ///< central sizes and offset 0xFFFFFFFF, values in extra 0x0001
  bool zip64_local = true;     ///< local sizes 0xFFFFFFFF and a ZIP64 extra, as numpy writes
  std::uint16_t flags = 0;
  std::uint16_t method_override = 0xFFFF;  ///< another method number to record
  std::int64_t crc_change = 0;             ///< added to the recorded CRC-32
};

struct ZipOptions {
  bool zip64_end = false;  ///< a ZIP64 end of central directory record and locator
  std::string comment;     ///< the archive comment, after the end record
};

Bytes zip_archive(const std::vector<ZipMember>& members, const ZipOptions& options = {}) {
  Bytes archive, directory;
  for (const ZipMember& member : members) {
    const Bytes data = member.deflated ? deflate_raw(member.content) : member.content;
    const std::uint16_t method = member.method_override != 0xFFFF ? member.method_override
                                                                  : (member.deflated ? 8 : 0);
    const auto crc = static_cast<std::uint32_t>(crc_of(member.content) + member.crc_change);
    const std::uint64_t offset = archive.size();
    // Local header.
    append_little(archive, 0x04034b50, 4);
    append_little(archive, 45, 2);  // version needed: ZIP64
    append_little(archive, member.flags, 2);
    append_little(archive, method, 2);
    append_little(archive, 0, 4);  // time, date
    append_little(archive, crc, 4);
    append_little(archive, member.zip64_local ? 0xFFFFFFFF : data.size(), 4);
    append_little(archive, member.zip64_local ? 0xFFFFFFFF : member.content.size(), 4);
    append_little(archive, member.name.size(), 2);
    append_little(archive, member.zip64_local ? 20 : 0, 2);
    append(archive, member.name);
    if (member.zip64_local) {
      append_little(archive, 0x0001, 2);
      append_little(archive, 16, 2);
      append_little(archive, member.content.size(), 8);
      append_little(archive, data.size(), 8);
    }
    append(archive, data);
    // Central directory entry; an unrelated extra field (0x5455, a time stamp) before ZIP64's.
    Bytes extra;
    append_little(extra, 0x5455, 2);
    append_little(extra, 5, 2);
    append_little(extra, 0x0102030401, 5);
    if (member.zip64_central) {
      append_little(extra, 0x0001, 2);
      append_little(extra, 24, 2);
      append_little(extra, member.content.size(), 8);
      append_little(extra, data.size(), 8);
      append_little(extra, offset, 8);
    }
    append_little(directory, 0x02014b50, 4);
    append_little(directory, 0x031e, 2);  // made by: Unix, 3.0
    append_little(directory, 45, 2);
    append_little(directory, member.flags, 2);
    append_little(directory, method, 2);
    append_little(directory, 0, 4);
    append_little(directory, crc, 4);
    append_little(directory, member.zip64_central ? 0xFFFFFFFF : data.size(), 4);
    append_little(directory, member.zip64_central ? 0xFFFFFFFF : member.content.size(), 4);
    append_little(directory, member.name.size(), 2);
    append_little(directory, extra.size(), 2);
    append_little(directory, 0, 2);  // comment
    append_little(directory, 0, 2);  // disk
    append_little(directory, 0, 2);  // internal attributes
    append_little(directory, 0, 4);  // external attributes
    append_little(directory, member.zip64_central ? 0xFFFFFFFF : offset, 4);
    append(directory, member.name);
    append(directory, extra);
  }
  const std::uint64_t directory_offset = archive.size();
  append(archive, directory);
  if (options.zip64_end) {
    const std::uint64_t record = archive.size();
    append_little(archive, 0x06064b50, 4);
    append_little(archive, 44, 8);  // the record's size after this field
    append_little(archive, 45, 2);
    append_little(archive, 45, 2);
    append_little(archive, 0, 4);
    append_little(archive, 0, 4);
    append_little(archive, members.size(), 8);
    append_little(archive, members.size(), 8);
    append_little(archive, directory.size(), 8);
    append_little(archive, directory_offset, 8);
    append_little(archive, 0x07064b50, 4);
    append_little(archive, 0, 4);
    append_little(archive, record, 8);
    append_little(archive, 1, 4);
  }
  append_little(archive, 0x06054b50, 4);
  append_little(archive, 0, 4);  // disks
  append_little(archive, options.zip64_end ? 0xFFFF : members.size(), 2);
  append_little(archive, options.zip64_end ? 0xFFFF : members.size(), 2);
  append_little(archive, options.zip64_end ? 0xFFFFFFFF : directory.size(), 4);
  append_little(archive, options.zip64_end ? 0xFFFFFFFF : directory_offset, 4);
  append_little(archive, options.comment.size(), 2);
  append(archive, options.comment);
  return archive;
}

std::vector<double> iota_values(std::size_t count, double first, double step) {
  std::vector<double> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = first + step * static_cast<double>(i);
  return values;
}

class NumpyFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::uint16_t probe = 1;
    unsigned char first_byte = 0;
    std::memcpy(&first_byte, &probe, 1);
    ASSERT_EQ(first_byte, 1) << "raw_bytes assumes a little-endian machine";
    std::string pattern = (fs::path(::testing::TempDir()) / "mfattn_numpy_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    folder_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(folder_, ignored);
  }

  std::string write(const std::string& name, const Bytes& bytes) const {
    const std::string path = (folder_ / name).string();
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    EXPECT_TRUE(out.good()) << path;
    return path;
  }

  /// The one array of the .npy file `bytes`.
  NumpyArray read_one(const Bytes& bytes, const std::string& name = "array.npy") const {
    const auto arrays = read_numpy_file(write(name, bytes));
    EXPECT_EQ(arrays.size(), 1u);
    return arrays.empty() ? NumpyArray{} : arrays.front();
  }

  /// The NumpyFormatError message of reading `bytes` (a marker when there is none).
  std::string refusal(const Bytes& bytes, const std::string& name = "bad.npy") const {
    try {
      read_numpy_file(write(name, bytes));
    } catch (const NumpyFormatError& e) {
      return e.what();
    }
    return "<no NumpyFormatError thrown>";
  }

  fs::path folder_;
};

using Shape = std::vector<std::size_t>;

TEST_F(NumpyFiles, ReadsFloat64In3DWithAnEmptyName) {
  const auto values = iota_values(24, -3.0, 0.25);
  const auto array = read_one(npy_file(dict_of("<f8", "(2, 3, 4)"), raw_bytes(values)),
                              "states.npy");
  EXPECT_EQ(array.name, "");  // a .npy file's one array has no name: the file is the array
  EXPECT_EQ(array.shape, (Shape{2, 3, 4}));
  EXPECT_EQ(array.values, values);
}

TEST_F(NumpyFiles, ConvertsEveryAcceptedDtype) {
  const std::vector<float> floats{1.5f, -2.25f, 1e-3f, 3.4e38f};
  auto array = read_one(npy_file(dict_of("<f4", "(4,)"), raw_bytes(floats)));
  EXPECT_EQ(array.shape, (Shape{4}));
  for (std::size_t i = 0; i < floats.size(); ++i)
    EXPECT_EQ(array.values[i], static_cast<double>(floats[i]));

  const std::vector<std::int64_t> longs{-5, 0, std::int64_t{1} << 40, -(std::int64_t{1} << 52)};
  array = read_one(npy_file(dict_of("<i8", "(2, 2)"), raw_bytes(longs)));
  EXPECT_EQ(array.values, (std::vector<double>{-5.0, 0.0, 1099511627776.0, -4503599627370496.0}));

  // numpy writes 0 and 1 for bools; any other byte reads as true, as in numpy.
  array = read_one(npy_file(dict_of("|b1", "(5,)"), Bytes{0, 1, 0, 1, 2}));
  EXPECT_EQ(array.values, (std::vector<double>{0, 1, 0, 1, 1}));

  array = read_one(npy_file(dict_of("|i1", "(3,)"), Bytes{0xFF, 0x80, 0x7F}));
  EXPECT_EQ(array.values, (std::vector<double>{-1, -128, 127}));
  array = read_one(npy_file(dict_of("|u1", "(3,)"), Bytes{0xFF, 0x80, 0x7F}));
  EXPECT_EQ(array.values, (std::vector<double>{255, 128, 127}));
  array = read_one(
      npy_file(dict_of("<i2", "(2,)"), raw_bytes(std::vector<std::int16_t>{-300, 32767})));
  EXPECT_EQ(array.values, (std::vector<double>{-300, 32767}));
  array = read_one(npy_file(dict_of("<u2", "(1,)"), raw_bytes(std::vector<std::uint16_t>{65535})));
  EXPECT_EQ(array.values, (std::vector<double>{65535}));
  array = read_one(
      npy_file(dict_of("<i4", "(2,)"), raw_bytes(std::vector<std::int32_t>{-70000, 7})));
  EXPECT_EQ(array.values, (std::vector<double>{-70000, 7}));
  array = read_one(
      npy_file(dict_of("<u4", "(1,)"), raw_bytes(std::vector<std::uint32_t>{4000000000u})));
  EXPECT_EQ(array.values, (std::vector<double>{4000000000.0}));
  array = read_one(npy_file(dict_of("<u8", "(1,)"),
                            raw_bytes(std::vector<std::uint64_t>{std::uint64_t{1} << 63})));
  EXPECT_EQ(array.values, (std::vector<double>{9223372036854775808.0}));
  array = read_one(npy_file(dict_of("=f8", "(1,)"), raw_bytes(std::vector<double>{0.1})));
  EXPECT_EQ(array.values, (std::vector<double>{0.1}));

  // float16: 1, -2, 0.5, the smallest subnormal 2^-24, 65504 (the largest), -0, infinity.
  const std::vector<std::uint16_t> halves{0x3C00, 0xC000, 0x3800, 0x0001, 0x7BFF, 0x8000, 0x7C00};
  array = read_one(npy_file(dict_of("<f2", "(7,)"), raw_bytes(halves)));
  ASSERT_EQ(array.values.size(), 7u);
  EXPECT_EQ(array.values[0], 1.0);
  EXPECT_EQ(array.values[1], -2.0);
  EXPECT_EQ(array.values[2], 0.5);
  EXPECT_EQ(array.values[3], std::ldexp(1.0, -24));
  EXPECT_EQ(array.values[4], 65504.0);
  EXPECT_TRUE(array.values[5] == 0.0 && std::signbit(array.values[5]));
  EXPECT_TRUE(std::isinf(array.values[6]));
  const auto nan = read_one(
      npy_file(dict_of("<f2", "(1,)"), raw_bytes(std::vector<std::uint16_t>{0x7E00})));
  EXPECT_TRUE(std::isnan(nan.values.at(0)));
}

TEST_F(NumpyFiles, ReturnsFortranOrderArraysInCOrder) {
  // [[0, 1, 2], [10, 11, 12]] stored column by column.
  const std::vector<double> columns{0, 10, 1, 11, 2, 12};
  auto array = read_one(npy_file(dict_of("<f8", "(2, 3)", true), raw_bytes(columns)));
  EXPECT_EQ(array.shape, (Shape{2, 3}));
  EXPECT_EQ(array.values, (std::vector<double>{0, 1, 2, 10, 11, 12}));

  // 3-D: element (i, j, k) = 100 i + 10 j + k, the first axis varying fastest in the file.
  const Shape shape{2, 3, 4};
  std::vector<std::int32_t> fortran;
  for (std::size_t k = 0; k < 4; ++k)
    for (std::size_t j = 0; j < 3; ++j)
      for (std::size_t i = 0; i < 2; ++i)
        fortran.push_back(static_cast<std::int32_t>(100 * i + 10 * j + k));
  array = read_one(npy_file(dict_of("<i4", "(2, 3, 4)", true), raw_bytes(fortran)));
  EXPECT_EQ(array.shape, shape);
  std::vector<double> expected;
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 3; ++j)
      for (std::size_t k = 0; k < 4; ++k)
        expected.push_back(static_cast<double>(100 * i + 10 * j + k));
  EXPECT_EQ(array.values, expected);

  // One axis: Fortran and C order are the same.
  array = read_one(npy_file(dict_of("<f8", "(3,)", true), raw_bytes(std::vector<double>{1, 2, 3})));
  EXPECT_EQ(array.values, (std::vector<double>{1, 2, 3}));
}

TEST_F(NumpyFiles, ReadsFormatVersions2And3) {
  const auto values = iota_values(6, 1.0, 1.0);
  for (const int version : {2, 3}) {
    const auto array = read_one(npy_file(dict_of("<f8", "(3, 2)"), raw_bytes(values), version));
    EXPECT_EQ(array.shape, (Shape{3, 2})) << version;
    EXPECT_EQ(array.values, values) << version;
  }
}

TEST_F(NumpyFiles, AcceptsHeaderVariations) {
  // Keys in another order, double quotes, no trailing comma, odd spacing, Python 2's "3L".
  auto array = read_one(npy_file("{ \"shape\" :(3L ,2),'fortran_order':False ,\"descr\":\"<f8\"}",
                                 raw_bytes(iota_values(6, 0.0, 1.0))));
  EXPECT_EQ(array.shape, (Shape{3, 2}));
  EXPECT_EQ(array.values, iota_values(6, 0.0, 1.0));

  array = read_one(npy_file(dict_of("<f8", "()"), raw_bytes(std::vector<double>{42.5})));
  EXPECT_TRUE(array.shape.empty());
  EXPECT_EQ(array.values, (std::vector<double>{42.5}));

  array = read_one(npy_file(dict_of("<f8", "(0, 3)"), Bytes{}));
  EXPECT_EQ(array.shape, (Shape{0, 3}));
  EXPECT_TRUE(array.values.empty());
}

TEST_F(NumpyFiles, ReadsStoredAndDeflatedArchivesInOrder) {
  const auto positions = iota_values(12, 0.5, 0.5);
  const std::vector<float> weights{1.0f, 2.0f, 4.0f};
  const Bytes positions_npy = npy_file(dict_of("<f8", "(2, 3, 2)"), raw_bytes(positions));
  const Bytes weights_npy = npy_file(dict_of("<f4", "(3,)"), raw_bytes(weights));

  for (const bool deflated : {false, true}) {
    const std::string file = deflated ? "compressed.npz" : "stored.npz";
    const auto arrays = read_numpy_file(write(
        file, zip_archive({{.name = "x.npy", .content = positions_npy, .deflated = deflated},
                           {.name = "w.npy", .content = weights_npy, .deflated = deflated}})));
    ASSERT_EQ(arrays.size(), 2u) << file;
    EXPECT_EQ(arrays[0].name, "x");
    EXPECT_EQ(arrays[0].shape, (Shape{2, 3, 2}));
    EXPECT_EQ(arrays[0].values, positions);
    EXPECT_EQ(arrays[1].name, "w");
    EXPECT_EQ(arrays[1].values, (std::vector<double>{1, 2, 4}));
  }
}

TEST_F(NumpyFiles, ReadsZip64RecordsNestedNamesAndComments) {
  const auto values = iota_values(1000, -1.0, 1e-3);
  const Bytes npy = npy_file(dict_of("<f8", "(10, 100)"), raw_bytes(values));
  const auto arrays = read_numpy_file(
      write("zip64.npz", zip_archive({{.name = "run/a.npy", .content = npy, .zip64_central = true},
                                      {.name = "b.npy",
                                       .content = npy,
                                       .deflated = true,
                                       .zip64_central = true,
                                       .zip64_local = false}},
                                     {.zip64_end = true, .comment = "written by a test"})));
  ASSERT_EQ(arrays.size(), 2u);
  EXPECT_EQ(arrays[0].name, "run/a");
  EXPECT_EQ(arrays[0].values, values);
  EXPECT_EQ(arrays[1].name, "b");
  EXPECT_EQ(arrays[1].shape, (Shape{10, 100}));
  EXPECT_EQ(arrays[1].values, values);
}

TEST_F(NumpyFiles, RefusesDamagedOrUnacceptedNpyFiles) {
  const Bytes data = raw_bytes(iota_values(6, 0.0, 1.0));
  Bytes truncated = npy_file(dict_of("<f8", "(2, 3)"), data);
  truncated.resize(truncated.size() - 5);
  std::string message = refusal(truncated, "short.npy");
  EXPECT_NE(message.find("short.npy"), std::string::npos) << message;
  EXPECT_NE(message.find("48 bytes expected"), std::string::npos) << message;
  EXPECT_NE(message.find("43 found"), std::string::npos) << message;

  Bytes long_file = npy_file(dict_of("<f8", "(2, 3)"), data);
  long_file.push_back(0);
  EXPECT_NE(refusal(long_file).find("49 found"), std::string::npos);

  Bytes bad_magic = npy_file(dict_of("<f8", "(2, 3)"), data);
  bad_magic[1] = 'X';
  message = refusal(bad_magic);
  EXPECT_NE(message.find("neither a NumPy .npy file"), std::string::npos) << message;
  EXPECT_NE(refusal(Bytes{}).find("empty"), std::string::npos);

  message = refusal(npy_file(dict_of(">f8", "(2, 3)"), data));
  EXPECT_NE(message.find("'>f8'"), std::string::npos) << message;
  EXPECT_NE(message.find("big-endian"), std::string::npos) << message;
  EXPECT_NE(message.find("accepted dtypes"), std::string::npos) << message;
  message = refusal(npy_file(dict_of("|O", "(6,)"), Bytes(48)));
  EXPECT_NE(message.find("'|O'"), std::string::npos) << message;
  EXPECT_NE(message.find("accepted dtypes"), std::string::npos) << message;
  EXPECT_NE(refusal(npy_file(dict_of("<c16", "(3,)"), data)).find("complex"), std::string::npos);
  EXPECT_NE(refusal(npy_file(dict_of("<U4", "(3,)"), Bytes(48))).find("strings"),
            std::string::npos);
  EXPECT_NE(
      refusal(
          npy_file("{'descr': [('a', '<f8'), ('b', '<f8')], 'fortran_order': False, 'shape': (3,)}",
                   data))
          .find("structured"),
      std::string::npos);

  // A version 2.0 header claiming 4 GiB, a shape whose product overflows, a broken dict.
  Bytes absurd = npy_file(dict_of("<f8", "(2, 3)"), data, 2);
  for (std::size_t b = 8; b < 12; ++b) absurd[b] = 0xFF;
  EXPECT_NE(refusal(absurd).find("header claims 4294967295 bytes"), std::string::npos);
  EXPECT_NE(refusal(npy_file(dict_of("<f8", "(4294967296, 4294967296, 16)"), data))
                .find("more bytes than"),
            std::string::npos);
  EXPECT_NE(refusal(npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3)", data))
                .find("not a Python dict literal"),
            std::string::npos);
  EXPECT_NE(refusal(npy_file("{'descr': '<f8', 'shape': (2, 3)}", data)).find("lacks"),
            std::string::npos);
  EXPECT_NE(refusal(npy_file(dict_of("<f8", "(-2, 3)"), data)).find("non-negative"),
            std::string::npos);
  Bytes version_4 = npy_file(dict_of("<f8", "(2, 3)"), data);
  version_4[6] = 4;
  EXPECT_NE(refusal(version_4).find("version 4.0"), std::string::npos);
}

TEST_F(NumpyFiles, RefusesDamagedOrUnacceptedArchives) {
  const Bytes npy = npy_file(dict_of("<f8", "(3,)"), raw_bytes(std::vector<double>{1, 2, 3}));

  for (const bool deflated : {false, true}) {
    const std::string message = refusal(
        zip_archive({{.name = "x.npy", .content = npy},
                     {.name = "y.npy", .content = npy, .deflated = deflated, .crc_change = 1}}),
        "damaged.npz");
    EXPECT_NE(message.find("damaged.npz: member 'y.npy'"), std::string::npos) << message;
    EXPECT_NE(message.find("CRC-32 mismatch"), std::string::npos) << message;
  }

  std::string message = refusal(zip_archive({{.name = "notes.txt", .content = npy}}), "other.npz");
  EXPECT_NE(message.find("other.npz: member 'notes.txt'"), std::string::npos) << message;
  EXPECT_NE(message.find("only .npy members"), std::string::npos) << message;

  message = refusal(zip_archive({{.name = ".npy", .content = npy}}), "unnamed.npz");
  EXPECT_NE(message.find("unnamed.npz: member '.npy': a member needs a name"), std::string::npos)
      << message;

  message = refusal(zip_archive({}), "empty.npz");
  EXPECT_NE(message.find("empty.npz"), std::string::npos) << message;
  EXPECT_NE(message.find("holds no arrays"), std::string::npos) << message;

  message = refusal(zip_archive({{.name = "x.npy", .content = npy, .flags = 1}}));
  EXPECT_NE(message.find("encrypted"), std::string::npos) << message;
  message = refusal(zip_archive({{.name = "x.npy", .content = npy, .method_override = 12}}));
  EXPECT_NE(message.find("method 12"), std::string::npos) << message;
  message = refusal(
      zip_archive({{.name = "x.npy", .content = npy}, {.name = "x.npy", .content = npy}}));
  EXPECT_NE(message.find("two members"), std::string::npos) << message;

  // A member that is itself refused names the archive and the member.
  message = refusal(
      zip_archive({{.name = "big.npy", .content = npy_file(dict_of(">f8", "(3,)"), Bytes(24))}}),
      "endian.npz");
  EXPECT_NE(message.find("endian.npz: member 'big.npy': dtype '>f8'"), std::string::npos)
      << message;

  Bytes cut = zip_archive({{.name = "x.npy", .content = npy}});
  cut.resize(cut.size() - 10);
  EXPECT_NE(refusal(cut).find("end of central directory"), std::string::npos);

  // Deflated data cut short inside the member (the central directory still intact).
  Bytes deflated_npy = zip_archive({{.name = "x.npy", .content = npy, .deflated = true}});
  const std::size_t data_start = 30 + 5 + 20;
  deflated_npy[data_start] ^= 0xFF;
  message = refusal(deflated_npy);
  EXPECT_TRUE(message.find("deflate") != std::string::npos ||
              message.find("CRC-32") != std::string::npos ||
              message.find("inflates") != std::string::npos)
      << message;
}

TEST_F(NumpyFiles, ReportsUnreadableFilesAsIoErrors) {
  const std::string missing = (folder_ / "missing.npy").string();
  try {
    read_numpy_file(missing);
    ADD_FAILURE() << "no error";
  } catch (const NumpyFormatError& e) {
    ADD_FAILURE() << "a missing file is not a format error: " << e.what();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_numpy_file(folder_.string()), IoError);
}

}  // namespace
