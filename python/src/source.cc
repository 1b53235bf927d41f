// treecask._core's remote sources (include/treecask/source.h): a Python
// object as a core Source, and a Python opener of such objects as a
// SourceOpener (binding.h says what the object provides).
#include <nanobind/stl/string.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "binding.h"

namespace treecask_py {
namespace {

// The treecask::Error for a Python exception raised by a source or a source
// opener of object `file`: a treecask error (an instance with an int `code`
// and a `message`) keeps its code, message and file (`file` when it names
// none), any other is kIo with its type and text.
treecask::Error error_from_python(nb::python_error& e, const std::string& file) {
  nb::object v = nb::borrow(e.value());
  if (nb::hasattr(v, "code") && nb::isinstance<nb::int_>(v.attr("code")) && nb::hasattr(v, "message")) {
    std::string named = nb::hasattr(v, "file") ? nb::cast<std::string>(nb::str(v.attr("file"))) : "";
    return treecask::Error(static_cast<treecask::ErrorCode>(nb::cast<int>(v.attr("code"))),
                           named.empty() ? file : named, "", nb::cast<std::string>(nb::str(v.attr("message"))));
  }
  return treecask::Error(treecask::ErrorCode::kIo, file, "",
                         nb::cast<std::string>(nb::str(v.type().attr("__name__"))) + ": " +
                             nb::cast<std::string>(nb::str(v)));
}

// source_from_python's Source (binding.h).
class PySource final : public treecask::Source {
 public:
  explicit PySource(nb::object obj) : obj_(std::move(obj)) {
    name_ = nb::hasattr(obj_, "name") ? nb::cast<std::string>(obj_.attr("name"))
                                      : "<" + nb::cast<std::string>(obj_.type().attr("__name__")) + ">";
    nb::object size = obj_.attr("size");
    size_ = size.is_none() ? treecask::kUnknownSize : nb::cast<uint64_t>(size);
    if (nb::hasattr(obj_, "concurrency")) concurrency_ = std::max(nb::cast<unsigned>(obj_.attr("concurrency")), 1u);
  }
  ~PySource() override {
    if (!Py_IsInitialized()) {  // after interpreter shutdown: nothing left to release
      obj_.release();
      return;
    }
    nb::gil_scoped_acquire gil;  // the last owner may run without it
    obj_.reset();
  }
  const std::string& name() const noexcept override { return name_; }
  uint64_t size() const noexcept override { return size_.load(std::memory_order_acquire); }
  unsigned concurrency() const noexcept override { return concurrency_; }
  void read(std::span<const treecask::ReadRange> ranges) const override {
    nb::gil_scoped_acquire gil;
    try {
      nb::list offsets, lengths;
      for (const auto& r : ranges) {
        if (r.from_end)
          offsets.append(-static_cast<int64_t>(r.out.size()));
        else
          offsets.append(r.offset);
        lengths.append(r.out.size());
      }
      nb::object got = obj_.attr("read")(offsets, lengths);
      // The first read of a source that learns its size: clipped answers.
      uint64_t size = size_.load(std::memory_order_acquire);
      const bool first = size == treecask::kUnknownSize;
      if (first) {
        nb::object s = obj_.attr("size");
        if (s.is_none())
          throw treecask::Error(treecask::ErrorCode::kIo, name_, "",
                                "the source's size is still None after its first read");
        size = nb::cast<uint64_t>(s);
      }
      size_t k = 0;
      for (nb::handle item : got) {
        if (k >= ranges.size()) break;
        const treecask::ReadRange& r = ranges[k];
        size_t want = r.out.size();
        if (first)
          want = static_cast<size_t>(
              std::min<uint64_t>(want, r.from_end ? size : size - std::min<uint64_t>(r.offset, size)));
        Py_buffer view;
        if (PyObject_GetBuffer(item.ptr(), &view, PyBUF_SIMPLE) != 0) throw nb::python_error();
        const bool fits = static_cast<size_t>(view.len) == want;
        if (fits) {  // the buffer stays held; other threads run Python meanwhile
          nb::gil_scoped_release copying;
          std::memcpy(r.out.data(), view.buf, want);
        }
        const size_t got_len = static_cast<size_t>(view.len);
        PyBuffer_Release(&view);
        if (!fits)
          throw treecask::Error(treecask::ErrorCode::kCorruption, name_, "",
                                "the source returned " + std::to_string(got_len) + " bytes for a range of " +
                                    std::to_string(want));
        ++k;
      }
      if (k != ranges.size())
        throw treecask::Error(treecask::ErrorCode::kIo, name_, "", "the source returned too few ranges");
      if (first) size_.store(size, std::memory_order_release);
    } catch (nb::python_error& e) {
      throw error_from_python(e, name_);
    }
  }

 private:
  nb::object obj_;
  std::string name_;
  mutable std::atomic<uint64_t> size_{0};
  unsigned concurrency_ = 16;
};

}  // namespace

std::shared_ptr<const treecask::Source> source_from_python(nb::object obj) {
  return std::make_shared<PySource>(std::move(obj));
}

treecask::SourceOpener opener_from_python(nb::object opener) {
  return [opener](const std::string& name) -> std::shared_ptr<const treecask::Source> {
    nb::gil_scoped_acquire gil;
    try {
      return std::make_shared<PySource>(opener(name));
    } catch (nb::python_error& e) {
      throw error_from_python(e, name);
    }
  };
}

}  // namespace treecask_py
