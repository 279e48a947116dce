// The reader of NumPy .npy and .npz files (include/mfattn/io/numpy_files.hpp). The whole file
// is read into memory first: a .npz archive is read from its end (the central directory) and
// its members are then found by offset, and the size checks of a .npy file need its length.
// The .npy layout is numpy's format specification (numpy/lib/format.py); the ZIP layout is
// PKWARE's APPNOTE.TXT, sections 4.3 (records) and 4.5.3 (the ZIP64 extra field).
#include "mfattn/io/numpy_files.hpp"

// next_in of zlib's stream is a pointer to const: the archive's bytes need no cast.
#define ZLIB_CONST
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <set>
#include <span>
#include <string_view>

#include "mfattn/core/input_file.hpp"

namespace mfattn {
namespace {

using Bytes = std::vector<unsigned char>;
using ByteSpan = std::span<const unsigned char>;

constexpr std::string_view kNpyMagic = "\x93NUMPY";
/// numpy writes headers of a few hundred bytes; a longer one (a version 2.0 or 3.0 header may
/// claim up to 4 GiB) is a damaged file, not a header to parse.
constexpr std::size_t kMaxHeaderBytes = std::size_t{1} << 20;
/// numpy allows 64 axes (32 before numpy 2.0).
constexpr std::size_t kMaxAxes = 64;
/// Python literals nest this deep at most in a header we could accept (structured dtypes nest
/// further; they are refused anyway, and a bound keeps a hostile header off the stack).
constexpr int kMaxNesting = 32;
/// Deflate expands at most about 1032:1, so a member claiming more is damaged: refusing it
/// keeps a corrupt size from allocating gigabytes.
constexpr std::uint64_t kMaxDeflateRatio = 1032;

constexpr const char* kAcceptedDtypes =
    "accepted dtypes: float64, float32, float16, int8 to int64, uint8 to uint64 and bool, "
    "little-endian or native ('<f8', '<f4', '<f2', '|i1', '<i2', '<i4', '<i8', '|u1', '<u2', "
    "'<u4', '<u8', '|b1')";

[[noreturn]] void refuse(const std::string& where, const std::string& why) {
  throw NumpyFormatError(where + ": " + why);
}

/// Unsigned little-endian integers of the ZIP records and .npy preamble.
std::uint64_t load_little(const unsigned char* at, std::size_t width) {
  std::uint64_t value = 0;
  for (std::size_t b = width; b-- > 0;) value = (value << 8) | at[b];
  return value;
}
std::uint16_t load16(ByteSpan bytes, std::size_t at) {
  return static_cast<std::uint16_t>(load_little(bytes.data() + at, 2));
}
std::uint32_t load32(ByteSpan bytes, std::size_t at) {
  return static_cast<std::uint32_t>(load_little(bytes.data() + at, 4));
}
std::uint64_t load64(ByteSpan bytes, std::size_t at) { return load_little(bytes.data() + at, 8); }

bool starts_with(ByteSpan bytes, std::string_view prefix) {
  return bytes.size() >= prefix.size() &&
         std::memcmp(bytes.data(), prefix.data(), prefix.size()) == 0;
}

std::string hex_text(std::uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", static_cast<unsigned>(value));
  return text;
}

std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string text = "(";
  for (std::size_t axis = 0; axis < shape.size(); ++axis)
    text += (axis ? ", " : "") + std::to_string(shape[axis]);
  return text + (shape.size() == 1 ? ",)" : ")");
}

// ---- The .npy header: a Python dict literal ----

/// A value of the Python literal subset that numpy writes in headers.
struct PyValue {
  enum class Type { String, Integer, Boolean, None, Tuple, List, Dict } type = Type::None;
  std::string text;           ///< String
  std::uint64_t integer = 0;  ///< Integer (magnitude)
  bool negative = false;      ///< Integer
  bool boolean = false;       ///< Boolean
  /// Tuple and List: the items; Dict: keys and values alternating.
  std::vector<PyValue> items;
};

bool is_python_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& where) : text_(text), where_(where) {}

  PyValue parse_whole() {
    PyValue value = parse_value(0);
    skip_space();
    if (at_ != text_.size()) fail("text after the dict");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    refuse(where_, "the .npy header is not a Python dict literal as numpy writes it (" + what +
                       " at byte " + std::to_string(at_) + " of the header)");
  }
  void skip_space() {
    while (at_ < text_.size() && is_python_space(text_[at_])) ++at_;
  }
  char peek() {
    skip_space();
    if (at_ == text_.size()) fail("unexpected end");
    return text_[at_];
  }
  void expect(char wanted) {
    if (peek() != wanted) fail(std::string("'") + wanted + "' expected");
    ++at_;
  }

  PyValue parse_value(int depth) {
    if (depth > kMaxNesting) fail("nesting too deep");
    const char next = peek();
    if (next == '{') return parse_sequence(PyValue::Type::Dict, '}', depth);
    if (next == '(') return parse_sequence(PyValue::Type::Tuple, ')', depth);
    if (next == '[') return parse_sequence(PyValue::Type::List, ']', depth);
    if (next == '\'' || next == '"') return parse_string();
    if ((next >= '0' && next <= '9') || next == '-' || next == '+') return parse_integer();
    return parse_name();
  }

  /// A dict, tuple or list; a trailing comma is allowed, and "(x)" is x, as in Python.
  PyValue parse_sequence(PyValue::Type type, char close, int depth) {
    PyValue value;
    value.type = type;
    ++at_;
    bool comma_seen = false;
    while (peek() != close) {
      value.items.push_back(parse_value(depth + 1));
      if (type == PyValue::Type::Dict) {
        expect(':');
        value.items.push_back(parse_value(depth + 1));
      }
      if (peek() == close) break;
      expect(',');
      comma_seen = true;
    }
    ++at_;
    if (type == PyValue::Type::Tuple && value.items.size() == 1 && !comma_seen) {
      PyValue inner = std::move(value.items.front());
      return inner;
    }
    return value;
  }

  PyValue parse_string() {
    PyValue value;
    value.type = PyValue::Type::String;
    const char quote = text_[at_++];
    for (;;) {
      if (at_ == text_.size()) fail("unterminated string");
      char c = text_[at_++];
      if (c == quote) break;
      if (c == '\\') {
        if (at_ == text_.size()) fail("unterminated string");
        c = text_[at_++];
        if (c == 'n') c = '\n';
        else if (c == 't') c = '\t';
      }
      value.text += c;
    }
    return value;
  }

  PyValue parse_integer() {
    PyValue value;
    value.type = PyValue::Type::Integer;
    if (text_[at_] == '-' || text_[at_] == '+') value.negative = text_[at_++] == '-';
    const std::size_t first_digit = at_;
    while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9') {
      const auto digit = static_cast<std::uint64_t>(text_[at_] - '0');
      if (value.integer > (std::numeric_limits<std::uint64_t>::max() - digit) / 10)
        fail("integer too large");
      value.integer = value.integer * 10 + digit;
      ++at_;
    }
    if (at_ == first_digit) fail("digit expected");
    // Python 2's numpy wrote long integers as "3L".
    if (at_ < text_.size() && (text_[at_] == 'L' || text_[at_] == 'l')) ++at_;
    return value;
  }

  PyValue parse_name() {
    const std::size_t first = at_;
    while (at_ < text_.size() && std::isalpha(static_cast<unsigned char>(text_[at_]))) ++at_;
    const std::string_view name = text_.substr(first, at_ - first);
    PyValue value;
    if (name == "True" || name == "False") {
      value.type = PyValue::Type::Boolean;
      value.boolean = name == "True";
    } else if (name == "None") {
      value.type = PyValue::Type::None;
    } else {
      at_ = first;
      fail(name.empty() ? "unexpected character" : "unknown name '" + std::string(name) + "'");
    }
    return value;
  }

  std::string_view text_;
  const std::string& where_;
  std::size_t at_ = 0;
};

// ---- dtypes ----

enum class ElementKind { Float, Signed, Unsigned, Bool };

struct Dtype {
  ElementKind kind = ElementKind::Float;
  std::size_t width = 8;
  bool big_endian = false;  ///< only for native order ('=') on a big-endian machine
};

Dtype parse_descr(const std::string& descr, const std::string& where) {
  const auto reject = [&](const std::string& why) -> Dtype {
    refuse(where, "dtype '" + descr + "' is not accepted (" + why + "); " + kAcceptedDtypes);
  };
  std::string_view rest = descr;
  char order = '=';  // no byte order character: numpy's dtype('f8') is native
  if (!rest.empty() && std::strchr("<>=|", rest.front()) != nullptr) {
    order = rest.front();
    rest.remove_prefix(1);
  }
  if (rest.empty()) return reject("empty");
  const char code = rest.front();
  rest.remove_prefix(1);
  switch (code) {
    case 'c': return reject("complex numbers");
    case 'O': return reject("Python objects");
    case 'S':
    case 'a':
    case 'U': return reject("strings");
    case 'V': return reject("raw bytes or a structured record");
    case 'M':
    case 'm': return reject("dates or time spans");
    case 'f':
    case 'i':
    case 'u':
    case 'b': break;
    default: return reject("an unknown type code");
  }
  std::size_t width = 0;
  for (const char digit : rest) {
    if (digit < '0' || digit > '9' || width > 64) return reject("an unknown type code");
    width = width * 10 + static_cast<std::size_t>(digit - '0');
  }
  Dtype dtype;
  dtype.width = width;
  if (code == 'f') {
    dtype.kind = ElementKind::Float;
    if (width != 2 && width != 4 && width != 8)
      return reject(width > 8 ? "extended precision floats" : "a float of that width");
  } else if (code == 'b') {
    dtype.kind = ElementKind::Bool;
    if (width != 1) return reject("a bool of that width");
  } else {
    dtype.kind = code == 'i' ? ElementKind::Signed : ElementKind::Unsigned;
    if (width != 1 && width != 2 && width != 4 && width != 8)
      return reject("an integer of that width");
  }
  // One byte has no byte order; numpy writes '|' for it.
  if (width > 1) {
    if (order == '>')
      return reject(
          "big-endian; numpy.save(path, array.astype(array.dtype.newbyteorder('<'))) writes a "
          "little-endian copy");
    if (order == '|') return reject("no byte order given for a multi-byte type");
    dtype.big_endian = order == '=' && std::endian::native == std::endian::big;
  }
  return dtype;
}

double half_to_double(std::uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1F;
  const int mantissa = bits & 0x3FF;
  double magnitude;
  if (exponent == 0)
    magnitude = std::ldexp(static_cast<double>(mantissa), -24);  // subnormal: m / 2^10 * 2^-14
  else if (exponent == 0x1F)
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN()
                         : std::numeric_limits<double>::infinity();
  else
    magnitude = std::ldexp(static_cast<double>(mantissa + 0x400),
                           exponent - 25);  // (1 + m / 2^10) 2^(e - 15)
  return (bits & 0x8000) ? -magnitude : magnitude;
}

/// The Width bytes at `at` as an unsigned integer in the given byte order (compilers turn
/// this into one load, and a byte swap for the other order).
template <std::size_t Width, bool BigEndian>
std::uint64_t load_element(const unsigned char* at) {
  std::uint64_t value = 0;
  for (std::size_t b = 0; b < Width; ++b)
    value |= static_cast<std::uint64_t>(at[BigEndian ? Width - 1 - b : b]) << (8 * b);
  return value;
}

template <ElementKind Kind, std::size_t Width, bool BigEndian>
double element_value(const unsigned char* at) {
  const std::uint64_t raw = load_element<Width, BigEndian>(at);
  if constexpr (Kind == ElementKind::Bool) {
    return raw != 0 ? 1.0 : 0.0;
  } else if constexpr (Kind == ElementKind::Unsigned) {
    return static_cast<double>(raw);
  } else if constexpr (Kind == ElementKind::Signed) {
    if constexpr (Width == 1) return static_cast<std::int8_t>(raw);
    else if constexpr (Width == 2) return static_cast<std::int16_t>(raw);
    else if constexpr (Width == 4) return static_cast<std::int32_t>(raw);
    else return static_cast<double>(static_cast<std::int64_t>(raw));
  } else {
    if constexpr (Width == 2) return half_to_double(static_cast<std::uint16_t>(raw));
    else if constexpr (Width == 4) return std::bit_cast<float>(static_cast<std::uint32_t>(raw));
    else return std::bit_cast<double>(raw);
  }
}

/// values[...] = the elements of data, given in C order or, with fortran_order, in Fortran
/// order (the first axis varying fastest), stored in C order.
template <ElementKind Kind, std::size_t Width, bool BigEndian>
void convert_elements(const unsigned char* data, const std::vector<std::size_t>& shape,
                      bool fortran_order, std::vector<double>& values) {
  const std::size_t count = values.size();
  if (!fortran_order || shape.size() < 2) {
    for (std::size_t e = 0; e < count; ++e)
      values[e] = element_value<Kind, Width, BigEndian>(data + e * Width);
    return;
  }
  // Walk the file's elements in order, keeping their multi-index and C-order position.
  std::vector<std::size_t> c_stride(shape.size(), 1), index(shape.size(), 0);
  for (std::size_t axis = shape.size() - 1; axis-- > 0;)
    c_stride[axis] = c_stride[axis + 1] * shape[axis + 1];
  std::size_t target = 0;
  for (std::size_t e = 0; e < count; ++e) {
    values[target] = element_value<Kind, Width, BigEndian>(data + e * Width);
    for (std::size_t axis = 0; axis < shape.size(); ++axis) {
      target += c_stride[axis];
      if (++index[axis] < shape[axis]) break;
      target -= shape[axis] * c_stride[axis];
      index[axis] = 0;
    }
  }
}

template <bool BigEndian>
void convert_in_order(const Dtype& dtype, const unsigned char* data,
                      const std::vector<std::size_t>& shape, bool fortran_order,
                      std::vector<double>& values) {
  using enum ElementKind;
  switch (dtype.kind) {
    case Bool: return convert_elements<Bool, 1, BigEndian>(data, shape, fortran_order, values);
    case Float:
      if (dtype.width == 2)
        return convert_elements<Float, 2, BigEndian>(data, shape, fortran_order, values);
      if (dtype.width == 4)
        return convert_elements<Float, 4, BigEndian>(data, shape, fortran_order, values);
      return convert_elements<Float, 8, BigEndian>(data, shape, fortran_order, values);
    case Signed:
      if (dtype.width == 1)
        return convert_elements<Signed, 1, BigEndian>(data, shape, fortran_order, values);
      if (dtype.width == 2)
        return convert_elements<Signed, 2, BigEndian>(data, shape, fortran_order, values);
      if (dtype.width == 4)
        return convert_elements<Signed, 4, BigEndian>(data, shape, fortran_order, values);
      return convert_elements<Signed, 8, BigEndian>(data, shape, fortran_order, values);
    case Unsigned:
      if (dtype.width == 1)
        return convert_elements<Unsigned, 1, BigEndian>(data, shape, fortran_order, values);
      if (dtype.width == 2)
        return convert_elements<Unsigned, 2, BigEndian>(data, shape, fortran_order, values);
      if (dtype.width == 4)
        return convert_elements<Unsigned, 4, BigEndian>(data, shape, fortran_order, values);
      return convert_elements<Unsigned, 8, BigEndian>(data, shape, fortran_order, values);
  }
}

// ---- .npy ----

/// The dict entry `key` of a header, or nullptr.
const PyValue* header_entry(const PyValue& dict, std::string_view key) {
  for (std::size_t k = 0; k + 1 < dict.items.size(); k += 2)
    if (dict.items[k].type == PyValue::Type::String && dict.items[k].text == key)
      return &dict.items[k + 1];
  return nullptr;
}

/// One .npy file (or .npz member) whose bytes are `bytes`; `where` names it in messages.
NumpyArray parse_npy(ByteSpan bytes, const std::string& where, std::string name) {
  if (!starts_with(bytes, kNpyMagic))
    refuse(where, "not a .npy file (it does not start with \\x93NUMPY)");
  if (bytes.size() < 10)
    refuse(where, "truncated .npy file (" + std::to_string(bytes.size()) + " bytes)");
  const unsigned major = bytes[6], minor = bytes[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0)
    refuse(where, ".npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                      " is not accepted (accepted: 1.0, 2.0, 3.0)");
  const std::size_t preamble = major == 1 ? 10 : 12;
  if (bytes.size() < preamble)
    refuse(where, "truncated .npy file (" + std::to_string(bytes.size()) + " bytes)");
  const std::uint64_t header_length = major == 1 ? load16(bytes, 8) : load32(bytes, 8);
  if (header_length > kMaxHeaderBytes)
    refuse(where, "the .npy header claims " + std::to_string(header_length) +
                      " bytes, more than the " + std::to_string(kMaxHeaderBytes) +
                      " a header can have (a damaged file)");
  if (header_length > bytes.size() - preamble)
    refuse(where, "truncated .npy file: its header claims " + std::to_string(header_length) +
                      " bytes, " + std::to_string(bytes.size() - preamble) + " follow");
  // Versions 1.0 and 2.0 are latin-1 and 3.0 is UTF-8: the keys and values read are ASCII.
  const std::string_view header(reinterpret_cast<const char*>(bytes.data() + preamble),
                                static_cast<std::size_t>(header_length));
  const PyValue dict = HeaderParser(header, where).parse_whole();
  if (dict.type != PyValue::Type::Dict) refuse(where, "the .npy header is not a dict");
  std::set<std::string> keys;
  for (std::size_t k = 0; k < dict.items.size(); k += 2)
    if (dict.items[k].type == PyValue::Type::String && !keys.insert(dict.items[k].text).second)
      refuse(where, "the .npy header has the key '" + dict.items[k].text + "' twice");

  const PyValue* descr = header_entry(dict, "descr");
  const PyValue* fortran_order = header_entry(dict, "fortran_order");
  const PyValue* shape_value = header_entry(dict, "shape");
  if (!descr || !fortran_order || !shape_value)
    refuse(where, "the .npy header lacks one of 'descr', 'fortran_order', 'shape'");
  if (descr->type == PyValue::Type::List)
    refuse(where, std::string("structured dtypes (records of named fields) are not accepted; ") +
                      kAcceptedDtypes);
  if (descr->type != PyValue::Type::String)
    refuse(where, "the .npy header's 'descr' is not a string");
  const Dtype dtype = parse_descr(descr->text, where);
  if (fortran_order->type != PyValue::Type::Boolean)
    refuse(where, "the .npy header's 'fortran_order' is not True or False");
  if (shape_value->type != PyValue::Type::Tuple)
    refuse(where, "the .npy header's 'shape' is not a tuple");
  if (shape_value->items.size() > kMaxAxes)
    refuse(where, "the array has " + std::to_string(shape_value->items.size()) +
                      " axes, more than " + std::to_string(kMaxAxes));

  NumpyArray array;
  array.name = std::move(name);
  constexpr std::size_t kSizeMax = std::numeric_limits<std::size_t>::max();
  std::size_t count = 1;
  for (const PyValue& extent : shape_value->items) {
    if (extent.type != PyValue::Type::Integer || (extent.negative && extent.integer != 0))
      refuse(where, "the .npy header's 'shape' holds something other than non-negative integers");
    if (extent.integer > kSizeMax) refuse(where, "the .npy header's 'shape' is too large");
    array.shape.push_back(static_cast<std::size_t>(extent.integer));
  }
  // An array with a zero extent is empty whatever its other extents are.
  const bool empty = std::find(array.shape.begin(), array.shape.end(), std::size_t{0}) !=
                     array.shape.end();
  bool overflow = false;
  for (const std::size_t extent : array.shape) {
    if (empty) count = 0;
    else if (count > kSizeMax / extent) overflow = true;
    else count *= extent;
  }
  const std::size_t available = bytes.size() - preamble - static_cast<std::size_t>(header_length);
  if (overflow || count > kSizeMax / dtype.width)
    refuse(where, "shape " + shape_text(array.shape) + " holds more bytes than can be addressed (" +
                      std::to_string(available) + " bytes of data in the file)");
  const std::size_t expected = count * dtype.width;
  if (expected != available)
    refuse(where, (available < expected ? "truncated .npy data: "
                                        : "unexpected bytes after the .npy data: ") +
                      std::to_string(expected) + " bytes expected for shape " +
                      shape_text(array.shape) + " of '" + descr->text + "', " +
                      std::to_string(available) + " found");
  array.values.resize(count);
  const unsigned char* data = bytes.data() + preamble + header_length;
  if (dtype.big_endian)
    convert_in_order<true>(dtype, data, array.shape, fortran_order->boolean, array.values);
  else convert_in_order<false>(dtype, data, array.shape, fortran_order->boolean, array.values);
  return array;
}

// ---- .npz (ZIP) ----

constexpr std::uint32_t kLocalHeaderSignature = 0x04034b50;
constexpr std::uint32_t kCentralHeaderSignature = 0x02014b50;
constexpr std::uint32_t kEndSignature = 0x06054b50;
constexpr std::uint32_t kZip64EndSignature = 0x06064b50;
constexpr std::uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr std::size_t kLocalHeaderSize = 30, kCentralHeaderSize = 46, kEndSize = 22,
                      kZip64EndSize = 56, kZip64LocatorSize = 20;
constexpr std::uint16_t kZip64ExtraId = 0x0001;
constexpr std::uint32_t kSize32Escape = 0xFFFFFFFF;  // "the value is in the ZIP64 extra field"
constexpr std::uint16_t kDiskEscape = 0xFFFF;
constexpr std::uint16_t kEncryptedFlag = 0x0001, kStrongEncryptionFlag = 0x0040;
constexpr std::uint16_t kMethodStored = 0, kMethodDeflate = 8;

struct CentralDirectory {
  std::uint64_t offset = 0, size = 0, entries = 0;
  std::uint64_t end = 0;  ///< where the records after it start (the directory must end before)
};

CentralDirectory find_central_directory(ByteSpan file, const std::string& path) {
  if (file.size() < kEndSize)
    refuse(path, "truncated ZIP archive (no end of central directory record)");
  // The end record is the last 22 bytes plus its comment (at most 65535 bytes): the last
  // signature whose comment reaches exactly the end of the file.
  const std::size_t lowest = file.size() - kEndSize > 0xFFFF ? file.size() - kEndSize - 0xFFFF : 0;
  std::size_t end = file.size() - kEndSize;
  for (;; --end) {
    if (load32(file, end) == kEndSignature &&
        end + kEndSize + load16(file, end + 20) == file.size())
      break;
    if (end == lowest)
      refuse(path, "truncated or damaged ZIP archive (no end of central directory record)");
  }
  std::uint64_t disk = load16(file, end + 4), directory_disk = load16(file, end + 6);
  std::uint64_t entries_here = load16(file, end + 8);
  CentralDirectory directory;
  directory.entries = load16(file, end + 10);
  directory.size = load32(file, end + 12);
  directory.offset = load32(file, end + 16);
  directory.end = end;
  // Python's zipfile adds ZIP64 records when the counts or offsets overflow the fields above.
  if (end >= kZip64LocatorSize && load32(file, end - kZip64LocatorSize) == kZip64LocatorSignature) {
    const std::size_t locator = end - kZip64LocatorSize;
    const std::uint64_t record = load64(file, locator + 8);
    if (load32(file, locator + 4) != 0 || load32(file, locator + 16) > 1)
      refuse(path, "multi-disk (split) ZIP archives are not accepted");
    if (record > locator || locator - record < kZip64EndSize ||
        load32(file, static_cast<std::size_t>(record)) != kZip64EndSignature)
      refuse(path, "damaged ZIP archive (the ZIP64 end of central directory record is missing)");
    const auto at = static_cast<std::size_t>(record);
    disk = load32(file, at + 16);
    directory_disk = load32(file, at + 20);
    entries_here = load64(file, at + 24);
    directory.entries = load64(file, at + 32);
    directory.size = load64(file, at + 40);
    directory.offset = load64(file, at + 48);
    directory.end = record;
  }
  if (disk != 0 || directory_disk != 0 || entries_here != directory.entries)
    refuse(path, "multi-disk (split) ZIP archives are not accepted");
  if (directory.offset > directory.end || directory.size > directory.end - directory.offset)
    refuse(path, "damaged ZIP archive (its central directory lies outside the file)");
  if (directory.entries > directory.size / kCentralHeaderSize)
    refuse(path, "damaged ZIP archive (" + std::to_string(directory.entries) +
                     " entries cannot fit in a central directory of " +
                     std::to_string(directory.size) + " bytes)");
  return directory;
}

/// One central directory entry, with the ZIP64 extra field's values applied.
struct Member {
  std::string name;
  std::uint16_t flags = 0, method = 0;
  std::uint32_t crc = 0;
  std::uint64_t compressed_size = 0, uncompressed_size = 0, local_header = 0;
  std::uint32_t disk = 0;
};

/// Replaces the escaped (0xFFFFFFFF) sizes and offset of `member` by the ZIP64 extra field's
/// values, which follow in that order, each present only when escaped.
void apply_zip64_extra(ByteSpan extra, Member& member, const std::string& where) {
  const bool need_uncompressed = member.uncompressed_size == kSize32Escape;
  const bool need_compressed = member.compressed_size == kSize32Escape;
  const bool need_offset = member.local_header == kSize32Escape;
  const bool need_disk = member.disk == kDiskEscape;
  if (!need_uncompressed && !need_compressed && !need_offset && !need_disk) return;
  std::size_t at = 0;
  while (at + 4 <= extra.size()) {
    const std::uint16_t id = load16(extra, at);
    const std::size_t length = load16(extra, at + 2);
    if (length > extra.size() - at - 4) break;
    if (id == kZip64ExtraId) {
      const ByteSpan field = extra.subspan(at + 4, length);
      std::size_t read = 0;
      const auto next = [&](std::size_t width) {
        if (read + width > field.size())
          refuse(where, "damaged ZIP archive (ZIP64 extra field too short)");
        const std::uint64_t value = load_little(field.data() + read, width);
        read += width;
        return value;
      };
      if (need_uncompressed) member.uncompressed_size = next(8);
      if (need_compressed) member.compressed_size = next(8);
      if (need_offset) member.local_header = next(8);
      if (need_disk) member.disk = static_cast<std::uint32_t>(next(4));
      return;
    }
    at += 4 + length;
  }
  refuse(where, "damaged ZIP archive (sizes escaped to ZIP64 without a ZIP64 extra field)");
}

std::uint32_t crc32_of(ByteSpan data) {
  uLong crc = crc32(0L, nullptr, 0);
  while (!data.empty()) {
    const std::size_t chunk = std::min<std::size_t>(data.size(), UINT_MAX);
    crc = crc32(crc, data.data(), static_cast<uInt>(chunk));
    data = data.subspan(chunk);
  }
  return static_cast<std::uint32_t>(crc);
}

struct InflateStream {
  z_stream stream{};
  bool open = false;
  ~InflateStream() {
    if (open) inflateEnd(&stream);
  }
};

/// The raw deflate stream `compressed` inflated: exactly `expected_size` bytes, or a refusal.
Bytes inflate_member(ByteSpan compressed, std::uint64_t expected_size, const std::string& where) {
  if (expected_size > static_cast<std::uint64_t>(compressed.size()) * kMaxDeflateRatio + 64 ||
      expected_size > std::numeric_limits<std::size_t>::max())
    refuse(where, "damaged ZIP archive (" + std::to_string(expected_size) +
                      " bytes claimed to inflate from " + std::to_string(compressed.size()) +
                      ", more than deflate can produce)");
  Bytes out(static_cast<std::size_t>(expected_size));
  InflateStream inflater;
  // Negative window bits: a raw deflate stream, without the zlib header and checksum.
  if (inflateInit2(&inflater.stream, -MAX_WBITS) != Z_OK)
    throw IoError(where + ": zlib could not start inflating (out of memory)");
  inflater.open = true;
  z_stream& stream = inflater.stream;
  // zlib counts in 32 bits: feed and drain in chunks of at most 4 GiB.
  ByteSpan input = compressed;
  std::size_t output_left = out.size();
  unsigned char* output = out.data();
  for (;;) {
    if (stream.avail_in == 0 && !input.empty()) {
      const std::size_t chunk = std::min<std::size_t>(input.size(), UINT_MAX);
      stream.next_in = input.data();
      stream.avail_in = static_cast<uInt>(chunk);
      input = input.subspan(chunk);
    }
    if (stream.avail_out == 0 && output_left > 0) {
      const std::size_t chunk = std::min<std::size_t>(output_left, UINT_MAX);
      stream.next_out = output;
      stream.avail_out = static_cast<uInt>(chunk);
      output += chunk;
      output_left -= chunk;
    }
    const int status = inflate(&stream, Z_NO_FLUSH);
    if (status == Z_STREAM_END) break;
    if (status == Z_OK) continue;
    if (status == Z_BUF_ERROR && stream.avail_out == 0 && output_left == 0)
      refuse(where, "damaged ZIP archive (the member inflates to more than the " +
                        std::to_string(expected_size) + " bytes its directory entry gives)");
    if (status == Z_BUF_ERROR)
      refuse(where, "damaged ZIP archive (the deflated data is truncated)");
    if (status == Z_MEM_ERROR) throw IoError(where + ": out of memory while inflating");
    refuse(where, std::string("damaged ZIP archive (invalid deflate data: ") +
                      (stream.msg ? stream.msg : "?") + ")");
  }
  const std::uint64_t produced = stream.total_out;
  if (produced != expected_size)
    refuse(where, "damaged ZIP archive (the member inflates to " + std::to_string(produced) +
                      " bytes, its directory "
                      "entry gives " +
                      std::to_string(expected_size) + ")");
  return out;
}

std::vector<NumpyArray> read_npz(ByteSpan file, const std::string& path) {
  const CentralDirectory directory = find_central_directory(file, path);
  if (directory.entries == 0) refuse(path, "the .npz archive holds no arrays");
  std::vector<NumpyArray> arrays;
  std::set<std::string> names;
  const auto directory_end = static_cast<std::size_t>(directory.offset + directory.size);
  auto at = static_cast<std::size_t>(directory.offset);
  for (std::uint64_t entry = 0; entry < directory.entries; ++entry) {
    if (directory_end - at < kCentralHeaderSize || load32(file, at) != kCentralHeaderSignature)
      refuse(path, "damaged ZIP archive (central directory entry " + std::to_string(entry + 1) +
                       " is missing)");
    Member member;
    member.flags = load16(file, at + 8);
    member.method = load16(file, at + 10);
    member.crc = load32(file, at + 16);
    member.compressed_size = load32(file, at + 20);
    member.uncompressed_size = load32(file, at + 24);
    const std::size_t name_length = load16(file, at + 28), extra_length = load16(file, at + 30),
                      comment_length = load16(file, at + 32);
    member.disk = load16(file, at + 34);
    member.local_header = load32(file, at + 42);
    if (directory_end - at - kCentralHeaderSize < name_length + extra_length + comment_length)
      refuse(path, "damaged ZIP archive (central directory entry " + std::to_string(entry + 1) +
                       " is truncated)");
    const std::size_t name_at = at + kCentralHeaderSize;
    member.name.assign(reinterpret_cast<const char*>(file.data() + name_at), name_length);
    at = name_at + name_length + extra_length + comment_length;
    const std::string where = path + ": member '" + member.name + "'";
    apply_zip64_extra(file.subspan(name_at + name_length, extra_length), member, where);

    if (member.flags & (kEncryptedFlag | kStrongEncryptionFlag))
      refuse(where, "encrypted members are not accepted");
    if (member.method != kMethodStored && member.method != kMethodDeflate)
      refuse(where,
             "ZIP compression method " + std::to_string(member.method) +
                 " is not accepted (accepted: stored, as numpy.savez writes, and deflate, as "
                 "numpy.savez_compressed writes)");
    constexpr std::string_view kSuffix = ".npy";
    if (!member.name.ends_with(kSuffix))
      refuse(where,
             "not a .npy member (a .npz archive holds only .npy members, as numpy.savez and "
             "numpy.savez_compressed write)");
    if (member.disk != 0) refuse(path, "multi-disk (split) ZIP archives are not accepted");
    std::string name = member.name.substr(0, member.name.size() - kSuffix.size());
    // An empty name marks the array of a .npy file (numpy_files.hpp).
    if (name.empty() || name.back() == '/')
      refuse(where, "a member needs a name before its .npy suffix");
    if (!names.insert(name).second) refuse(where, "the archive holds two members of this name");

    // The local header repeats the name and has its own extra field: the data follow both.
    if (member.local_header > file.size() || file.size() - member.local_header < kLocalHeaderSize ||
        load32(file, static_cast<std::size_t>(member.local_header)) != kLocalHeaderSignature)
      refuse(where, "damaged ZIP archive (the member's local header is missing)");
    const auto local = static_cast<std::size_t>(member.local_header);
    const std::size_t data_start = local + kLocalHeaderSize + load16(file, local + 26) +
                                   std::size_t{load16(file, local + 28)};
    if (data_start > file.size() || member.compressed_size > file.size() - data_start)
      refuse(where, "truncated ZIP archive (the member's " +
                        std::to_string(member.compressed_size) +
                        " bytes of data lie beyond the end of the file)");
    const ByteSpan stored = file.subspan(data_start,
                                         static_cast<std::size_t>(member.compressed_size));
    Bytes inflated;
    ByteSpan content = stored;
    if (member.method == kMethodDeflate) {
      inflated = inflate_member(stored, member.uncompressed_size, where);
      content = inflated;
    } else if (member.uncompressed_size != member.compressed_size) {
      refuse(where, "damaged ZIP archive (a stored member whose sizes differ)");
    }
    const std::uint32_t crc = crc32_of(content);
    if (crc != member.crc)
      refuse(where, "CRC-32 mismatch (the data are damaged): " + hex_text(crc) + " computed, " +
                        hex_text(member.crc) + " recorded");
    arrays.push_back(parse_npy(content, where, std::move(name)));
  }
  return arrays;
}

}  // namespace

std::vector<NumpyArray> read_numpy_file(const std::string& path) {
  // Read as every input file is (core/input_file.hpp: a regular file, no blocking open), with
  // no size bound beyond memory: the array is the point of the file.
  std::string file;
  try {
    file = read_input_file(path, std::numeric_limits<std::size_t>::max());
  } catch (const InputFileRefused& error) {
    throw IoError("cannot read " + path + ": " + error.what());
  } catch (const std::bad_alloc&) {
    throw IoError("cannot read " + path + ": it does not fit in memory");
  }
  const ByteSpan bytes(reinterpret_cast<const unsigned char*>(file.data()), file.size());
  if (starts_with(bytes, kNpyMagic)) {
    std::vector<NumpyArray> arrays;
    arrays.push_back(parse_npy(bytes, path, ""));
    return arrays;
  }
  // A ZIP archive starts with its first member's local header, or, empty, with its end record.
  if (starts_with(bytes, "PK\x03\x04") || starts_with(bytes, "PK\x05\x06"))
    return read_npz(bytes, path);
  if (bytes.empty()) refuse(path, "the file is empty (a .npy or .npz file was expected)");
  refuse(
      path,
      "neither a NumPy .npy file (which starts with \\x93NUMPY) nor a .npz archive (a ZIP file, which "
      "starts with PK)");
}

}  // namespace mfattn
