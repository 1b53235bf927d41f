// treecask's URLs: the transport rules both transports follow (parse_url,
// redact_url, the retry policy, per-object concurrency), and the built-in
// remote source: s3://, gs://, http:// and https:// objects read by HTTP
// range requests on libcurl (docs/remote.md).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "treecask/error.h"
#include "treecask/source.h"

namespace treecask {

// ---- Transport rules (both transports: the libcurl source below and the
// Python package's obstore one; docs/remote.md "URLs") ----

// Every URL scheme treecask knows, lower-case. Which transport serves which
// is each transport's (docs/remote.md "Two transports"): the built-in
// libcurl source reads s3, gs, http, https; the Python package all five.
inline constexpr std::string_view kUrlSchemes[] = {"s3", "gs", "az", "http", "https"};

// What a URL must name (parse_url): one object, or a "directory" prefix (a
// multi-process checkpoint, a manager's steps), which may be a bucket alone.
enum class UrlTarget { kObject, kPrefix };

// A treecask URL taken apart by parse_url. Plain values: no ownership.
struct ParsedUrl {
  // One of kUrlSchemes, lower-cased ("s3" for "S3://b/k").
  std::string scheme;
  // s3://, gs://: the bucket; az://: the container; "" for http(s)://.
  std::string bucket;
  // s3, gs, az: everything after "<bucket>/", verbatim (not decoded; '?' and
  // '#' are characters of the key); "" for a bucket alone. "" for
  // http(s)://, whose URL is requested exactly as given (path never
  // rewritten, query kept).
  std::string key;
  // True when the URL names a "directory": it ends with '/' (http(s): its
  // path does and it has no query: a URL with a query names one object).
  bool directory = false;
};

// Parses and validates `url` for `target` (the one URL rule of the library,
// the `treecask` tool and the Python package, bound as _core.parse_url):
// <scheme>://<bucket>/<key> for s3, gs and az (a key is needed for an
// object; a prefix may be a bucket alone), http(s)://<host>[/<path>][?<query>]
// as given. Does no I/O and reads no environment. Throws Error naming the
// URL redacted (redact_url):
//   kUnsupported     a scheme not in kUrlSchemes, named (hdfs://, s4://);
//   kInvalidArgument not a URL (is_url false); credentials inside an s3://,
//                    gs:// or az:// URL (user:password@bucket, the password
//                    holding '/' or not: they belong in the environment or
//                    storage_options, never in the URL); a malformed URL: no
//                    bucket (s3:///k), a ':' in a bucket, no key where an
//                    object is needed (s3://bucket, s3://bucket/), no host
//                    (https:///x), a port that is no number
//                    (https://user:pa/ss@host/x: a '/' in userinfo must be
//                    percent-encoded).
TREECASK_API ParsedUrl parse_url(std::string_view url, UrlTarget target = UrlTarget::kObject);

// How both transports retry a failed request (a connection error, HTTP 429,
// 500, 502, 503 or 504: S3 SlowDown): up to max_retries more attempts, the
// n-th (n = 1, 2, ...) after min(max_backoff_s, initial_backoff_s *
// backoff_base^(n-1)) seconds, none begun more than timeout_s seconds after
// the request's first attempt; then Error(kIo) naming the URL. Bound to
// Python as _core.RETRY_POLICY (obstore's retry_config is built from it).
struct RetryPolicy {
  unsigned max_retries = 5;
  double initial_backoff_s = 0.05;
  double max_backoff_s = 2.0;
  double backoff_base = 2.0;
  double timeout_s = 60.0;
};
inline constexpr RetryPolicy kRetryPolicy{};

// What a failed HTTP answer from an object store means, for both transports
// (the libcurl source here; the Python package's store layer, whose obstore
// and botocore errors carry the status and the S3 error <Code>: bound as
// _core.http_error_code and _core.RETRYABLE_STATUSES).
//
// is_retryable_status: 429, 500, 502, 503 (S3 SlowDown) and 504, retried as
// kRetryPolicy says; after the last attempt they are kIo.
TREECASK_API bool is_retryable_status(long status) noexcept;
// The error code of a final answer `status` (with the S3 / GCS XML error
// <Code> `s3_code`, "" when none) to a request on one object: a ranged read
// pinned to a version (If-Match), or, with `create_only`, a put that must
// not replace an object (If-None-Match: *, a multipart completion too):
//   404, 410                  kNotFound (no such object, or bucket:
//                             s3_code "NoSuchBucket")
//   412                       create_only: kAlreadyExists (the key exists);
//                             a read: kCorruption (the object changed since
//                             it was opened)
//   409 ConditionalRequestConflict, create_only: kAlreadyExists (another
//                             create of the key is completing)
//   416                       kCorruption (the object is not the size it had)
//   401, 403, any other       kIo (access denied, a server error)
// Raises nothing.
TREECASK_API ErrorCode http_error_code(long status, std::string_view s3_code, bool create_only) noexcept;

// Range requests in flight at once for one object (Source::concurrency()
// of both transports), each on its own connection. Bound to Python as
// _core.OBJECT_CONCURRENCY.
inline constexpr unsigned kObjectConcurrency = 16;

// The environment-to-config table of both transports (docs/remote.md
// "Configuration"): a storage option of a URL of `scheme` that
// storage_options leaves unset or empty is the value of the first of
// `variables` that is set and not empty. The libcurl source reads it
// (resolve, src/remote/url.h); the Python package builds its obstore and
// botocore configuration from it (bound as _core.ENV_OPTIONS and
// _core.options_from_env), so that both honour every variable alike. What
// the Python transport reads beyond it (credential chains: web identity,
// instance metadata, GOOGLE_APPLICATION_CREDENTIALS, AZURE_*; az:// itself)
// is obstore's, and the libcurl source does not serve it.
struct EnvOption {
  std::string_view scheme;  // one of kUrlSchemes
  std::string_view option;  // a storage_options key (RemoteOptions)
  std::string_view variables[3];  // in order of precedence; "" pads
};
inline constexpr EnvOption kEnvOptions[] = {
    {"s3", "endpoint", {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"}},
    {"s3", "region", {"AWS_REGION", "AWS_DEFAULT_REGION"}},
    {"s3", "access_key_id", {"AWS_ACCESS_KEY_ID"}},
    {"s3", "secret_access_key", {"AWS_SECRET_ACCESS_KEY"}},
    {"s3", "session_token", {"AWS_SESSION_TOKEN", "AWS_TOKEN"}},
    {"s3", "ca_bundle", {"AWS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"}},
    {"gs", "endpoint", {"STORAGE_EMULATOR_HOST"}},
    {"gs", "bearer_token", {"GOOGLE_OAUTH_ACCESS_TOKEN"}},
    {"gs", "ca_bundle", {"CURL_CA_BUNDLE", "SSL_CERT_FILE"}},
    {"http", "ca_bundle", {"CURL_CA_BUNDLE", "SSL_CERT_FILE"}},
    {"https", "ca_bundle", {"CURL_CA_BUNDLE", "SSL_CERT_FILE"}},
};

// The value kEnvOptions gives option `option` of `scheme` from this
// process's environment now, and the variable it came from (for errors);
// {"", ""} when none is set. Throws nothing but std::bad_alloc.
struct EnvValue {
  std::string value;
  std::string_view variable;
};
TREECASK_API EnvValue env_option(std::string_view scheme, std::string_view option);

// Every option of `scheme` kEnvOptions sets from the environment now:
// {option: value}. Holds secrets: never print it. Bound as
// _core.options_from_env.
TREECASK_API std::map<std::string, std::string> options_from_env(std::string_view scheme);

// How the built-in source reaches a store. Every field left empty is taken
// from the environment by kEnvOptions, as boto3 and the Google clients read it:
//   s3://   AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL or AWS_ENDPOINT (an http://
//           endpoint is allowed; path-style URLs), else
//           https://<bucket>.s3.<region>.amazonaws.com;
//           AWS_REGION or AWS_DEFAULT_REGION (default us-east-1);
//           AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN (or
//           AWS_TOKEN) (signed with AWS Signature V4 by libcurl; unsigned
//           when no key is set).
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
  unsigned max_connections = kObjectConcurrency;
  // How a failed request is retried (RetryPolicy).
  RetryPolicy retry = kRetryPolicy;
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
// alone, often a token) replaced by "***", where the userinfo is everything
// between "://" and the LAST '@' before the query ('?' or '#'), so that a
// secret holding '/' or '@' (AWS secret keys hold '/') is hidden whole
// ("s3://AKIA..:wJa/K7M@bucket/k" -> "s3://***@bucket/k"; an '@' in a path
// hides what precedes it too), and the value of every query
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
// parse_url's errors (kUnsupported also for az://, which this source does
// not serve), kInvalidArgument (an unknown storage option, half a key
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
