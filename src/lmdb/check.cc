#include "lmdb/check.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <span>
#include <unordered_set>
#include <utility>
#include <vector>

#include "util/coding.h"

namespace treecask::lmdb {

namespace {

using Key = std::span<const std::byte>;

// LMDB's default key order (mdb_cmp_memn): bytewise, then shorter first.
int compare_keys(Key a, Key b) {
  size_t n = std::min(a.size(), b.size());
  if (n != 0)
    if (int c = std::memcmp(a.data(), b.data(), n); c != 0) return c;
  return a.size() < b.size() ? -1 : a.size() > b.size() ? 1 : 0;
}

// A printable form of a database name taken from the file.
std::string printable(Key k) {
  std::string out;
  for (size_t i = 0; i < k.size() && i < 64; ++i) {
    auto c = static_cast<unsigned char>(k[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (k.size() > 64) out += "...";
  return out;
}

std::string hex(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%x", v);
  return buf;
}

struct Defect {
  std::string why;
};

class Walker {
 public:
  Walker(const FileReader& file, const MetaInfo& meta, StructureStats& stats, bool read_heads)
      : file_(file), read_heads_(read_heads), psize_(meta.page_size), last_(meta.last_page), stats_(stats) {}

  struct Named {
    std::string name;
    DbRecord db;
  };

  // Walks one database's B-tree. The main DB's named-database records are
  // collected into `named` for the caller to walk next.
  // `name` is the named database's name ("" for the main DB).
  void walk(const DbRecord& db, const std::string& what, const std::string& name, bool is_main,
            std::vector<Named>* named) {
    what_ = &what;
    name_ = &name;
    is_main_ = is_main;
    named_ = named;
    if (db.root == kInvalidPage) {
      if (db.depth != 0 || db.branch_pages != 0 || db.leaf_pages != 0 || db.overflow_pages != 0 ||
          db.entries != 0)
        fail("an empty tree (root P_INVALID) has non-zero depth or page/entry counts");
      return;
    }
    if (db.depth < 1 || db.depth > kMaxTreeDepth)
      fail("tree depth " + std::to_string(db.depth) + " is outside [1, 32]");
    depth_ = db.depth;
    count_ = {};
    while (bufs_.size() <= depth_) bufs_.emplace_back(psize_);
    visit(db.root, 1, std::nullopt, std::nullopt);
    auto mismatch = [&](const char* field, uint64_t recorded, uint64_t found) {
      if (recorded != found)
        fail(std::string(field) + " is " + std::to_string(recorded) + " but the tree has " +
             std::to_string(found));
    };
    mismatch("md_branch_pages", db.branch_pages, count_.branch);
    mismatch("md_leaf_pages", db.leaf_pages, count_.leaf);
    mismatch("md_overflow_pages", db.overflow_pages, count_.overflow);
    mismatch("md_entries", db.entries, count_.entries);
  }

  // After every tree: overflow runs and tree pages must not share a page.
  void check_overlaps() {
    std::sort(extents_.begin(), extents_.end());
    for (size_t i = 1; i < extents_.size(); ++i)
      if (extents_[i].first < extents_[i - 1].second)
        throw Defect{"page " + std::to_string(extents_[i].first) +
                     " is used twice (an overflow run overlaps another run or a tree page)"};
  }

 private:
  struct Count {
    uint64_t branch = 0, leaf = 0, overflow = 0, entries = 0;
  };

  [[noreturn]] void fail(const std::string& why) const { throw Defect{*what_ + ": " + why}; }
  [[noreturn]] void fail_page(uint64_t pgno, const std::string& why) const {
    fail("page " + std::to_string(pgno) + ": " + why);
  }

  void read(uint64_t pgno, std::byte* buf, size_t n) {
    if (std::string why = file_.read(pgno * psize_, buf, n); !why.empty()) fail_page(pgno, why);
    ++stats_.pages_read;
  }

  // A page number that a tree or a node refers to: a data page of this snapshot.
  void check_pgno(uint64_t pgno, uint64_t from) const {
    if (pgno < kFirstDataPage || pgno > last_)
      fail_page(from, "refers to page " + std::to_string(pgno) + ", outside [2, " +
                          std::to_string(last_) + "]");
  }

  void visit(uint64_t pgno, unsigned level, std::optional<Key> lo, std::optional<Key> hi) {
    if (pgno < kFirstDataPage || pgno > last_)
      fail("root page " + std::to_string(pgno) + " is outside [2, " + std::to_string(last_) + "]");
    if (!seen_.insert(pgno).second)
      fail_page(pgno, "reached twice (a cycle or a shared subtree)");
    extents_.emplace_back(pgno, pgno + 1);
    ++stats_.tree_pages;

    std::byte* p = bufs_[level].data();
    read(pgno, p, psize_);
    using coding::get_u16, coding::get_u64;
    if (get_u64(p) != pgno)
      fail_page(pgno, "header says it is page " + std::to_string(get_u64(p)));
    uint16_t flags = get_u16(p + kPageFlagsOffset) & ~(kPageDirty | kPageKeep);
    bool is_leaf = level == depth_;
    uint16_t want = is_leaf ? kPageLeaf : kPageBranch;
    if (flags != want)
      fail_page(pgno, "flags 0x" + hex(flags) + ", expected a " +
                          (is_leaf ? "leaf" : "branch") + " page at level " +
                          std::to_string(level) + " of " + std::to_string(depth_));
    size_t lower = get_u16(p + 12), upper = get_u16(p + 14);
    if (lower < kPageHeaderSize || (lower - kPageHeaderSize) % 2 != 0 || lower > upper ||
        upper > psize_)
      fail_page(pgno, "bad bounds lower " + std::to_string(lower) + ", upper " +
                          std::to_string(upper));
    size_t nkeys = (lower - kPageHeaderSize) / 2;
    if (nkeys < (is_leaf ? 1u : 2u))
      fail_page(pgno, std::to_string(nkeys) + " nodes on a " + (is_leaf ? "leaf" : "branch") +
                          " page");
    if (is_leaf) {
      ++count_.leaf;
      count_.entries += nkeys;
    } else {
      ++count_.branch;
    }

    // Nodes: inside the page, keys in order and inside [lo, hi).
    struct Node {
      uint64_t child;
      Key key;
    };
    std::vector<Node> children;
    if (!is_leaf) children.reserve(nkeys);
    std::optional<Key> prev;
    for (size_t i = 0; i < nkeys; ++i) {
      size_t off = get_u16(p + kPageHeaderSize + 2 * i);
      std::string at = "node " + std::to_string(i) + ": ";
      if (off < upper || off % 2 != 0 || off + kNodeHeaderSize > psize_)
        fail_page(pgno, at + "offset " + std::to_string(off) + " is outside the node area [" +
                            std::to_string(upper) + ", " + std::to_string(psize_) + ")");
      const std::byte* node = p + off;
      uint32_t lo16 = get_u16(node), hi16 = get_u16(node + 2);
      uint16_t nflags = get_u16(node + 4);
      size_t ksize = get_u16(node + 6);
      size_t key_end = off + kNodeHeaderSize + ksize;
      if (key_end > psize_) fail_page(pgno, at + "key runs past the end of the page");
      Key key(node + kNodeHeaderSize, ksize);
      // A branch page's first key is never compared by LMDB (it stands for
      // "everything below the second key"), so it is not ordered.
      if (is_leaf || i > 0) {
        if (prev && compare_keys(*prev, key) >= 0)
          fail_page(pgno, at + "keys are not in increasing order");
        if (lo && compare_keys(key, *lo) < 0)
          fail_page(pgno, at + "key sorts before its parent's separator");
        if (hi && compare_keys(key, *hi) >= 0)
          fail_page(pgno, at + "key sorts after its parent's next separator");
        prev = key;
      }
      if (!is_leaf) {
        uint64_t child = lo16 | uint64_t{hi16} << 16 | uint64_t{nflags} << 32;
        check_pgno(child, pgno);
        children.push_back({child, key});
        continue;
      }
      uint32_t dsize = lo16 | hi16 << 16;
      if (nflags & kNodeDupData) fail_page(pgno, at + "F_DUPDATA (sorted duplicates) is not used");
      if (nflags & ~(kNodeBigData | kNodeSubData | kNodeDupData))
        fail_page(pgno, at + "unknown node flags 0x" + hex(nflags));
      if (nflags & kNodeSubData) {
        if (!is_main_) fail_page(pgno, at + "F_SUBDATA outside the main DB");
        if (nflags & kNodeBigData) fail_page(pgno, at + "F_SUBDATA together with F_BIGDATA");
        if (dsize != kDbRecordSize || key_end + dsize > psize_)
          fail_page(pgno, at + "named-database record is not 48 bytes inside the page");
        if (ksize == 0) fail_page(pgno, at + "named database with an empty name");
        named_->push_back({std::string(reinterpret_cast<const char*>(key.data()), key.size()),
                           decode_db_record(p + key_end)});
        continue;
      }
      if (!(nflags & kNodeBigData)) {
        if (key_end + dsize > psize_) fail_page(pgno, at + "value runs past the end of the page");
        record(key, pgno * psize_ + key_end, dsize, UINT64_MAX);
        continue;
      }
      if (key_end + 8 > psize_) fail_page(pgno, at + "overflow page number runs past the page");
      const uint64_t first = get_u64(p + key_end);
      check_overflow(pgno, at, first, dsize);
      record(key, first * psize_ + kOverflowDataOffset, dsize, first);
    }

    // Children, each bounded by its separator keys, announced to the reader
    // first (one batch of requests for a remote file).
    if (!children.empty()) {
      std::vector<uint64_t> offsets;
      offsets.reserve(children.size());
      for (const Node& c : children) offsets.push_back(c.child * psize_);
      file_.will_read(offsets, psize_);
    }
    for (size_t i = 0; i < children.size(); ++i) {
      std::optional<Key> clo = i == 0 ? lo : std::optional<Key>(children[i].key);
      std::optional<Key> chi = i + 1 < children.size() ? std::optional<Key>(children[i + 1].key) : hi;
      visit_child(children[i].child, pgno, level + 1, clo, chi);
    }
  }

  void visit_child(uint64_t child, uint64_t parent, unsigned level, std::optional<Key> lo,
                   std::optional<Key> hi) {
    if (seen_.count(child))
      fail_page(parent, "child page " + std::to_string(child) +
                            " is reached twice (a cycle or a shared subtree)");
    visit(child, level, lo, hi);
  }

  void record(Key key, uint64_t offset, uint64_t size, uint64_t overflow_page) {
    if (!stats_.record_values || is_main_ || (!stats_.record_only.empty() && *name_ != stats_.record_only)) return;
    stats_.values.push_back({*name_, std::string(reinterpret_cast<const char*>(key.data()), key.size()), offset,
                             size, overflow_page});
  }

  // The run of pages an F_BIGDATA value occupies: bounds and the first page's
  // header only, never the data pages.
  void check_overflow(uint64_t pgno, const std::string& at, uint64_t first, uint32_t dsize) {
    check_pgno(first, pgno);
    uint64_t need = (kPageHeaderSize - 1 + uint64_t{dsize}) / psize_ + 1;  // OVPAGES
    uint64_t room = last_ - first + 1;
    if (need > room)
      fail_page(pgno, at + "value of " + std::to_string(dsize) + " bytes at page " +
                          std::to_string(first) + " runs past the last page");
    // The page header, unless the caller checks it itself before using the
    // value. Counted and checked for overlap by the pages the value needs
    // (OVPAGES, SPEC.md S4 and S10), whatever the header's mp_pages says.
    const uint64_t pages = need;
    if (read_heads_) {
      std::array<std::byte, kPageHeaderSize> head;
      read(first, head.data(), head.size());
      if (std::string why = check_overflow_head(head, first, dsize, psize_, last_); !why.empty())
        fail_page(pgno, at + "overflow page " + std::to_string(first) + " " + why);
    }
    extents_.emplace_back(first, first + pages);
    stats_.overflow_starts.push_back(first);
    count_.overflow += pages;
    ++stats_.overflow_runs;
    stats_.overflow_pages += pages;
  }

  const FileReader& file_;
  bool read_heads_ = true;
  uint64_t psize_;
  uint64_t last_;
  StructureStats& stats_;
  std::vector<std::vector<std::byte>> bufs_;  // one page buffer per tree level (index 1..depth)
  std::unordered_set<uint64_t> seen_;         // tree pages of every database
  std::vector<std::pair<uint64_t, uint64_t>> extents_;  // [first, end) of every used page range
  const std::string* what_ = nullptr;
  const std::string* name_ = nullptr;
  bool is_main_ = false;
  std::vector<Named>* named_ = nullptr;
  unsigned depth_ = 0;
  Count count_;
};

}  // namespace

bool StructureStats::starts_overflow_run(uint64_t pgno) const {
  return std::binary_search(overflow_starts.begin(), overflow_starts.end(), pgno);
}

std::string check_overflow_head(std::span<const std::byte> head, uint64_t first, uint64_t value_size,
                                uint64_t page_size, uint64_t last_page) {
  using coding::get_u16, coding::get_u32, coding::get_u64;
  const std::byte* h = head.data();
  if (head.size() < kPageHeaderSize || first > last_page) return "lies outside the file";
  const uint64_t need = (kPageHeaderSize - 1 + value_size) / page_size + 1;  // OVPAGES
  const uint64_t room = last_page - first + 1;
  if (get_u64(h) != first) return "has a header for page " + std::to_string(get_u64(h));
  uint16_t flags = get_u16(h + kPageFlagsOffset) & ~(kPageDirty | kPageKeep);
  if (flags != kPageOverflow) return "has flags 0x" + hex(flags);
  uint64_t pages = get_u32(h + 12);
  if (pages < need || pages > room)
    return "claims " + std::to_string(pages) + " pages; the value needs " + std::to_string(need) + " and " +
           std::to_string(room) + " remain";
  return {};
}

std::string FdReader::read(uint64_t offset, std::byte* buf, size_t n) const {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd_, buf + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return "unexpected end of file";
    if (r < 0) return std::string("read failed: ") + std::strerror(errno);
    done += static_cast<size_t>(r);
  }
  return {};
}

std::string check_structure(const FileReader& file, uint64_t file_size, const MetaInfo& meta,
                            StructureStats* stats, bool* not_archive, bool read_overflow_heads) {
  if (not_archive) *not_archive = false;
  StructureStats local;
  StructureStats& st = stats ? *stats : local;
  const bool record_values = st.record_values;
  std::string record_only = std::move(st.record_only);
  st = {};
  st.record_values = record_values;
  st.record_only = std::move(record_only);
  if (meta.page_size < 512 || meta.page_size > 65536 ||
      (meta.page_size & (meta.page_size - 1)) != 0 || meta.last_page < 1 ||
      meta.last_page >= (uint64_t{1} << 40) || (meta.last_page + 1) * meta.page_size > file_size)
    return "LMDB meta page not checked (page size or last page out of range)";
  if (meta.main_db.flags != 0) {
    if (not_archive) *not_archive = true;
    return "LMDB main database has flags 0x" + hex(meta.main_db.flags) +
           " (treecask writes 0)";
  }
  try {
    Walker w(file, meta, st, read_overflow_heads);
    std::vector<Walker::Named> named;
    const std::string main_name = "LMDB main DB", no_name;
    w.walk(meta.main_db, main_name, no_name, true, &named);
    st.named_dbs = named.size();
    for (const auto& n : named) {
      std::string what = "LMDB database '" + printable(std::as_bytes(std::span(n.name))) + "'";
      if (n.db.flags != 0)
        return what + ": flags 0x" + hex(n.db.flags) + " (treecask writes 0)";
      w.walk(n.db, what, n.name, false, nullptr);
    }
    w.check_overlaps();
    std::sort(st.overflow_starts.begin(), st.overflow_starts.end());
  } catch (const Defect& d) {
    return d.why;
  }
  return {};
}

// ---- the meta pages (layout: lmdb_layout.h) ----
namespace {

struct RawMeta {
  bool ok = false;
  std::string why;
  uint32_t magic = 0, version = 0, psize = 0;
  uint64_t mapsize = 0, last_pg = 0, txnid = 0;
  DbRecord main_db;
};

RawMeta read_meta(const FileReader& file, uint64_t offset, uint64_t file_size) {
  RawMeta m;
  std::array<std::byte, kMetaEnd> buf{};
  if (offset + kMetaEnd > file_size) {
    m.why = "file too short for an LMDB meta page (truncated?)";
    return m;
  }
  if (std::string why = file.read(offset, buf.data(), buf.size()); !why.empty()) {
    m.why = "cannot read LMDB meta page: " + why;
    return m;
  }
  using coding::get_u16, coding::get_u32, coding::get_u64;
  const std::byte* p = buf.data();
  uint16_t flags = get_u16(p + kPageFlagsOffset);
  const std::byte* meta = p + kPageHeaderSize;
  m.magic = get_u32(meta + kMetaMagicOffset);
  m.version = get_u32(meta + kMetaVersionOffset);
  m.mapsize = get_u64(meta + kMetaMapSizeOffset);
  m.psize = get_u32(meta + kMetaDbsOffset);  // dbs[0].md_pad
  m.last_pg = get_u64(meta + kMetaLastPageOffset);
  m.txnid = get_u64(meta + kMetaTxnIdOffset);
  m.main_db = decode_db_record(meta + kMetaDbsOffset + kDbRecordSize);
  if (m.magic != kMetaMagic) { m.why = "no LMDB magic"; return m; }
  if (!(flags & kPageMeta)) { m.why = "meta page lacks the P_META flag"; return m; }
  if (m.version != kDataVersion) {
    m.why = "LMDB data version " + std::to_string(m.version) + ", expected 1";
    return m;
  }
  if (m.psize < 512 || m.psize > 65536 || (m.psize & (m.psize - 1)) != 0) {
    m.why = "LMDB page size " + std::to_string(m.psize) + " is not a power of two in [512, 65536]";
    return m;
  }
  m.ok = true;
  return m;
}
}  // namespace

std::string check_meta_pages(const FileReader& file, uint64_t file_size, MetaInfo* out, bool* not_lmdb) {
  *not_lmdb = false;
  RawMeta m0 = read_meta(file, 0, file_size);
  if (!m0.ok) {
    *not_lmdb = m0.magic != kMetaMagic;
    return "meta page 0: " + m0.why;
  }
  RawMeta m1 = read_meta(file, m0.psize, file_size);
  if (!m1.ok) return "meta page 1: " + m1.why;
  if (m1.psize != m0.psize) return "the two LMDB meta pages disagree on the page size";
  const RawMeta& m = m1.txnid > m0.txnid ? m1 : m0;
  // Pages 0 and 1 are the metas; data needs at least root pages beyond them.
  if (m.last_pg < 1 || m.last_pg >= (uint64_t{1} << 40))
    return "LMDB last page number " + std::to_string(m.last_pg) + " is out of range";
  uint64_t need = (m.last_pg + 1) * m.psize;
  if (need > file_size)
    return "file is truncated: LMDB needs " + std::to_string(need) + " bytes, file has " +
           std::to_string(file_size);
  out->page_size = m.psize;
  out->last_page = m.last_pg;
  out->txnid = m.txnid;
  out->map_size = m.mapsize;
  out->main_db = m.main_db;
  return {};
}

}  // namespace treecask::lmdb
