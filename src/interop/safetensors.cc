#include "safetensors.h"

#include <algorithm>
#include <limits>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "treecask/error.h"

namespace treecask::interop {
namespace {

// A header is read in two linear passes: KeyOrder below, then a DOM of
// nlohmann::json (std::map objects). Not ordered_json with a parse callback,
// as before: ordered_json's objects are vectors searched on every insert,
// and the callback parser rescans the parent object each time a child object
// ends, so a 50,000-tensor header took 16 s. Written with ordered_json,
// appending entries without that search (the names are unique).
using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// SAX pass over a header: refuses a key that appears twice in one object
// (throws Duplicate; the reference keeps one of them silently) and records
// the order of the top-level keys and of __metadata__'s, which the DOM's
// sorted objects lose. A syntax error leaves its message in `error`.
struct KeyOrder final : nlohmann::json_sax<Json> {
  struct Duplicate {
    std::string key;
  };
  std::vector<std::string> top, metadata;

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    if (open.size() == 1) in_metadata = top.back() == "__metadata__";
    open.push_back(Open{true, {}});
    return true;
  }
  bool key(string_t& k) override {
    if (!open.back().keys.insert(k).second) throw Duplicate{k};
    if (open.size() == 1) top.push_back(k);
    else if (open.size() == 2 && in_metadata) metadata.push_back(k);
    return true;
  }
  bool end_object() override {
    open.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    open.push_back(Open{false, {}});
    return true;
  }
  bool end_array() override {
    open.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error = e.what();
    return false;  // sax_parse returns false
  }
  std::string error;  // the parser's message for a syntax error

 private:
  struct Open {
    bool object;
    std::set<std::string> keys;
  };
  std::vector<Open> open;  // the containers being parsed, outermost first
  bool in_metadata = false;  // open[1] is the value of the top-level "__metadata__"
};

struct DTypeName {
  std::string_view name;
  DType dtype;
};
// Every safetensors dtype treecask has, with the reference implementation's names.
constexpr DTypeName kDTypes[] = {
    {"BOOL", DType::kBool},          {"U8", DType::kUInt8},
    {"I8", DType::kInt8},            {"U16", DType::kUInt16},
    {"I16", DType::kInt16},          {"U32", DType::kUInt32},
    {"I32", DType::kInt32},          {"U64", DType::kUInt64},
    {"I64", DType::kInt64},          {"F16", DType::kFloat16},
    {"BF16", DType::kBFloat16},      {"F32", DType::kFloat32},
    {"F64", DType::kFloat64},        {"C64", DType::kComplex64},
    {"F8_E4M3", DType::kFloat8E4M3FN}, {"F8_E5M2", DType::kFloat8E5M2},
    // safetensors 0.8 (treecask format 4.0). F4 and F6_* are packed: a
    // tensor's bytes are its elements' bits, which treecask stores as they are.
    {"F4", DType::kFloat4E2M1FN},    {"F6_E2M3", DType::kFloat6E2M3FN},
    {"F6_E3M2", DType::kFloat6E3M2FN}, {"F8_E8M0", DType::kFloat8E8M0FNU},
    {"F8_E4M3FNUZ", DType::kFloat8E4M3FNUZ}, {"F8_E5M2FNUZ", DType::kFloat8E5M2FNUZ},
};

// "[384,1536]": a shape in error messages.
std::string shape_text(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i > 0 ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

uint64_t read_u64_le(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

std::optional<std::string_view> safetensors_dtype(DType dtype) noexcept {
  for (const auto& d : kDTypes) {
    if (d.dtype == dtype) return d.name;
  }
  return std::nullopt;
}

std::string safetensors_refusal(DType dtype, std::span<const int64_t> shape) {
  if (!safetensors_dtype(dtype))
    return "dtype " + std::string(dtype_name(dtype)) + " has no safetensors equivalent";
  uint64_t elements = 1;
  for (int64_t d : shape) elements *= static_cast<uint64_t>(d);  // bounded by the archive's checks
  if (elements * static_cast<uint64_t>(dtype_bits(dtype)) % 8 != 0)
    return std::to_string(elements) + " elements of " + std::string(dtype_name(dtype)) +
           " do not fill whole bytes, which a safetensors tensor must";
  return "";
}

SafetensorsHeader parse_safetensors(std::span<const std::byte> file, const std::string& path) {
  // Every violation is damage to the file (or a file that is not safetensors):
  // kCorruption, as an archive's damage is.
  auto invalid = [&](const std::string& name, const std::string& why) {
    return Error(ErrorCode::kCorruption, path, name, "safetensors: " + why);
  };
  if (file.size() < 8) {
    throw invalid("", "file is " + std::to_string(file.size()) +
                          " bytes, shorter than the 8-byte header length");
  }
  const uint64_t n = read_u64_le(file.data());
  if (n > kSafetensorsMaxHeader) {
    throw invalid("", "header length " + std::to_string(n) + " exceeds the limit of " +
                          std::to_string(kSafetensorsMaxHeader) + " bytes");
  }
  if (n > file.size() - 8) {
    throw invalid("", "header length " + std::to_string(n) + " runs past the end of the " +
                          std::to_string(file.size()) + "-byte file");
  }
  const char* text = reinterpret_cast<const char*>(file.data()) + 8;
  if (n == 0 || text[0] != '{') throw invalid("", "header does not start with '{'");

  // Two linear passes: KeyOrder (syntax, duplicates, key order), then the DOM.
  KeyOrder keys;
  Json header;
  try {
    if (!Json::sax_parse(text, text + n, &keys))
      throw invalid("", "header is not valid UTF-8 JSON: " + keys.error);
    header = Json::parse(text, text + n);
  } catch (const Json::exception& e) {
    throw invalid("", std::string("header is not valid UTF-8 JSON: ") + e.what());
  } catch (const KeyOrder::Duplicate& d) {
    throw invalid(d.key, "duplicate key \"" + d.key + "\" in the header");
  }
  if (!header.is_object()) throw invalid("", "header is not a JSON object");

  SafetensorsHeader out;
  out.data_start = 8 + n;
  out.tensors.reserve(keys.top.size());
  for (const std::string& name : keys.top) {
    const Json& value = header.at(name);
    if (name == "__metadata__") {
      if (value.is_null()) continue;
      if (!value.is_object()) throw invalid("", "__metadata__ is not an object of strings");
      out.has_metadata = true;
      for (const std::string& k : keys.metadata) {
        const Json& v = value.at(k);
        if (!v.is_string()) {
          throw invalid("", "__metadata__ value of \"" + k + "\" is not a string");
        }
        out.metadata.emplace_back(k, v.get<std::string>());
      }
      continue;
    }
    if (!value.is_object()) throw invalid(name, "tensor entry is not an object");
    SafetensorsTensor t;
    t.name = name;

    auto dtype_it = value.find("dtype");
    if (dtype_it == value.end() || !dtype_it->is_string()) {
      throw invalid(name, "missing string field \"dtype\"");
    }
    const std::string& dtype = dtype_it->get_ref<const std::string&>();
    auto known = std::find_if(std::begin(kDTypes), std::end(kDTypes),
                              [&](const DTypeName& d) { return d.name == dtype; });
    if (known == std::end(kDTypes)) throw invalid(name, "unknown dtype \"" + dtype + "\"");
    t.dtype = known->dtype;

    auto shape_it = value.find("shape");
    if (shape_it == value.end() || !shape_it->is_array()) {
      throw invalid(name, "missing array field \"shape\"");
    }
    for (const auto& d : *shape_it) {
      if (!d.is_number_unsigned() ||
          d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        throw invalid(name, "shape " + shape_it->dump() + " is not a list of non-negative integers");
      }
      t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    }

    auto offsets_it = value.find("data_offsets");
    if (offsets_it == value.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
        !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
      throw invalid(name, "\"data_offsets\" is not [begin, end] of non-negative integers");
    }
    t.begin = (*offsets_it)[0].get<uint64_t>();
    t.end = (*offsets_it)[1].get<uint64_t>();
    out.tensors.push_back(std::move(t));
  }

  // As the reference: sort by offsets, then require exact tiling of the data.
  std::stable_sort(out.tensors.begin(), out.tensors.end(),
                   [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
                     return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
                   });
  const uint64_t data_size = file.size() - out.data_start;
  uint64_t expected_begin = 0;
  const std::string* previous = nullptr;
  for (const SafetensorsTensor& t : out.tensors) {
    const std::string where = "data_offsets [" + std::to_string(t.begin) + ", " +
                              std::to_string(t.end) + "]";
    if (t.end < t.begin) throw invalid(t.name, where + ": end is before begin");
    if (t.begin < expected_begin) {
      throw invalid(t.name, where + " overlap tensor \"" + *previous + "\", which ends at " +
                                std::to_string(expected_begin));
    }
    if (t.begin > expected_begin) {
      throw invalid(t.name, where + " leave a hole of " + std::to_string(t.begin - expected_begin) +
                                " bytes after " +
                                (previous ? "tensor \"" + *previous + "\"" : "the header"));
    }
    if (t.end > data_size) {
      throw invalid(t.name, where + " run past the end of the data section (" +
                                std::to_string(data_size) + " bytes)");
    }
    // Checked arithmetic: elements, then bits, as the reference does.
    uint64_t elements = 1;
    for (int64_t d : t.shape) {
      if (__builtin_mul_overflow(elements, static_cast<uint64_t>(d), &elements)) {
        throw invalid(t.name, "element count of shape " + shape_text(t.shape) +
                                  " overflows 64 bits");
      }
    }
    uint64_t bits = 0;
    if (__builtin_mul_overflow(elements, static_cast<uint64_t>(dtype_bits(t.dtype)), &bits)) {
      throw invalid(t.name, "byte size overflows 64 bits");
    }
    if (bits % 8 != 0) {
      throw invalid(t.name, std::to_string(elements) + " elements of " +
                                std::string(*safetensors_dtype(t.dtype)) + " (" +
                                std::to_string(dtype_bits(t.dtype)) +
                                " bits each) do not fill whole bytes");
    }
    if (bits / 8 != t.end - t.begin) {
      throw invalid(t.name, where + " hold " + std::to_string(t.end - t.begin) +
                                " bytes but dtype and shape imply " + std::to_string(bits / 8));
    }
    expected_begin = t.end;
    previous = &t.name;
  }
  if (expected_begin != data_size) {
    throw invalid("", "tensors cover " + std::to_string(expected_begin) +
                          " bytes but the data section is " + std::to_string(data_size) +
                          " bytes (trailing data or a hole at the end)");
  }
  return out;
}

std::string safetensors_header(bool has_metadata, const KeyValues& metadata,
                               std::span<const SafetensorsTensor> tensors) {
  OrderedJson header = OrderedJson::object();
  // Appended to the object's vector directly: OrderedJson's operator[]
  // searches it linearly for the key first.
  auto& entries = header.get_ref<OrderedJson::object_t&>();
  entries.reserve(tensors.size() + 1);
  if (has_metadata) {
    OrderedJson meta = OrderedJson::object();
    auto& kv = meta.get_ref<OrderedJson::object_t&>();
    for (const auto& [k, v] : metadata) kv.emplace_back(k, v);
    entries.emplace_back("__metadata__", std::move(meta));
  }
  for (const SafetensorsTensor& t : tensors) {
    OrderedJson entry = OrderedJson::object();
    entry["dtype"] = std::string(safetensors_dtype(t.dtype).value());
    OrderedJson shape = OrderedJson::array();
    for (int64_t d : t.shape) shape.push_back(static_cast<uint64_t>(d));
    entry["shape"] = std::move(shape);
    entry["data_offsets"] = OrderedJson::array({t.begin, t.end});
    entries.emplace_back(t.name, std::move(entry));
  }
  // Compact, non-ASCII as UTF-8, like serde_json::to_string. Throws
  // Json::type_error for invalid UTF-8 (the caller converts it).
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json;
}

}  // namespace treecask::interop
