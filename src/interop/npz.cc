#include "npz.h"

#include <zip.h>

#include <memory>

#include "treecask/error.h"

namespace treecask::interop {
namespace {

// Deflate cannot expand data more than 1032:1; allow some slack.
constexpr uint64_t kMaxDeflateRatio = 1100;

std::string zip_error_text(int code) {
  zip_error_t error;
  zip_error_init_with_code(&error, code);
  std::string text = zip_error_strerror(&error);
  zip_error_fini(&error);
  return text;
}

struct ZipCloser {
  void operator()(zip_t* z) const { zip_discard(z); }
};
struct ZipFileCloser {
  void operator()(zip_file_t* f) const { zip_fclose(f); }
};

}  // namespace

NpzFile NpzFile::read(const std::filesystem::path& path) {
  const std::string file = path.string();
  int code = 0;
  std::unique_ptr<zip_t, ZipCloser> zip(zip_open(file.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &code));
  if (!zip) {
    if (code == ZIP_ER_NOENT) throw Error(ErrorCode::kNotFound, file, "", "no such file");
    if (code == ZIP_ER_OPEN || code == ZIP_ER_READ) {
      throw Error(ErrorCode::kIo, file, "", "cannot read: " + zip_error_text(code));
    }
    throw Error(ErrorCode::kCorruption, file, "", "npz: " + zip_error_text(code));
  }
  NpzFile out;
  const zip_int64_t count = zip_get_num_entries(zip.get(), 0);
  for (zip_int64_t i = 0; i < count; ++i) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(zip.get(), static_cast<zip_uint64_t>(i), 0, &st) != 0) {
      throw Error(ErrorCode::kCorruption, file, "", std::string("npz: ") + zip_strerror(zip.get()));
    }
    std::string name = (st.valid & ZIP_STAT_NAME) ? st.name : "";
    if (name.size() < 4 || name.compare(name.size() - 4, 4, ".npy") != 0) {
      throw Error(ErrorCode::kInvalidArgument, file, name,
                  "npz: member is not a .npy array (name does not end in \".npy\")");
    }
    std::string key = name.substr(0, name.size() - 4);
    if ((st.valid & ZIP_STAT_ENCRYPTION_METHOD) && st.encryption_method != ZIP_EM_NONE) {
      throw Error(ErrorCode::kInvalidArgument, file, key, "npz: member is encrypted");
    }
    if (!(st.valid & ZIP_STAT_SIZE) || !(st.valid & ZIP_STAT_COMP_SIZE)) {
      throw Error(ErrorCode::kCorruption, file, key, "npz: member has no size");
    }
    if (st.size / kMaxDeflateRatio > st.comp_size + (1 << 20)) {
      throw Error(ErrorCode::kCorruption, file, key,
                  "npz: member claims " + std::to_string(st.size) + " bytes from " +
                      std::to_string(st.comp_size) + " compressed bytes, beyond deflate's limit");
    }
    std::unique_ptr<zip_file_t, ZipFileCloser> member(
        zip_fopen_index(zip.get(), static_cast<zip_uint64_t>(i), 0));
    if (!member) {
      // A compression or encryption method libzip lacks is a valid member it
      // cannot read; any other failure is damage.
      const int why = zip_error_code_zip(zip_get_error(zip.get()));
      const bool unsupported = why == ZIP_ER_COMPNOTSUPP || why == ZIP_ER_ENCRNOTSUPP;
      throw Error(unsupported ? ErrorCode::kInvalidArgument : ErrorCode::kCorruption, file, key,
                  std::string("npz: cannot open member: ") + zip_strerror(zip.get()));
    }
    std::vector<std::byte> buffer(st.size);
    uint64_t done = 0;
    while (done < st.size) {
      zip_int64_t n = zip_fread(member.get(), buffer.data() + done, st.size - done);
      if (n < 0) {
        throw Error(ErrorCode::kCorruption, file, key,
                    std::string("npz: member damaged: ") + zip_file_strerror(member.get()));
      }
      if (n == 0) break;
      done += static_cast<uint64_t>(n);
    }
    char extra;
    if (done != st.size || zip_fread(member.get(), &extra, 1) != 0) {
      throw Error(ErrorCode::kCorruption, file, key,
                  "npz: member size differs from the size the zip directory declares");
    }
    if (int rc = zip_fclose(member.release()); rc != 0) {
      throw Error(ErrorCode::kCorruption, file, key, "npz: member damaged: " + zip_error_text(rc));
    }
    out.buffers_.push_back(std::move(buffer));
    NpzMember m;
    m.key = std::move(key);
    m.array = parse_npy(out.buffers_.back(), file, m.key);
    out.members_.push_back(std::move(m));
  }
  return out;
}

SaveStats import_npz(const std::filesystem::path& input, const std::filesystem::path& output,
                     const SaveOptions& options) {
  const NpzFile npz = NpzFile::read(input);
  std::vector<std::string> keys;
  std::vector<LeafInput> leaves;
  for (const NpzMember& m : npz.members()) {
    keys.push_back(m.key);
    LeafInput leaf;
    leaf.meta.dtype = m.array.dtype;
    leaf.meta.shape = m.array.shape;
    leaf.data = m.array.data;
    leaves.push_back(std::move(leaf));
  }
  return save(output, flat_dict_treedef(keys), leaves, options);
}

}  // namespace treecask::interop
