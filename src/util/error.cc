#include "treecask/error.h"

namespace treecask {

std::string_view error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kNotAnArchive: return "not an archive";
    case ErrorCode::kUnsupportedVersion: return "unsupported version";
    case ErrorCode::kCorruption: return "corruption";
    case ErrorCode::kChecksumMismatch: return "checksum mismatch";
    case ErrorCode::kKeyNotFound: return "key not found";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kShapeMismatch: return "shape mismatch";
    case ErrorCode::kIo: return "I/O error";
    case ErrorCode::kAlreadyExists: return "already exists";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kSignature: return "signature";
  }
  return "unknown error";
}

namespace {
std::string compose(ErrorCode code, const std::string& file, const std::string& key_path,
                    const std::string& message) {
  std::string s = file.empty() ? std::string("<no file>") : file;
  if (!key_path.empty()) s += ": " + key_path;
  s += ": ";
  s += error_code_name(code);
  s += ": " + message;
  return s;
}
}  // namespace

Error::Error(ErrorCode code, std::string file, std::string key_path, std::string message)
    : std::runtime_error(compose(code, file, key_path, message)),
      code_(code),
      file_(std::move(file)),
      key_path_(std::move(key_path)),
      message_(std::move(message)) {}

}  // namespace treecask
