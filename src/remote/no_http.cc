// open_url for a build without libcurl (TREECASK_WITH_CURL=OFF, as the
// Python package is built: it reads URLs through obstore, a Source of its
// own, and sets it with set_url_opener for the tool it runs): every URL is
// refused, naming it (redacted), never taken for a local path; a malformed
// one, or one of another scheme, with parse_url's error (remote.h).
#include "treecask/remote.h"

namespace treecask {

std::shared_ptr<Source> open_url(const std::string& url, const RemoteOptions&) {
  parse_url(url);  // the URL's own errors first, as the libcurl build reports them
  throw Error(ErrorCode::kUnsupported, redact_url(url), "",
              "this build of treecask has no built-in HTTP source (configured with TREECASK_WITH_CURL=OFF, "
              "as the Python package is); read URLs from Python (treecask.open, treecask.load: obstore) or "
              "with the `treecask` command pip installs, build the tool with CMake and libcurl, or, in C++, "
              "open the object through a Source (Archive::open(std::shared_ptr<const Source>)) or "
              "set_url_opener");
}

}  // namespace treecask
