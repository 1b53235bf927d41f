#include "npy.h"

#include <cstring>
#include <limits>
#include <map>

#include "treecask/error.h"

namespace treecask::interop {
namespace {

constexpr std::string_view kMagic{"\x93NUMPY", 6};

struct DescrEntry {
  DType dtype;
  std::string_view descr;
};
constexpr DescrEntry kDescrs[] = {
    {DType::kBool, "|b1"},       {DType::kInt8, "|i1"},       {DType::kUInt8, "|u1"},
    {DType::kInt16, "<i2"},      {DType::kInt32, "<i4"},      {DType::kInt64, "<i8"},
    {DType::kUInt16, "<u2"},     {DType::kUInt32, "<u4"},     {DType::kUInt64, "<u8"},
    {DType::kFloat16, "<f2"},    {DType::kFloat32, "<f4"},    {DType::kFloat64, "<f8"},
    {DType::kComplex64, "<c8"},  {DType::kComplex128, "<c16"},
};

// A value of the header dict: the only three kinds np.save writes.
struct PyValue {
  enum Kind { kString, kBool, kTuple } kind = kString;
  std::string text;
  bool boolean = false;
  std::vector<int64_t> ints;
};

// Parses the Python literal np.save writes, e.g.
// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
class DictParser {
 public:
  DictParser(std::string_view text, const std::string& file, const std::string& key)
      : s_(text), file_(file), key_(key) {}

  std::map<std::string, PyValue> parse() {
    std::map<std::string, PyValue> out;
    skip_space();
    expect('{');
    skip_space();
    while (peek() != '}') {
      std::string name = parse_string();
      skip_space();
      expect(':');
      skip_space();
      PyValue value = parse_value();
      if (!out.emplace(std::move(name), std::move(value)).second) fail("duplicate key");
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != '}') {
        fail("expected ',' or '}'");
      }
    }
    ++pos_;
    skip_space();
    if (pos_ != s_.size()) fail("unexpected text after the header dict");
    return out;
  }

 private:
  // A header that is not the literal np.save writes: kCorruption.
  [[noreturn]] void fail(const std::string& why) const { throw error(ErrorCode::kCorruption, why); }
  // A valid literal that the tool does not take: kInvalidArgument.
  [[noreturn]] void refuse(const std::string& why) const { throw error(ErrorCode::kInvalidArgument, why); }
  Error error(ErrorCode code, const std::string& why) const {
    return Error(code, file_, key_, ".npy header: " + why + " at offset " + std::to_string(pos_));
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t')) ++pos_;
  }
  std::string parse_string() {
    char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a string");
    ++pos_;
    std::string out;
    while (peek() != quote) {
      if (pos_ >= s_.size()) fail("unterminated string");
      if (s_[pos_] == '\\') refuse("escape sequences are not supported");
      out += s_[pos_++];
    }
    ++pos_;
    return out;
  }
  PyValue parse_value() {
    PyValue v;
    char c = peek();
    if (c == '\'' || c == '"') {
      v.kind = PyValue::kString;
      v.text = parse_string();
    } else if (s_.substr(pos_, 4) == "True") {
      v.kind = PyValue::kBool;
      v.boolean = true;
      pos_ += 4;
    } else if (s_.substr(pos_, 5) == "False") {
      v.kind = PyValue::kBool;
      pos_ += 5;
    } else if (c == '(') {
      v.kind = PyValue::kTuple;
      ++pos_;
      skip_space();
      while (peek() != ')') {
        v.ints.push_back(parse_int());
        skip_space();
        if (peek() == ',') {
          ++pos_;
          skip_space();
        } else if (peek() != ')') {
          fail("expected ',' or ')' in shape");
        }
      }
      ++pos_;
    } else if (c == '[') {
      refuse("structured dtypes (a descr list) are not supported");
    } else {
      fail("unsupported value");
    }
    return v;
  }
  int64_t parse_int() {
    if (peek() < '0' || peek() > '9') fail("expected a non-negative integer");
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      int digit = peek() - '0';
      if (v > (std::numeric_limits<int64_t>::max() - digit) / 10) fail("dimension overflows int64");
      v = v * 10 + digit;
      ++pos_;
    }
    if (peek() == 'L') ++pos_;  // Python 2 long literal, written by old NumPy
    return v;
  }

  std::string_view s_;
  const std::string& file_;
  const std::string& key_;
  size_t pos_ = 0;
};

}  // namespace

std::optional<std::string_view> npy_descr(DType dtype) noexcept {
  for (const auto& e : kDescrs) {
    if (e.dtype == dtype) return e.descr;
  }
  return std::nullopt;
}

std::string npy_header(std::string_view descr, std::span<const int64_t> shape) {
  std::string dict = "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) dict += ", ";
    dict += std::to_string(shape[i]);
  }
  if (shape.size() == 1) dict += ',';
  dict += "), }";
  // Version 1.0 has a 2-byte length (prefix 10 bytes), 2.0 a 4-byte one (12).
  for (size_t prefix : {size_t{10}, size_t{12}}) {
    size_t total = prefix + dict.size() + 1;  // + '\n'
    size_t padded = (total + 63) / 64 * 64;
    size_t header_len = padded - prefix;
    if (prefix == 10 && header_len > 0xffff) continue;
    std::string out(kMagic);
    out += static_cast<char>(prefix == 10 ? 1 : 2);
    out += '\0';
    for (size_t i = 0; i < prefix - 8; ++i) out += static_cast<char>((header_len >> (8 * i)) & 0xff);
    out += dict;
    out.append(padded - out.size() - 1, ' ');
    out += '\n';
    return out;
  }
  return {};  // unreachable: version 2.0 always fits
}

NpyArray parse_npy(std::span<const std::byte> bytes, const std::string& file,
                   const std::string& key) {
  // Damage (the bytes break the .npy format) is kCorruption; a valid array
  // the tool does not take (version, byte order, dtype, layout) kInvalidArgument.
  auto fail = [&](const std::string& why) -> Error { return Error(ErrorCode::kCorruption, file, key, why); };
  auto refuse = [&](const std::string& why) -> Error {
    return Error(ErrorCode::kInvalidArgument, file, key, why);
  };
  auto byte_at = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
  if (bytes.size() < 10 ||
      std::memcmp(bytes.data(), kMagic.data(), kMagic.size()) != 0) {
    throw fail("not a .npy array (bad magic)");
  }
  const uint8_t major = byte_at(6);
  size_t prefix = 0;
  uint64_t header_len = 0;
  if (major == 1) {
    prefix = 10;
    header_len = byte_at(8) | (uint64_t{byte_at(9)} << 8);
  } else if (major == 2 || major == 3) {
    prefix = 12;
    if (bytes.size() < prefix) throw fail(".npy header truncated");
    for (int i = 0; i < 4; ++i) header_len |= uint64_t{byte_at(8 + i)} << (8 * i);
  } else {
    throw refuse(".npy format version " + std::to_string(major) + "." +
               std::to_string(byte_at(7)) + " is not supported (1.0, 2.0, 3.0 are)");
  }
  if (header_len > bytes.size() - prefix) throw fail(".npy header length exceeds the member");
  std::string_view text(reinterpret_cast<const char*>(bytes.data()) + prefix, header_len);
  auto dict = DictParser(text, file, key).parse();

  auto get = [&](const char* name, PyValue::Kind kind) -> const PyValue& {
    auto it = dict.find(name);
    if (it == dict.end()) throw fail(std::string(".npy header lacks '") + name + "'");
    if (it->second.kind != kind) throw fail(std::string(".npy header: bad type for '") + name + "'");
    return it->second;
  };
  const std::string& descr = get("descr", PyValue::kString).text;
  const bool fortran = get("fortran_order", PyValue::kBool).boolean;
  NpyArray out;
  out.shape = get("shape", PyValue::kTuple).ints;
  if (dict.size() != 3) throw fail(".npy header has keys other than descr, fortran_order, shape");

  std::optional<DType> dtype;
  if (!descr.empty() && descr[0] == '>') {
    throw refuse("big-endian arrays ('" + descr + "') are not supported; convert with "
               "a.astype(a.dtype.newbyteorder('<'))");
  }
  for (const auto& e : kDescrs) {
    // np.save writes '|' for one-byte kinds and '<' otherwise; accept either spelling.
    if (descr == e.descr || (descr.size() == e.descr.size() && descr.substr(1) == e.descr.substr(1) &&
                             (descr[0] == '<' || descr[0] == '|'))) {
      dtype = e.dtype;
    }
  }
  if (!dtype) {
    throw refuse("dtype '" + descr + "' is not supported: only bool, integer, float and complex "
               "dtypes are (ml_dtypes' bfloat16/float8 are saved by NumPy as void '|V1'/'|V2' "
               "and cannot be told apart)");
  }
  out.dtype = *dtype;
  if (fortran) {
    int big_dims = 0;
    for (int64_t d : out.shape) big_dims += d > 1 ? 1 : 0;
    if (big_dims > 1) {
      throw refuse("Fortran-order arrays are not supported; save np.ascontiguousarray(a)");
    }
  }
  uint64_t expected = 0;
  try {
    expected = byte_length_for(out.dtype, out.shape);
  } catch (const Error& e) {
    throw fail(".npy shape: " + e.message());
  }
  uint64_t have = bytes.size() - prefix - header_len;
  if (have != expected) {
    throw fail(".npy data is " + std::to_string(have) + " bytes but dtype " + descr + " and shape " +
               "imply " + std::to_string(expected));
  }
  out.data = bytes.subspan(prefix + header_len);
  return out;
}

}  // namespace treecask::interop
