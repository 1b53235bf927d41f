// Object URLs of the built-in remote source (include/treecask/remote.h):
// which HTTP(S) request reads s3://, gs://, http:// and https:// objects
// (parse_url, remote.h, takes every URL apart first), with
// which endpoint, headers and credentials (RemoteOptions and the environment);
// and the parsing of the response header values the source checks.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "treecask/remote.h"

namespace treecask::remote {

// How requests to an object are made and checked.
enum class Service {
  kHttp,     // http(s):// as given
  kS3,       // S3 or an S3-compatible store (path- or virtual-hosted-style)
  kGcs,      // storage.googleapis.com (XML API)
  kGcsJson,  // a GCS emulator's JSON API (STORAGE_EMULATOR_HOST): ...?alt=media
};

// An object URL resolved to the HTTP request that reads it.
struct Endpoint {
  // The URL as given, for errors and Source::name(): a password in
  // user:password@ and credential query parameters (X-Amz-Signature,
  // X-Amz-Security-Token, ...) replaced by "***".
  std::string name;
  Service service = Service::kHttp;
  // The bucket of s3:// and gs:// URLs (for "no such bucket" errors).
  std::string bucket;
  // The http:// or https:// URL every GET goes to.
  std::string url;
  // Request headers ("Name: value") sent with every request. May hold a
  // secret (a bearer or session token): never print them.
  std::vector<std::string> headers;
  // CURLOPT_AWS_SIGV4 ("aws:amz:<region>:s3"), empty for unsigned requests,
  // and the key pair it signs with (the secret: never print it).
  std::string aws_sigv4;
  std::string access_key_id;
  std::string secret_access_key;
  // A file of CA certificates (PEM) to verify https:// servers with, from
  // AWS_CA_BUNDLE (s3://), CURL_CA_BUNDLE or SSL_CERT_FILE; "" for the
  // system's.
  std::string ca_bundle;
  // Which credentials an "access denied" error should point at.
  std::string credentials_hint;
  // Whether redirects are followed (http(s):// only: a signed request or
  // one with a token is never sent to another host).
  bool follow_redirects = false;
};

// The scheme of `s` ("s3" for "s3://b/k"), lower-cased, or "" when `s` does
// not start with <letter>[letter digit + . -]*://.
std::string url_scheme(std::string_view s);

// Percent-encodes every byte of `s` except the RFC 3986 unreserved characters
// A-Z a-z 0-9 - . _ ~ (and '/' when `keep_slash`), as S3's SigV4 canonical
// URI and GCS object names require: "a b/c" -> "a%20b/c".
std::string percent_encode(std::string_view s, bool keep_slash);


// The Source of the object at `url`: the opener set by set_url_opener
// (remote.h), else open_url(url).
std::shared_ptr<const Source> open_object(const std::string& url);

// Resolves `url` (taken apart by parse_url, remote.h: the one URL rule) with
// `options` and the environment (remote.h). Throws parse_url's errors,
// Error(kUnsupported) for az:// (the Python package's transport serves it,
// this one does not), Error(kInvalidArgument) for an unknown storage_options
// key, half a key pair, or an endpoint without http:// or https://. The
// Error names the redacted URL.
Endpoint resolve(const std::string& url, const RemoteOptions& options);

// ---- Response header values ----

// ASCII case-insensitive equality, and search.
bool iequals(std::string_view a, std::string_view b);
bool contains_nocase(std::string_view haystack, std::string_view needle);

// `s` without leading and trailing blanks (space, tab, CR, LF).
std::string_view trim(std::string_view s);

// A decimal uint64 filling all of `s`; nullopt when malformed or too large.
std::optional<uint64_t> parse_u64(std::string_view s);

// A Content-Range header value: "bytes <first>-<last>/<total>" (offsets in
// bytes, last inclusive), or "bytes */<total>" on a 416; total may be "*"
// (unknown).
struct ContentRange {
  bool unsatisfied = false;  // "bytes */<total>"
  uint64_t first = 0;
  uint64_t last = 0;
  std::optional<uint64_t> total;
};

// Parses a Content-Range value; nullopt when malformed (first > last, or
// last >= total).
std::optional<ContentRange> parse_content_range(std::string_view value);

// The <Code> of an S3 (or GCS XML API) error body ("NoSuchKey"), or "".
std::string s3_error_code(std::string_view body);

}  // namespace treecask::remote
