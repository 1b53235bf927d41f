// treecask's built-in remote source: s3://, gs://, http:// and https://
// objects read by HTTP range requests on libcurl (docs/remote.md).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "treecask/source.h"

namespace treecask {

// How the built-in source reaches a store. Every field left empty is taken
// from the environment, as boto3 and the Google clients read it:
//   s3://   AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (an http:// endpoint is
//           allowed; path-style URLs), else https://<bucket>.s3.<region>.amazonaws.com;
//           AWS_REGION or AWS_DEFAULT_REGION (default us-east-1);
//           AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN
//           (signed with AWS Signature V4 by libcurl; unsigned when no key is set).
//   gs://   STORAGE_EMULATOR_HOST (a GCS emulator, "host:port" or
//           "http://host:port", JSON API), else https://storage.googleapis.com;
//           a bearer token from GOOGLE_OAUTH_ACCESS_TOKEN when set (public
//           objects otherwise).
//   http(s):// the URL as it is (redirects followed).
// https:// servers are verified with the system's CA certificates, or those
// in the file AWS_CA_BUNDLE (s3:// only), CURL_CA_BUNDLE or SSL_CERT_FILE
// names. HTTP proxies: http_proxy, https_proxy, no_proxy (libcurl's).
struct RemoteOptions {
  // Keys: "endpoint", "region", "access_key_id", "secret_access_key",
  // "session_token", "bearer_token" override the environment ("endpoint" of
  // a gs:// URL is an emulator's, like STORAGE_EMULATOR_HOST; "bearer_token"
  // is also sent to http(s):// URLs). The key pair comes whole from here or
  // whole from the environment. Any other key is Error(kInvalidArgument).
  std::map<std::string, std::string> storage_options;
  // Requests in flight at once in one read() call (Source::concurrency()),
  // each on its own connection; connections stay open between calls.
  unsigned max_connections = 16;
  // A request that fails with a connection error, HTTP 429, 500, 502, 503 or
  // 504 (S3 SlowDown) is retried up to `retries` times, waiting
  // backoff_initial_s * 2^attempt seconds (at most backoff_max_s), then fails
  // with Error(kIo) naming the URL.
  unsigned retries = 5;
  double backoff_initial_s = 0.05;
  double backoff_max_s = 2.0;
  // Seconds to connect, and to wait for progress on a request (a transfer
  // slower than 1 byte/s for that long fails, and is retried).
  double connect_timeout_s = 10.0;
  double stall_timeout_s = 30.0;
};

// True when `s` starts with a URL scheme ("<letters>://"): such a string is
// never taken for a local path.
TREECASK_API bool is_url(std::string_view s) noexcept;

// `url` as every message, log line and name shows it (the one redaction
// rule: docs/remote.md "Secrets"): the userinfo (user:password@, or user@
// alone, often a token) replaced by "***", and the value of every query
// parameter that carries a credential. A parameter's name is
// compared after percent-decoding and ASCII lower-casing
// ("X%2DAmz%2DSignature" is x-amz-signature); it carries a credential when
// it is sig, key, sas, code, auth or authorization (Azure SAS, API keys), or
// contains signature, token, credential, secret, password, passwd,
// accesskey, accessid, apikey, api_key, api-key or session (X-Amz-Signature,
// X-Amz-Credential, X-Amz-Security-Token, X-Goog-Signature,
// X-Goog-Credential, AWSAccessKeyId, GoogleAccessId, access_token, ...).
// Other parts (scheme, host, path, other parameters, fragment) are kept.
// Idempotent; a string without "://" comes back unchanged.
TREECASK_API std::string redact_url(std::string_view url);

// `text` with every URL in it (<scheme>://... up to a blank, a quote, '<',
// '>' or '`') passed through redact_url: for messages that quote a URL
// among other words (a client library's error text).
TREECASK_API std::string redact_urls_in(std::string_view text);

// The object at `url` (s3://bucket/key, gs://bucket/key, http(s)://...) as
// a Source, without a request: its size() is kUnknownSize until its first
// read() (Archive::open's: the object's head and tail, source.h), whose
// responses give its size and pin its version (ETag; a GCS generation).
// Every later request carries If-Match (x-goog-if-generation-match) and
// every response's ETag is compared: another version is Error(kCorruption).
// Ranges of one read() that touch go as one request (a range over 16 MiB
// as several of 8 MiB). A server that ignores Range (HTTP 200 with the
// whole object) is accepted only in the first read, and only for an
// object no longer than the range asked. The source's name() is
// redact_url(url). The source is thread-safe. Throws Error naming the URL
// (redacted), here or from the first read:
// kUnsupported (a scheme other than s3, gs, http, https: named),
// kInvalidArgument (a malformed URL, credentials inside an s3:// or gs://
// URL (user:password@bucket), an unknown storage option, half a key
// pair, an endpoint without http:// or https://),
// kNotFound (no such object or bucket), kIo (network error after retries,
// access denied), kCorruption (a server that ignores Range requests, a
// Content-Range that does not match the request, an object that changed).
TREECASK_API std::shared_ptr<Source> open_url(const std::string& url, const RemoteOptions& options = {});

// Replaces, for this process, how Archive::open and ShardedArchive::open
// (and so the `treecask` tool's commands) reach a URL's objects: `opener`
// gets the object's URL and returns its Source, or throws Error naming the
// URL redacted (redact_url). An empty function restores open_url. The Python
// package sets one that reads through obstore (python/treecask/_remote.py),
// so that the tool it runs in-process reads every URL treecask.open reads.
// Set it before opening: it is not synchronised with opens in flight.
TREECASK_API void set_url_opener(SourceOpener opener);

}  // namespace treecask
