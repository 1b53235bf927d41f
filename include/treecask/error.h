// treecask's one error model.
//
// Every failure in the library, the CLI and the Python package is a
// treecask::Error: a code (what went wrong, stable across releases), the file
// it concerns, the key path of the leaf where there is one, and a message that
// says what was expected. Success is free: functions that can fail throw, and
// functions that return have succeeded. The one exception is running out of
// memory: std::bad_alloc propagates as it is (Python: MemoryError), after the
// operation has cleaned up (a failed save leaves no temporary file and the
// previous archive intact).
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include "treecask/export.h"

namespace treecask {

// Stable error codes. The CLI's exit status is derived from these
// (docs/cli.md "Exit codes"), and the Python exception classes map 1:1.
enum class ErrorCode : int {
  kNotFound = 1,            // the file does not exist
  kNotAnArchive = 2,        // the file exists but is not a treecask archive
  kUnsupportedVersion = 3,  // a format major version this library cannot read
  kCorruption = 4,          // structure damaged or violates SPEC.md
  kChecksumMismatch = 5,    // stored bytes do not match their XXH3 checksum
  kKeyNotFound = 6,         // no leaf / subtree with this key path
  kInvalidArgument = 7,     // the caller passed something SPEC.md forbids
  kShapeMismatch = 8,       // dtype/shape/byte length disagree with what was expected
  kIo = 9,                  // the operating system refused (open, write, fsync, rename...)
  kAlreadyExists = 10,      // save without overwrite onto an existing path
  kUnsupported = 11,        // valid request the reader cannot serve this way
                            // (e.g. a zero-copy view of an LZ4 leaf)
  kSignature = 12,          // a signature (signing.h) does not verify, is not for this
                            // archive, or a signed range's SHA-256 differs
};

// Human name of a code, e.g. "corruption".
TREECASK_API std::string_view error_code_name(ErrorCode code) noexcept;

class TREECASK_API Error : public std::runtime_error {
 public:
  // file: the archive (or input file) concerned; key_path: the leaf's key
  // path in canonical form (SPEC.md "Key paths"), or empty when the error is
  // not about one leaf. what() is "<file>: <key_path>: <code name>: <message>".
  Error(ErrorCode code, std::string file, std::string key_path, std::string message);

  ErrorCode code() const noexcept { return code_; }
  const std::string& file() const noexcept { return file_; }
  const std::string& key_path() const noexcept { return key_path_; }
  const std::string& message() const noexcept { return message_; }

 private:
  ErrorCode code_;
  std::string file_;
  std::string key_path_;
  std::string message_;
};

}  // namespace treecask
