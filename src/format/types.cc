#include "treecask/types.h"

#include <algorithm>
#include <array>

#include "format/packing.h"
#include "treecask/error.h"
#include "treecask/treecask.h"

namespace treecask {

const char* library_version() noexcept { return TREECASK_VERSION_STRING; }

namespace {
struct DTypeRow {
  DType dtype;
  std::string_view name;
  int bits;
};
constexpr std::array<DTypeRow, kMaxDType> kDTypes{{
    {DType::kBool, "bool", 8},
    {DType::kInt8, "int8", 8},
    {DType::kInt16, "int16", 16},
    {DType::kInt32, "int32", 32},
    {DType::kInt64, "int64", 64},
    {DType::kUInt8, "uint8", 8},
    {DType::kUInt16, "uint16", 16},
    {DType::kUInt32, "uint32", 32},
    {DType::kUInt64, "uint64", 64},
    {DType::kFloat16, "float16", 16},
    {DType::kBFloat16, "bfloat16", 16},
    {DType::kFloat32, "float32", 32},
    {DType::kFloat64, "float64", 64},
    {DType::kComplex64, "complex64", 64},
    {DType::kComplex128, "complex128", 128},
    {DType::kFloat8E4M3FN, "float8_e4m3fn", 8},
    {DType::kFloat8E5M2, "float8_e5m2", 8},
    {DType::kInt4, "int4", 4},
    {DType::kUInt4, "uint4", 4},
    {DType::kFloat4E2M1FN, "float4_e2m1fn", 4},
    {DType::kFloat6E2M3FN, "float6_e2m3fn", 6},
    {DType::kFloat6E3M2FN, "float6_e3m2fn", 6},
    {DType::kFloat8E8M0FNU, "float8_e8m0fnu", 8},
    {DType::kFloat8E4M3FNUZ, "float8_e4m3fnuz", 8},
    {DType::kFloat8E5M2FNUZ, "float8_e5m2fnuz", 8},
    {DType::kInt2, "int2", 2},
    {DType::kUInt2, "uint2", 2},
    {DType::kFloat8E3M4, "float8_e3m4", 8},
    {DType::kFloat8E4M3, "float8_e4m3", 8},
    {DType::kFloat8E4M3B11FNUZ, "float8_e4m3b11fnuz", 8},
}};
static_assert([] {
  for (size_t i = 0; i < kDTypes.size(); ++i)
    if (static_cast<size_t>(kDTypes[i].dtype) != i + 1) return false;
  return true;
}(), "kDTypes is indexed by DType value - 1");
}  // namespace

bool dtype_valid(uint8_t value) noexcept { return value >= 1 && value <= kMaxDType; }

std::string_view dtype_name(DType dtype) noexcept {
  auto v = static_cast<uint8_t>(dtype);
  return dtype_valid(v) ? kDTypes[v - 1].name : "invalid";
}

std::optional<DType> dtype_from_name(std::string_view name) noexcept {
  for (const auto& row : kDTypes)
    if (row.name == name) return row.dtype;
  return std::nullopt;
}

int dtype_bits(DType dtype) noexcept {
  auto v = static_cast<uint8_t>(dtype);
  return dtype_valid(v) ? kDTypes[v - 1].bits : 0;
}

bool dtype_packed(DType dtype) noexcept {
  int bits = dtype_bits(dtype);
  return bits > 0 && bits < 8;
}

uint64_t byte_length_for(DType dtype, std::span<const int64_t> shape) {
  int bits = dtype_bits(dtype);
  if (bits == 0)
    throw Error(ErrorCode::kInvalidArgument, "", "",
                "invalid dtype value " + std::to_string(static_cast<int>(dtype)));
  // Bits must fit in 2^63: the element count may not exceed 2^63 / bits.
  const unsigned __int128 limit = (unsigned __int128)1 << 63;
  unsigned __int128 count = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error(ErrorCode::kInvalidArgument, "", "", "negative dimension " + std::to_string(d));
    count *= static_cast<uint64_t>(d);
    if (count * bits > limit)
      throw Error(ErrorCode::kInvalidArgument, "", "", "shape overflows 2^63 bits");
  }
  return static_cast<uint64_t>((count * bits + 7) / 8);
}

void pack_elements(DType dtype, std::span<const std::byte> elems, std::span<std::byte> out) {
  if (!dtype_packed(dtype))
    throw Error(ErrorCode::kInvalidArgument, "", "",
                "pack_elements: " + std::string(dtype_name(dtype)) + " is not a packed sub-byte dtype");
  const unsigned bits = static_cast<unsigned>(dtype_bits(dtype));
  if (out.size() != (uint64_t{elems.size()} * bits + 7) / 8)
    throw Error(ErrorCode::kInvalidArgument, "", "",
                "pack_elements: " + std::to_string(elems.size()) + " elements of " + std::to_string(bits) +
                    " bits need " + std::to_string((uint64_t{elems.size()} * bits + 7) / 8) +
                    " bytes, the output has " + std::to_string(out.size()));
  const unsigned mask = (1u << bits) - 1;
  std::fill(out.begin(), out.end(), std::byte{0});
  // Whole groups at a time (slice.h), then the last elements bit by bit.
  const auto* in = reinterpret_cast<const uint8_t*>(elems.data());
  auto* o = reinterpret_cast<uint8_t*>(out.data());
  const size_t per = packing::group_elements(bits), groups = elems.size() / per;
  if (bits == 2) packing::pack_groups<2>(in, groups, o);
  else if (bits == 4) packing::pack_groups<4>(in, groups, o);
  else packing::pack_groups<6>(in, groups, o);
  uint64_t bit = uint64_t{groups} * per * bits;
  for (std::byte e : elems.subspan(groups * per)) {
    const unsigned v = static_cast<unsigned>(e) & mask;
    const uint64_t k = bit >> 3;
    const unsigned sh = static_cast<unsigned>(bit & 7);
    out[k] |= static_cast<std::byte>((v << sh) & 0xFF);
    if (sh + bits > 8) out[k + 1] |= static_cast<std::byte>(v >> (8 - sh));
    bit += bits;
  }
}

std::string_view value_kind_name(ValueKind kind) noexcept {
  switch (kind) {
    case ValueKind::kArray: return "array";
    case ValueKind::kInt: return "int";
    case ValueKind::kFloat: return "float";
    case ValueKind::kBool: return "bool";
    case ValueKind::kStr: return "str";
  }
  return "invalid";
}

std::string_view node_kind_name(NodeKind kind) noexcept {
  switch (kind) {
    case NodeKind::kLeaf: return "leaf";
    case NodeKind::kNone: return "none";
    case NodeKind::kDict: return "dict";
    case NodeKind::kList: return "list";
    case NodeKind::kTuple: return "tuple";
    case NodeKind::kNamedTuple: return "namedtuple";
    case NodeKind::kDataclass: return "dataclass";
  }
  return "invalid";
}

std::string_view codec_name(Codec codec) noexcept {
  switch (codec) {
    case Codec::kNone: return "none";
    case Codec::kLZ4: return "lz4";
  }
  return "invalid";
}

std::string_view filter_name(Filter filter) noexcept {
  switch (filter) {
    case Filter::kNone: return "none";
    case Filter::kByteShuffle: return "shuffle";
  }
  return "invalid";
}

unsigned shuffle_element_bytes(DType dtype) noexcept {
  int bits = dtype_bits(dtype);
  return bits >= 16 && bits % 8 == 0 ? static_cast<unsigned>(bits / 8) : 0u;
}

TreeDef flat_dict_treedef(const std::vector<std::string>& keys) {
  TreeDef def;
  def.reserve(keys.size() + 1);
  TreeNode root;
  root.kind = NodeKind::kDict;
  root.arity = static_cast<uint32_t>(keys.size());
  root.keys = keys;
  def.push_back(std::move(root));
  for (size_t i = 0; i < keys.size(); ++i) def.push_back(TreeNode{});
  return def;
}

namespace {
// Position just past the subtree of the node at `pos` of a pre-order treedef;
// adds the leaves it holds to `leaves`. Never reads past the treedef's end.
size_t skip_subtree(const TreeDef& def, size_t pos, size_t& leaves) {
  uint64_t pending = 1;
  while (pending > 0 && pos < def.size()) {
    const TreeNode& n = def[pos++];
    --pending;
    pending += n.arity;
    if (n.kind == NodeKind::kLeaf) ++leaves;
  }
  return pos;
}
}  // namespace

std::optional<SubtreeAt> find_subtree(const TreeDef& def, std::span<const std::string> components) {
  if (def.empty()) return std::nullopt;
  size_t pos = 0, leaf = 0;
  for (const std::string& c : components) {
    const TreeNode& n = def[pos];
    if (n.kind == NodeKind::kLeaf || n.kind == NodeKind::kNone) return std::nullopt;
    const bool named = n.kind == NodeKind::kDict || n.kind == NodeKind::kNamedTuple || n.kind == NodeKind::kDataclass;
    size_t child = n.arity;
    for (size_t j = 0; j < n.arity; ++j) {
      if (named ? (j < n.keys.size() && n.keys[j] == c) : std::to_string(j) == c) {
        child = j;
        break;
      }
    }
    if (child == n.arity) return std::nullopt;
    ++pos;
    for (size_t j = 0; j < child; ++j) pos = skip_subtree(def, pos, leaf);
    if (pos >= def.size()) return std::nullopt;
  }
  SubtreeAt at;
  at.node_begin = pos;
  at.leaf_begin = leaf;
  at.node_end = skip_subtree(def, pos, at.leaf_count);
  return at;
}

std::string escape_key(std::string_view component) {
  std::string out;
  out.reserve(component.size());
  for (char c : component) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

std::string join_key_path(const std::vector<std::string>& components) {
  std::string out;
  for (size_t i = 0; i < components.size(); ++i) {
    if (i) out += '/';
    out += escape_key(components[i]);
  }
  return out;
}

std::vector<std::string> split_key_path(std::string_view key_path) {
  std::vector<std::string> out;
  if (key_path.empty()) return out;
  std::string cur;
  for (size_t i = 0; i < key_path.size(); ++i) {
    char c = key_path[i];
    if (c == '/') {
      out.push_back(std::move(cur));
      cur.clear();
    } else if (c == '~') {
      if (i + 1 >= key_path.size() || (key_path[i + 1] != '0' && key_path[i + 1] != '1'))
        throw Error(ErrorCode::kInvalidArgument, "", std::string(key_path),
                    "'~' in a key path must be followed by 0 or 1 (RFC 6901 escaping)");
      cur += key_path[++i] == '0' ? '~' : '/';
    } else {
      cur += c;
    }
  }
  out.push_back(std::move(cur));
  return out;
}

}  // namespace treecask
