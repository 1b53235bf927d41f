// The one redaction rule (include/treecask/remote.h redact_url): every
// credential in real presigned-URL shapes (S3 SigV4 and V2, GCS V4 and V2,
// Azure SAS), userinfo, percent-encoded and upper-cased parameter names;
// nothing else of the URL changes. And the refusal of credentials inside
// s3:// and gs:// URLs (src/remote/url.h resolve).
#include <doctest/doctest.h>

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
  // Nothing else changes: paths (with // and @), other parameters, empty values.
  for (const char* same : {"https://h//a/b@c?x=1&design=2&sig=", "s3://bucket/a/b.cask", "/local/path?sig=1",
                           "gs://b/k#frag", "http://127.0.0.1:8080/x"})
    CHECK(redact_url(same) == same);
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
