// The one redaction rule (include/treecask/remote.h redact_url): every
// credential in real presigned-URL shapes (S3 SigV4 and V2, GCS V4 and V2,
// Azure SAS), userinfo, percent-encoded and upper-cased parameter names;
// nothing else of the URL changes. And the refusal of credentials inside
// s3:// and gs:// URLs (src/remote/url.h resolve).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <map>
#include <optional>
#include <string>

#include "remote/url.h"
#include "treecask/treecask.h"

using namespace treecask;

namespace {

// Each secret below appears in no redacted URL.
constexpr const char* kSecrets[] = {
    "f1e2d3c4b5a6978899aabbccddeeff00112233445566778899aabbccddeeff00",  // signatures
    "AKIAIOSFODNN7EXAMPLE",                                                // access key ids
    "IQoJb3JpZ2luX2VjEXAMPLESESSIONTOKEN",                                 // security tokens
    "GOOG1EXAMPLEHMACID",
    "sv-sig-Zm9vYmFyYmF6cXV4",
    "hunter2",
    "ghp_EXAMPLETOKEN0123",
    "AIzaSyEXAMPLEKEY",
};

void check_clean(const std::string& redacted) {
  for (const char* s : kSecrets) CHECK_MESSAGE(redacted.find(s) == std::string::npos, redacted);
}

}  // namespace

TEST_CASE("redact_url hides every credential of presigned URLs and keeps the rest") {
  const std::string s3 =
      "https://bucket.s3.us-east-1.amazonaws.com/run/model.cask?X-Amz-Algorithm=AWS4-HMAC-SHA256"
      "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20260101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20260101T000000Z"
      "&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Security-Token=IQoJb3JpZ2luX2VjEXAMPLESESSIONTOKEN"
      "&X-Amz-Signature=f1e2d3c4b5a6978899aabbccddeeff00112233445566778899aabbccddeeff00";
  const std::string r = redact_url(s3);
  check_clean(r);
  CHECK(r ==
        "https://bucket.s3.us-east-1.amazonaws.com/run/model.cask?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=***&X-Amz-Date=20260101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
        "&X-Amz-Security-Token=***&X-Amz-Signature=***");
  CHECK(redact_url(r) == r);  // idempotent

  const std::string others[] = {
      // S3 query auth V2
      "https://bucket.s3.amazonaws.com/k?AWSAccessKeyId=AKIAIOSFODNN7EXAMPLE&Expires=1767225600"
      "&Signature=f1e2d3c4b5a6978899aabbccddeeff00112233445566778899aabbccddeeff00",
      // GCS V4 and V2 signed URLs
      "https://storage.googleapis.com/b/o.cask?X-Goog-Algorithm=GOOG4-RSA-SHA256"
      "&X-Goog-Credential=GOOG1EXAMPLEHMACID%2F20260101%2Fauto%2Fstorage%2Fgoog4_request"
      "&X-Goog-Date=20260101T000000Z&X-Goog-Expires=900&X-Goog-SignedHeaders=host"
      "&X-Goog-Signature=f1e2d3c4b5a6978899aabbccddeeff00112233445566778899aabbccddeeff00",
      "https://storage.googleapis.com/b/o.cask?GoogleAccessId=GOOG1EXAMPLEHMACID&Expires=1767225600"
      "&Signature=f1e2d3c4b5a6978899aabbccddeeff00112233445566778899aabbccddeeff00",
      // Azure SAS
      "https://acct.blob.core.windows.net/c/o.cask?sv=2022-11-02&ss=b&srt=o&sp=r&se=2026-01-01T00:00:00Z"
      "&spr=https&sig=sv-sig-Zm9vYmFyYmF6cXV4",
      // percent-encoded and upper-cased names, a fragment, API keys, tokens
      "https://h/o?X%2DAmz%2DSignature=f1e2d3c4b5a6978899aabbccddeeff00112233445566778899aabbccddeeff00",
      "https://h/o?x-amz-security%2dtoken=IQoJb3JpZ2luX2VjEXAMPLESESSIONTOKEN#frag",
      "https://h/o?SIG=sv-sig-Zm9vYmFyYmF6cXV4&KEY=AIzaSyEXAMPLEKEY&access_token=ghp_EXAMPLETOKEN0123",
      "https://h/o?%73ig=sv-sig-Zm9vYmFyYmF6cXV4",
      // userinfo: a password, or a user alone (a token)
      "https://alice:hunter2@h/o.cask",
      "https://ghp_EXAMPLETOKEN0123@h/o.cask",
      "s3://AKIAIOSFODNN7EXAMPLE:hunter2@bucket/k",
  };
  for (const std::string& url : others) {
    std::string red = redact_url(url);
    check_clean(red);
    CHECK(redact_url(red) == red);
  }
  CHECK(redact_url("https://alice:hunter2@h/o?a=1") == "https://***@h/o?a=1");
  CHECK(redact_url("https://tok@h/o") == "https://***@h/o");
  CHECK(redact_url("https://h/o?sv=1&sig=x#sig=y") == "https://h/o?sv=1&sig=***#sig=y");
  // Nothing else changes: paths (with //), other parameters, empty values.
  for (const char* same : {"https://h//a/b?x=1&design=2&sig=", "s3://bucket/a/b.cask", "/local/path?sig=1",
                           "gs://b/k#frag", "http://127.0.0.1:8080/x", "https://h/a?b=c@d", "s3://b/k#x@y"})
    CHECK(redact_url(same) == same);
}

TEST_CASE("redact_url hides userinfo up to the last '@' before the query: secrets holding '/' and '@'") {
  // An AWS secret access key holds '/' (and may hold '+'): the userinfo runs
  // past the first '/' to the last '@'.
  const std::string secret_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
  const std::string s3 = "s3://AKIAIOSFODNN7EXAMPLE:" + secret_key + "@bucket/k.cask";
  CHECK(redact_url(s3) == "s3://***@bucket/k.cask");
  CHECK(redact_url("https://alice:p@ss/w:rd@h/o.cask?a=1") == "https://***@h/o.cask?a=1");
  CHECK(redact_url("https://tok/en@h/o") == "https://***@h/o");
  CHECK(redact_url("gs://u:a/b@c@bucket/k#frag@x") == "gs://***@bucket/k#frag@x");
  // An '@' in a path hides what precedes it too: the rule cannot tell it from a secret.
  CHECK(redact_url("https://h//a/b@c?x=1&sig=s") == "https://***@c?x=1&sig=***");
  for (const std::string& url : {s3, std::string("az://a:") + secret_key + "@c/k", "https://u:" + secret_key + "@h/x"}) {
    const std::string red = redact_url(url);
    CHECK_MESSAGE(red.find("wJalr") == std::string::npos, red);
    CHECK_MESSAGE(red.find("bPxR") == std::string::npos, red);
    CHECK_MESSAGE(red.find("K7MD") == std::string::npos, red);
    CHECK(redact_url(red) == red);
    const std::string text = redact_urls_in("open '" + url + "' failed");
    CHECK_MESSAGE(text.find("K7MD") == std::string::npos, text);
  }
}

TEST_CASE("redact_urls_in redacts each URL inside a message") {
  std::string text =
      "HTTP error: 403 Forbidden for url (https://h/o?X-Amz-Signature=f1e2d3c4b5a6978899aabbccddeeff00112233445566778899aabbccddeeff00) "
      "after 'http://u:hunter2@h2/x' and s3://b/k; no secret";
  std::string red = redact_urls_in(text);
  check_clean(red);
  CHECK(red.find("403 Forbidden for url (https://h/o?X-Amz-Signature=***") != std::string::npos);
  CHECK(red.find("'http://***@h2/x'") != std::string::npos);
  CHECK(red.find("s3://b/k; no secret") != std::string::npos);
  CHECK(redact_urls_in("no url here: a://") == "no url here: a://");
}

TEST_CASE("credentials inside an s3:// or gs:// URL are refused, never used nor printed") {
  for (const char* url : {"s3://AKIAIOSFODNN7EXAMPLE:hunter2@bucket/k.cask", "gs://user:hunter2@bucket/k.cask"}) {
    try {
      remote::resolve(url, {});
      FAIL("accepted " << url);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kInvalidArgument);
      std::string what = e.what();
      check_clean(what);
      CHECK(what.find("credentials belong in the environment or storage_options") != std::string::npos);
    }
  }
}

namespace {

// The code of the Error parse_url throws for `url`, and its message (which
// must name the URL redacted, never a secret).
ErrorCode parse_error(const std::string& url, UrlTarget target = UrlTarget::kObject, std::string* what = nullptr) {
  try {
    parse_url(url, target);
  } catch (const Error& e) {
    check_clean(e.what());
    CHECK_MESSAGE(std::string(e.what()).find(redact_url(url)) != std::string::npos, e.what());
    if (what) *what = e.what();
    return e.code();
  }
  FAIL("parse_url accepted " << url);
  return static_cast<ErrorCode>(0);
}

}  // namespace

TEST_CASE("parse_url takes every scheme's URL apart, as given") {
  ParsedUrl u = parse_url("s3://bucket/run/step_1.cask");
  CHECK(u.scheme == "s3");
  CHECK(u.bucket == "bucket");
  CHECK(u.key == "run/step_1.cask");
  CHECK_FALSE(u.directory);
  u = parse_url("GS://b/a b/%20?x#y");  // the scheme lower-cased; the key verbatim, '?' and '#' in it
  CHECK(u.scheme == "gs");
  CHECK(u.bucket == "b");
  CHECK(u.key == "a b/%20?x#y");
  u = parse_url("az://container/k.cask");
  CHECK(u.scheme == "az");
  CHECK(u.bucket == "container");
  CHECK(u.key == "k.cask");
  u = parse_url("s3://bucket/run/ckpt/");
  CHECK(u.key == "run/ckpt/");
  CHECK(u.directory);

  // A prefix may be a bucket alone.
  u = parse_url("s3://bucket", UrlTarget::kPrefix);
  CHECK(u.bucket == "bucket");
  CHECK(u.key.empty());
  CHECK_FALSE(u.directory);
  u = parse_url("az://c/", UrlTarget::kPrefix);
  CHECK(u.key.empty());
  CHECK(u.directory);

  // http(s): requested as given, no bucket or key; a directory only without a query.
  for (const char* url : {"http://127.0.0.1:8080/x.cask", "https://h/a//b.cask?X-Amz-Signature=s&a=1",
                          "https://user:pw@h/x.cask", "HTTPS://h"}) {
    u = parse_url(url);
    CHECK(u.bucket.empty());
    CHECK(u.key.empty());
    CHECK_FALSE(u.directory);
  }
  CHECK(parse_url("https://h/run/", UrlTarget::kPrefix).directory);
  CHECK(parse_url("https://h/").directory);
  CHECK_FALSE(parse_url("https://h/run/?sig=x").directory);
  CHECK(parse_url("http://h/x").scheme == "http");

  // Every known scheme parses; the list is the core's.
  for (std::string_view scheme : kUrlSchemes)
    CHECK(parse_url(std::string(scheme) + "://b/k").scheme == scheme);
}

TEST_CASE("parse_url refuses other schemes, malformed URLs and credentials in bucket URLs") {
  std::string what;
  CHECK(parse_error("hdfs://namenode/x.cask", UrlTarget::kObject, &what) == ErrorCode::kUnsupported);
  CHECK(what.find("\"hdfs://\" is not supported") != std::string::npos);
  CHECK(parse_error("s4://bucket/x.cask", UrlTarget::kPrefix) == ErrorCode::kUnsupported);
  CHECK(parse_error("file:///tmp/x.cask") == ErrorCode::kUnsupported);

  CHECK(parse_error("/local/x.cask") == ErrorCode::kInvalidArgument);  // not a URL
  CHECK(parse_error("s3:/bucket/x.cask") == ErrorCode::kInvalidArgument);
  for (const char* url : {"s3://bucket", "s3://bucket/", "gs://b", "az://container/", "s3:///k", "s3://"}) {
    CHECK(parse_error(url, UrlTarget::kObject, &what) == ErrorCode::kInvalidArgument);
    CHECK_MESSAGE((what.find("no key") != std::string::npos || what.find("no bucket") != std::string::npos ||
                   what.find("no container") != std::string::npos),
                  what);
  }
  CHECK(parse_error("s3:///k", UrlTarget::kPrefix) == ErrorCode::kInvalidArgument);
  CHECK(parse_error("az://", UrlTarget::kPrefix, &what) == ErrorCode::kInvalidArgument);
  CHECK(what.find("no container") != std::string::npos);
  for (const char* url : {"https://", "http:///x.cask", "https://user:hunter2@/x", "https://?sig=x"})
    CHECK(parse_error(url) == ErrorCode::kInvalidArgument);

  for (const char* url : {"s3://AKIAIOSFODNN7EXAMPLE:hunter2@bucket/k.cask", "gs://user:hunter2@bucket/k",
                          "az://ghp_EXAMPLETOKEN0123@container/k", "s3://alice:hunter2@bucket"}) {
    CHECK(parse_error(url, UrlTarget::kPrefix, &what) == ErrorCode::kInvalidArgument);
    CHECK(what.find("credentials belong in the environment or storage_options") != std::string::npos);
  }
  // A '@' in the key is a character of the key.
  CHECK(parse_url("s3://bucket/a@b.cask").key == "a@b.cask");

  // A secret holding '/' (AWS secret keys): refused as credentials, never
  // echoed (parse_error checks the message against kSecrets).
  for (const char* url : {"s3://AKIAIOSFODNN7EXAMPLE:hunter2/K7MD/bPxR@bucket/k.cask",
                          "gs://GOOG1EXAMPLEHMACID:hunter2/x@bucket/k", "az://acct:hunter2/a@container/k"}) {
    CHECK(parse_error(url, UrlTarget::kObject, &what) == ErrorCode::kInvalidArgument);
    CHECK_MESSAGE(what.find("credentials belong in the environment or storage_options") != std::string::npos, what);
    CHECK(what.find("K7MD") == std::string::npos);
  }
  CHECK(parse_error("s3://host:9000/bucket/k", UrlTarget::kObject, &what) == ErrorCode::kInvalidArgument);
  CHECK(what.find("a ':' in the bucket name") != std::string::npos);
  for (const char* url : {"https://alice:hunter2/K7MD@h/x.cask", "http://u:hunter2/x@127.0.0.1:9/k"}) {
    CHECK(parse_error(url, UrlTarget::kObject, &what) == ErrorCode::kInvalidArgument);
    CHECK_MESSAGE(what.find("a '/' in it must be percent-encoded") != std::string::npos, what);
    CHECK(what.find("K7MD") == std::string::npos);
  }
  CHECK(parse_error("http://h:port/x", UrlTarget::kObject, &what) == ErrorCode::kInvalidArgument);
  CHECK(what.find("the port of <host>:<port> is not a number") != std::string::npos);
  CHECK(parse_error("https://u:hunter2@h:port/x", UrlTarget::kObject, &what) == ErrorCode::kInvalidArgument);
  CHECK(what.find("the port of <host>:<port> is not a number") != std::string::npos);
  // Ports, IPv6 literals and percent-encoded passwords stay valid.
  for (const char* url : {"http://127.0.0.1:8080/x", "http://[::1]:8080/x", "http://[::1]/x", "https://u:a%2Fb@h:443/x",
                          "https://h/models/user@v2.cask"})
    CHECK_NOTHROW(parse_url(url));
}

TEST_CASE("the retry policy and per-object concurrency are the core's, used by the libcurl source") {
  static_assert(kRetryPolicy.max_retries == 5);
  static_assert(kRetryPolicy.initial_backoff_s == 0.05 && kRetryPolicy.max_backoff_s == 2.0);
  static_assert(kRetryPolicy.backoff_base == 2.0 && kRetryPolicy.timeout_s == 60.0);
  static_assert(kObjectConcurrency == 16);
  RemoteOptions options;
  CHECK(options.max_connections == kObjectConcurrency);
  CHECK(options.retry.max_retries == kRetryPolicy.max_retries);
  CHECK(options.retry.timeout_s == kRetryPolicy.timeout_s);
}

TEST_CASE("the libcurl source resolves through parse_url and refuses az://, which it does not serve") {
  try {
    remote::resolve("az://container/k.cask", {});
    FAIL("accepted az://");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kUnsupported);
    CHECK(std::string(e.what()).find("Python package") != std::string::npos);
  }
  remote::Endpoint e = remote::resolve("s3://bucket.with.dots/a b.cask", {{{"endpoint", "http://127.0.0.1:9"}}});
  CHECK(e.bucket == "bucket.with.dots");
  CHECK(e.url == "http://127.0.0.1:9/bucket.with.dots/a%20b.cask");
  for (const char* url : {"s3://bucket", "gs://b/", "hdfs://x/y"}) CHECK_THROWS_AS(remote::resolve(url, {}), Error);
}

namespace {

// Every variable of kEnvOptions unset for the scope, restored after it.
class ClearEnv {
 public:
  ClearEnv() {
    for (const EnvOption& row : kEnvOptions)
      for (std::string_view var : row.variables)
        if (!var.empty() && !saved_.count(std::string(var))) {
          const char* v = std::getenv(std::string(var).c_str());
          saved_[std::string(var)] = v ? std::optional<std::string>(v) : std::nullopt;
          ::unsetenv(std::string(var).c_str());
        }
  }
  ~ClearEnv() {
    for (const auto& [var, value] : saved_) {
      if (value) ::setenv(var.c_str(), value->c_str(), 1);
      else ::unsetenv(var.c_str());
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

}  // namespace

TEST_CASE("the environment-to-config table: one row per option, read by resolve and options_from_env") {
  ClearEnv clear;
  // Every row names a known scheme, and no (scheme, option) twice.
  for (size_t i = 0; i < std::size(kEnvOptions); ++i) {
    CHECK(std::find(std::begin(kUrlSchemes), std::end(kUrlSchemes), kEnvOptions[i].scheme) != std::end(kUrlSchemes));
    CHECK_FALSE(kEnvOptions[i].variables[0].empty());
    for (size_t j = 0; j < i; ++j)
      CHECK_FALSE((kEnvOptions[i].scheme == kEnvOptions[j].scheme && kEnvOptions[i].option == kEnvOptions[j].option));
  }
  // Precedence, and resolve() following it (the endpoint names its variable
  // when refused; an empty variable is unset).
  ::setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9", 1);
  ::setenv("AWS_ENDPOINT_URL_S3", "", 1);
  ::setenv("AWS_ENDPOINT", "ftp://legacy", 1);
  EnvValue v = env_option("s3", "endpoint");
  CHECK(v.value == "http://127.0.0.1:9");
  CHECK(v.variable == "AWS_ENDPOINT_URL");
  CHECK(options_from_env("s3").at("endpoint") == "http://127.0.0.1:9");
  CHECK(remote::resolve("s3://b/k", {}).url == "http://127.0.0.1:9/b/k");
  ::setenv("AWS_ENDPOINT_URL_S3", "ftp://s3-only", 1);
  try {
    remote::resolve("s3://b/k", {});
    FAIL("accepted an ftp:// endpoint");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("AWS_ENDPOINT_URL_S3") != std::string::npos);
  }
  // storage_options win over the environment, key by key.
  CHECK(remote::resolve("s3://b/k", {{{"endpoint", "http://h:1"}}}).url == "http://h:1/b/k");
  ::unsetenv("AWS_ENDPOINT_URL_S3");
  ::unsetenv("AWS_ENDPOINT_URL");
  try {
    remote::resolve("s3://b/k", {});
    FAIL("accepted an ftp:// endpoint");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("the endpoint from AWS_ENDPOINT must") != std::string::npos);
  }
  ::unsetenv("AWS_ENDPOINT");
  CHECK(env_option("s3", "endpoint").value.empty());
  CHECK(options_from_env("az").empty());
  ::setenv("AWS_TOKEN", "tok", 1);
  ::setenv("AWS_ACCESS_KEY_ID", "id", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "secret", 1);
  remote::Endpoint e = remote::resolve("s3://b/k", {});
  CHECK(std::find(e.headers.begin(), e.headers.end(), "x-amz-security-token: tok") != e.headers.end());
  for (const char* var : {"AWS_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}) ::unsetenv(var);
  // ca_bundle is a storage option too.
  CHECK(remote::resolve("https://h/x", {{{"ca_bundle", "/etc/ca.pem"}}}).ca_bundle == "/etc/ca.pem");
}

TEST_CASE("the shared classification of failed HTTP answers") {
  for (long st : {429L, 500L, 502L, 503L, 504L}) CHECK(is_retryable_status(st));
  for (long st : {200L, 206L, 400L, 403L, 404L, 412L, 501L}) CHECK_FALSE(is_retryable_status(st));
  CHECK(http_error_code(404, "NoSuchKey", false) == ErrorCode::kNotFound);
  CHECK(http_error_code(404, "NoSuchBucket", true) == ErrorCode::kNotFound);
  CHECK(http_error_code(410, "", false) == ErrorCode::kNotFound);
  CHECK(http_error_code(412, "PreconditionFailed", false) == ErrorCode::kCorruption);
  CHECK(http_error_code(412, "PreconditionFailed", true) == ErrorCode::kAlreadyExists);
  CHECK(http_error_code(409, "ConditionalRequestConflict", true) == ErrorCode::kAlreadyExists);
  CHECK(http_error_code(409, "BucketNotEmpty", true) == ErrorCode::kIo);
  CHECK(http_error_code(409, "ConditionalRequestConflict", false) == ErrorCode::kIo);
  CHECK(http_error_code(416, "", false) == ErrorCode::kCorruption);
  CHECK(http_error_code(403, "AccessDenied", false) == ErrorCode::kIo);
  CHECK(http_error_code(500, "InternalError", true) == ErrorCode::kIo);
}
