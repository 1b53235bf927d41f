// Reading NumPy .npz files (np.savez / np.savez_compressed): a zip archive of
// one .npy member per array, stored or deflated, read through libzip.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "npy.h"
#include "treecask/writer.h"

namespace treecask::interop {

struct NpzMember {
  std::string key;  // member name without the ".npy" suffix, as np.load gives it
  NpyArray array;   // data points into the owning NpzFile
};

// The arrays of an .npz, decoded into memory (libzip offers no way to find a
// stored member's bytes inside the file, so even stored members are copied
// out: the whole .npz's array bytes are held at once). Move-only.
class NpzFile {
 public:
  // Reads every member in central-directory order (the order np.savez wrote
  // them). Each member's CRC-32 and sizes are checked by libzip, and a
  // member's declared size is checked against the deflate ratio limit before
  // anything is allocated. Throws Error(kNotFound) for a missing file;
  // Error(kCorruption, path, member) for damage: a file that is not a zip, a
  // damaged zip directory or member (CRC, sizes, inflate), a member's size
  // beyond deflate's ratio, a damaged .npy (see parse_npy);
  // Error(kInvalidArgument, path, member) for a valid file it does not take:
  // an encrypted member or a compression method libzip lacks, a member not
  // named "*.npy", a .npy parse_npy refuses; Error(kIo) when reading fails.
  static NpzFile read(const std::filesystem::path& path);

  const std::vector<NpzMember>& members() const noexcept { return members_; }

 private:
  std::vector<std::vector<std::byte>> buffers_;
  std::vector<NpzMember> members_;
};

// `treecask import` of a .npz: every member of `input` (NpzFile::read) into the
// archive `output` as a flat dict keyed by member name, in central-directory
// order, each leaf the member's dtype, shape and C-order bytes; saved with
// `options` (treecask::save). Throws what NpzFile::read and save() throw.
SaveStats import_npz(const std::filesystem::path& input, const std::filesystem::path& output,
                     const SaveOptions& options);

}  // namespace treecask::interop
