// Value types shared by the writer and the reader: dtypes, the treedef,
// sharding annotations and the description of one leaf.
//
// Numeric values of every enum are part of the file format (SPEC.md "Dtypes",
// "Treedef") and never change.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "treecask/export.h"

namespace treecask {

// Element type of a leaf (SPEC.md "Dtypes"). The sub-byte dtypes (int2,
// uint2, int4, uint4, float4_e2m1fn: 2 or 4 bits; float6_*: 6 bits) are
// packed: element k occupies bits [k * bits, (k + 1) * bits) of the leaf's
// bytes read as one little-endian bit stream (bit i is bit i % 8 of byte
// i / 8), so int4 element 2k is the low nibble of byte k (the JAX/XLA
// layout). Values 20-30 are format 4.0.
enum class DType : uint8_t {
  kBool = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kUInt8 = 6,
  kUInt16 = 7,
  kUInt32 = 8,
  kUInt64 = 9,
  kFloat16 = 10,
  kBFloat16 = 11,
  kFloat32 = 12,
  kFloat64 = 13,
  kComplex64 = 14,
  kComplex128 = 15,
  kFloat8E4M3FN = 16,
  kFloat8E5M2 = 17,
  kInt4 = 18,
  kUInt4 = 19,
  // Format 4.0 (safetensors 0.8 and ml_dtypes 0.5+ dtypes):
  kFloat4E2M1FN = 20,    // 4 bits, packed: safetensors F4
  kFloat6E2M3FN = 21,    // 6 bits, packed: safetensors F6_E2M3
  kFloat6E3M2FN = 22,    // 6 bits, packed: safetensors F6_E3M2
  kFloat8E8M0FNU = 23,   // safetensors F8_E8M0 (the MX scale type)
  kFloat8E4M3FNUZ = 24,  // safetensors F8_E4M3FNUZ
  kFloat8E5M2FNUZ = 25,  // safetensors F8_E5M2FNUZ
  kInt2 = 26,            // 2 bits, packed
  kUInt2 = 27,           // 2 bits, packed
  kFloat8E3M4 = 28,
  kFloat8E4M3 = 29,      // IEEE-like (has infinities); not float8_e4m3fn
  kFloat8E4M3B11FNUZ = 30,
};

// The highest DType value this library knows; a file carrying a larger one
// is refused as unsupported (SPEC.md "Dtypes").
inline constexpr uint8_t kMaxDType = 30;
// The first DType value of format 4.0: a leaf of this dtype or later needs a
// file of format 4.0 or later.
inline constexpr uint8_t kFirstDTypeOf4 = 20;

// Name as NumPy / ml_dtypes spell it: "bool", "int8", ..., "bfloat16",
// "float8_e4m3fn", "int4". Returns "invalid" for a value outside the enum.
TREECASK_API std::string_view dtype_name(DType dtype) noexcept;
// Inverse of dtype_name; std::nullopt for an unknown name.
TREECASK_API std::optional<DType> dtype_from_name(std::string_view name) noexcept;
// Bits per element: 2 for int2/uint2, 4 for int4/uint4/float4_e2m1fn, 6 for
// float6_*, 8 for bool, 8*itemsize otherwise; 0 if invalid.
TREECASK_API int dtype_bits(DType dtype) noexcept;
// True for a value inside the enum.
TREECASK_API bool dtype_valid(uint8_t value) noexcept;

// True for the packed sub-byte dtypes (dtype_bits < 8).
TREECASK_API bool dtype_packed(DType dtype) noexcept;

// Bytes that `shape` elements of `dtype` occupy: ceil(prod(shape) * bits / 8).
// Throws Error(kInvalidArgument) for a negative dim, an invalid dtype or an
// element count whose bits, prod(shape) * bits, exceed 2^63 (SPEC.md check 28).
TREECASK_API uint64_t byte_length_for(DType dtype, std::span<const int64_t> shape);

// Packs `elems` of a packed sub-byte `dtype` (one element per byte, as
// ml_dtypes holds them; the value in the low dtype_bits bits, the high bits
// ignored) into `out` as the file stores them (SPEC.md "Dtypes"): element k
// at bits [k * bits, (k + 1) * bits) of the little-endian bit stream, the
// padding bits of the last byte zero. REQUIRES dtype_packed(dtype) and
// out.size() == ceil(elems.size() * bits / 8), else Error(kInvalidArgument).
// Reading unpacks the other way (Archive::read_slice).
TREECASK_API void pack_elements(DType dtype, std::span<const std::byte> elems, std::span<std::byte> out);

// How leaf bytes are stored (SPEC.md "Codecs").
enum class Codec : uint8_t {
  kNone = 0,  // raw: readable as a zero-copy view
  kLZ4 = 1,   // LZ4 block format per chunk
};
TREECASK_API std::string_view codec_name(Codec codec) noexcept;

// A transform of each chunk's raw bytes applied before its codec (SPEC.md
// "Filters"; format 2.0). Byte shuffle splits the bytes of each element into
// planes (all first bytes, then all second bytes, ...), as Blosc's shuffle
// does: the exponent bytes of float weights then sit together and LZ4 finds
// runs in them. Only with LZ4, on dtypes of 2, 4, 8 or 16 bytes per element.
enum class Filter : uint8_t {
  kNone = 0,
  kByteShuffle = 1,
};
TREECASK_API std::string_view filter_name(Filter filter) noexcept;  // "none", "shuffle"
// Bytes per element a byte shuffle of `dtype` works on: 2, 4, 8 or 16; 0 for
// the dtypes it cannot apply to (bool, int8, uint8, float8_*, sub-byte dtypes).
TREECASK_API unsigned shuffle_element_bytes(DType dtype) noexcept;

// What a leaf was in the program that saved it. Python scalars are stored as
// 0-d arrays (int -> int64, float -> float64, bool -> bool) and str as a 1-d
// uint8 array of its UTF-8 bytes, so that a reader can give them back as the
// same Python type (SPEC.md "Scalar leaves").
enum class ValueKind : uint8_t { kArray = 0, kInt = 1, kFloat = 2, kBool = 3, kStr = 4 };
// "array", "int", "float", "bool", "str"; "invalid" for any other value.
TREECASK_API std::string_view value_kind_name(ValueKind kind) noexcept;

// Treedef node kinds (SPEC.md "Treedef").
enum class NodeKind : uint8_t {
  kLeaf = 0,
  kNone = 1,        // Python None: no children, no leaf
  kDict = 2,        // string keys, one per child, in flatten order
  kList = 3,
  kTuple = 4,
  kNamedTuple = 5,  // type_name + field names
  kDataclass = 6,   // any node with named fields: dataclasses, eqx.Module,
                    // flax struct, Flax/Penzai boxes; type_name + field names
};
// "leaf", "none", "dict", "list", "tuple", "namedtuple", "dataclass";
// "invalid" for any other value.
TREECASK_API std::string_view node_kind_name(NodeKind kind) noexcept;

// One treedef node. A TreeDef is the nodes of the tree in pre-order; a node
// with arity n is followed by its n children's subtrees. Leaf nodes are
// numbered in that order: the i-th leaf node is leaf i.
struct TreeNode {
  NodeKind kind = NodeKind::kLeaf;
  uint32_t arity = 0;             // children count; 0 for kLeaf and kNone
  std::string type_name;          // NamedTuple / Dataclass: e.g. "optax.ScaleByAdamState"
  std::vector<std::string> keys;  // Dict keys or field names (size == arity);
                                  // empty for List / Tuple
};
using TreeDef = std::vector<TreeNode>;

// A TreeDef that is one dict of `n` leaves keyed by `keys` (in that order):
// what a safetensors file or an .npz holds.
TREECASK_API TreeDef flat_dict_treedef(const std::vector<std::string>& keys);

// Where the subtree at `components` lies in `def`: its nodes [node_begin,
// node_end) in pre-order and its leaves [leaf_begin, leaf_begin +
// leaf_count). `components` are unescaped key path components (SPEC.md "Key
// paths": dict keys, field names, decimal sequence indices); at each level
// the first child of that name is taken. std::nullopt when there is none.
// Cost: the nodes before the subtree and the subtree's own. A treedef that
// an Archive opened is well formed; on any other the walk only never reads
// past its end.
struct SubtreeAt {
  size_t node_begin = 0, node_end = 0;
  size_t leaf_begin = 0, leaf_count = 0;
};
TREECASK_API std::optional<SubtreeAt> find_subtree(const TreeDef& def, std::span<const std::string> components);

// Key paths (SPEC.md "Key paths"): the components from the root to a leaf --
// dict keys, field names, decimal sequence indices -- each escaped as in
// RFC 6901 ("~" -> "~0", "/" -> "~1") and joined with "/". The root leaf of a
// tree that is a single array has the empty key path "".
TREECASK_API std::string escape_key(std::string_view component);
TREECASK_API std::string join_key_path(const std::vector<std::string>& components);
// Throws Error(kInvalidArgument) for a bad escape sequence.
TREECASK_API std::vector<std::string> split_key_path(std::string_view key_path);

// Sharding of a leaf as JAX describes it: a mesh (axis names and sizes) and a
// PartitionSpec with, per dimension, the mesh axes that shard it (empty:
// replicated along that dimension). It is metadata: the reader reports it and
// the Python package can use it to place arrays; the bytes stored are always
// the whole (global) array.
struct Sharding {
  std::vector<std::string> mesh_axis_names;
  std::vector<int64_t> mesh_axis_sizes;
  std::vector<std::vector<std::string>> spec;
  bool operator==(const Sharding&) const = default;
};

using KeyValues = std::vector<std::pair<std::string, std::string>>;

// Where one box of a leaf lives when its bytes are kept in other archive files
// (format 3.0, SPEC.md "Sharded checkpoints"): the elements [start, stop) per
// dimension of the leaf's (global) shape are leaf `key_path` of the archive
// `file`, a file name in the same directory as the archive that holds the
// reference (no "/", not "." or ".."). That leaf has the box's shape and the
// referring leaf's dtype. A 0-d leaf has one box with empty start and stop.
struct ShardRef {
  std::string file;
  std::string key_path;
  std::vector<int64_t> start;
  std::vector<int64_t> stop;
  bool operator==(const ShardRef&) const = default;
};

// The exact shard file that the index of a sharded checkpoint was committed
// with (format 3.1 / 4.1, SPEC.md "Sharded checkpoints", R8 and R9): its name
// in the index's directory and two fields of its header record, the manifest's
// length in bytes and its XXH3-64 (seed 0). The manifest holds every chunk
// checksum of the file and its archive metadata, where the reference writer
// puts the save's random id (kSaveIdKey), so a file of another save, another
// step or another job does not match. Archive::manifest_fingerprint() gives a
// file's own.
struct ShardFile {
  std::string file;
  uint64_t manifest_length = 0;
  uint64_t manifest_checksum = 0;
  bool operator==(const ShardFile&) const = default;
};

// Archive metadata key under which the reference writers record the random
// 128-bit id (32 lowercase hex digits) of a sharded save, in the index and in
// every shard file of that save. Informative: readers compare fingerprints
// (ShardFile), and name the ids in the error when they differ.
inline constexpr std::string_view kSaveIdKey = "treecask.save_id";

// Everything the manifest says about one leaf except where its bytes lie.
struct LeafMeta {
  std::string key_path;
  ValueKind value_kind = ValueKind::kArray;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<std::string> logical_axes;  // one per dim, "" = unnamed; or empty
  std::optional<Sharding> sharding;
  KeyValues metadata;                     // user key-values for this leaf
  // Format 3.0: non-empty for a leaf of a sharded checkpoint's index archive,
  // whose bytes are the union of these boxes in other files (it then has no
  // chunks). The writer takes them from LeafInput::meta (data must then be
  // empty); the reader reports them in LeafInfo.
  std::vector<ShardRef> shards;
};

}  // namespace treecask
