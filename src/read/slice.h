// Box plans for Archive::read_slice / read_slices / read_bytes: which source
// units of a leaf go where in a destination buffer. Pure arithmetic, no I/O.
//
// A leaf's raw bytes are its elements in C order (SPEC.md "Leaf data"). A read
// asks for a box of them (start <= i_d < stop per dimension d) written to a
// destination with given byte strides. A plan reduces that to a canonical form:
// dims with extent n[j], source stride s[j] (in source units) and destination
// stride d[j] (in bytes), C order, the last dim being the "run": a span of
// units contiguous in the source (s = 1). Units are bytes, or elements of a
// packed sub-byte dtype (SPEC.md "Dtypes": element k at bits [k * bits,
// (k + 1) * bits) of the little-endian bit stream, e.g. int4 element 2k in the
// low nibble of byte k) when a plan unpacks them to one byte per element.
//
// Adjacent dims merge where both sides are linear in the merged index, and
// extent-1 dims are dropped, so a C-contiguous destination of a row range is
// one run, and a column block of a matrix is one run per row.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "format/packing.h"

namespace treecask::slice {

struct Plan {
  // Source unit of the box's first unit (sum of start[d] * source stride).
  uint64_t base = 0;
  // One past the source unit of the box's last unit: [base, end) spans the box.
  uint64_t end = 0;
  std::vector<uint64_t> n;  // extents; n.back() is the run length in units
  std::vector<uint64_t> s;  // source strides in units; s.back() == 1
  std::vector<int64_t> d;   // destination strides in bytes
  std::byte* origin = nullptr;  // destination address of unit (0, ..., 0)
  bool unpack = false;          // units are packed elements written as one byte each
  unsigned bits = 8;            // bits per unit when unpacking: 2, 4 or 6
  bool empty() const { return n.empty(); }
  uint64_t run() const { return n.back(); }
};

// A position in a plan: the run index (over every dim but the last) and the
// run's source unit and destination offset (bytes from origin).
struct Cursor {
  std::vector<uint64_t> i;  // one index per dim but the run dim
  uint64_t src = 0;
  int64_t dst = 0;
  bool done = true;
};

// Appends a dim (extent n, source stride s, destination stride d) before
// canonicalize(), outermost first.
inline void push_dim(Plan& p, uint64_t n, uint64_t s, int64_t d) {
  p.n.push_back(n);
  p.s.push_back(s);
  p.d.push_back(d);
}

// Finishes a plan from full dims (outermost first, the unit dim last): drops
// extent-1 dims but the last, then merges from the innermost outward.
inline void canonicalize(Plan& p) {
  std::vector<uint64_t> n, s;
  std::vector<int64_t> d;
  size_t k = p.n.size();
  for (size_t j = 0; j < k; ++j) {
    if (p.n[j] == 1 && j + 1 < k) continue;
    n.push_back(p.n[j]);
    s.push_back(p.s[j]);
    d.push_back(p.d[j]);
  }
  // Merge from the inside out: (outer j, inner j+1) -> one dim of stride (s, d) of the inner.
  std::vector<uint64_t> rn{n.back()}, rs{s.back()};
  std::vector<int64_t> rd{d.back()};
  for (size_t j = n.size() - 1; j-- > 0;) {
    uint64_t in_n = rn.back(), in_s = rs.back();
    int64_t in_d = rd.back();
    if (s[j] == in_n * in_s && d[j] == static_cast<int64_t>(in_n) * in_d) {
      rn.back() = n[j] * in_n;
      continue;
    }
    rn.push_back(n[j]);
    rs.push_back(s[j]);
    rd.push_back(d[j]);
  }
  p.n.assign(rn.rbegin(), rn.rend());
  p.s.assign(rs.rbegin(), rs.rend());
  p.d.assign(rd.rbegin(), rd.rend());
  uint64_t last = p.base;
  for (size_t j = 0; j < p.n.size(); ++j) last += (p.n[j] - 1) * p.s[j];
  p.end = last + 1;
}

// The first run of `p` that ends after source unit `x` (so the run holding x,
// or the next one after it); cursor.done when there is none.
inline Cursor first_run_after(const Plan& p, uint64_t x) {
  Cursor c;
  size_t m = p.n.size() - 1;  // outer dims
  c.i.assign(m, 0);
  c.done = false;
  auto carry = [&](size_t j) {  // increments dim j - 1 (j >= 1), zeroing j..m-1
    for (size_t t = j; t < m; ++t) c.i[t] = 0;
    for (size_t t = j; t-- > 0;) {
      if (++c.i[t] < p.n[t]) return true;
      c.i[t] = 0;
    }
    return false;
  };
  if (x > p.base) {
    uint64_t rel = x - p.base;
    bool placed = true;
    for (size_t j = 0; j < m; ++j) {
      c.i[j] = rel / p.s[j];
      rel %= p.s[j];
      if (c.i[j] >= p.n[j]) {
        placed = false;
        if (!carry(j)) c.done = true;
        break;
      }
    }
    if (placed && rel >= p.n[m] && !carry(m)) c.done = true;
  }
  if (c.done) return c;
  c.src = p.base;
  c.dst = 0;
  for (size_t j = 0; j < m; ++j) {
    c.src += c.i[j] * p.s[j];
    c.dst += static_cast<int64_t>(c.i[j]) * p.d[j];
  }
  return c;
}

// Moves `c` to the next run in C order.
inline void next_run(const Plan& p, Cursor& c) {
  for (size_t j = c.i.size(); j-- > 0;) {
    c.src += p.s[j];
    c.dst += p.d[j];
    if (++c.i[j] < p.n[j]) return;
    c.src -= p.n[j] * p.s[j];
    c.dst -= static_cast<int64_t>(p.n[j]) * p.d[j];
    c.i[j] = 0;
  }
  c.done = true;
}

// Calls fn(run source unit, run destination offset, lo, hi) for every run
// overlapping source units [a, b), lo/hi the overlap as units from the run's start.
template <typename Fn>
void for_each_piece(const Plan& p, uint64_t a, uint64_t b, Fn&& fn) {
  if (p.empty() || b <= p.base || a >= p.end) return;
  for (Cursor c = first_run_after(p, a); !c.done && c.src < b; next_run(p, c)) {
    uint64_t lo = std::max(a, c.src) - c.src;
    uint64_t hi = std::min(b, c.src + p.run()) - c.src;
    fn(c.src, c.dst, lo, hi);
  }
}

// Packed sub-byte elements (format/packing.h): read_slice unpacks with these.
using packing::group_elements;
using packing::unpack;

}  // namespace treecask::slice
