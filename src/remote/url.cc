#include "remote/url.h"

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <iterator>
#include <mutex>
#include <utility>

#include "treecask/error.h"

namespace treecask {

bool is_url(std::string_view s) noexcept {
  auto letter = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); };
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  if (s.empty() || !letter(s[0])) return false;
  size_t i = 1;
  while (i < s.size() && (letter(s[i]) || digit(s[i]) || s[i] == '+' || s[i] == '.' || s[i] == '-')) ++i;
  return s.substr(i, 3) == "://";
}

namespace {

// A query parameter's name as a server reads it: percent-decoded ("%2D" is
// '-'), '+' as a space, ASCII lower-cased.
std::string decoded_name(std::string_view raw) {
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
  };
  std::string out;
  out.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    char c = raw[i];
    if (c == '%' && i + 2 < raw.size() && hex(raw[i + 1]) >= 0 && hex(raw[i + 2]) >= 0) {
      c = char(hex(raw[i + 1]) * 16 + hex(raw[i + 2]));
      i += 2;
    } else if (c == '+') {
      c = ' ';
    }
    out.push_back((c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c);
  }
  return out;
}

// Whether the query parameter `raw_name` carries a credential (url.h
// redact_url lists the rule).
bool secret_query_parameter(std::string_view raw_name) {
  static constexpr std::string_view kNames[] = {"sig", "key", "sas", "code", "auth", "authorization"};
  static constexpr std::string_view kParts[] = {"signature", "token",    "credential", "secret",
                                                "password",  "passwd",   "accesskey",  "accessid",
                                                "apikey",    "api_key",  "api-key",    "session"};
  std::string name = decoded_name(raw_name);
  for (std::string_view n : kNames)
    if (name == n) return true;
  for (std::string_view p : kParts)
    if (name.find(p) != std::string::npos) return true;
  return false;
}

}  // namespace

std::string redact_url(std::string_view url) {
  std::string out(url);
  size_t start = out.find("://");
  if (start == std::string::npos) return out;
  start += 3;
  // user:password@host (or a user alone, often a token) -> ***@host. The
  // userinfo runs to the LAST '@' before the query: a secret may hold '/'
  // (AWS secret keys do) or '@', so an '@' in the path counts too.
  size_t end = out.find_first_of("?#", start);
  if (end == std::string::npos) end = out.size();
  size_t at = end > start ? out.rfind('@', end - 1) : std::string::npos;
  if (at != std::string::npos && at > start) out.replace(start, at - start, "***");
  // ?X-Amz-Signature=...&X-Amz-Security-Token=... -> ***
  size_t q = out.find('?', start);
  if (q == std::string::npos) return out;
  size_t pos = q + 1;
  while (pos < out.size() && out[pos] != '#') {
    size_t amp = out.find_first_of("&#", pos);
    if (amp == std::string::npos) amp = out.size();
    size_t eq = out.find('=', pos);
    if (eq != std::string::npos && eq < amp && amp > eq + 1 &&
        secret_query_parameter(std::string_view(out).substr(pos, eq - pos))) {
      out.replace(eq + 1, amp - eq - 1, "***");
      amp = eq + 4;
    }
    if (amp >= out.size() || out[amp] == '#') break;
    pos = amp + 1;
  }
  return out;
}

std::string redact_urls_in(std::string_view text) {
  auto scheme_char = [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '.' ||
           c == '-';
  };
  auto url_end = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '"' || c == '\'' || c == '<' || c == '>' ||
           c == '`';
  };
  std::string out;
  size_t done = 0;  // text[0, done) is in `out`
  size_t sep = text.find("://");
  while (sep != std::string_view::npos) {
    size_t begin = sep;
    while (begin > done && scheme_char(text[begin - 1])) --begin;
    size_t end = sep + 3;
    while (end < text.size() && !url_end(text[end])) ++end;
    if (begin < sep) {  // a scheme: <scheme>://...
      out.append(text.substr(done, begin - done));
      out += redact_url(text.substr(begin, end - begin));
      done = end;
    }
    sep = text.find("://", std::max(end, sep + 3));
  }
  out.append(text.substr(done));
  return out;
}

namespace {

// Where the credentials of a bucket URL belong (parse_url's refusal of
// user:password@bucket), as each transport reads them (docs/remote.md
// "Configuration").
std::string credentials_belong(std::string_view scheme) {
  if (scheme == "s3")
    return "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, or storage_options access_key_id, "
           "secret_access_key and session_token";
  if (scheme == "gs")
    return "GOOGLE_APPLICATION_CREDENTIALS or storage_options service_account (Python); "
           "GOOGLE_OAUTH_ACCESS_TOKEN or storage_options bearer_token (the C++ library and tool)";
  return "AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_KEY, or storage_options account_key or sas_key";
}

}  // namespace

ParsedUrl parse_url(std::string_view url, UrlTarget target) {
  auto invalid = [&](const std::string& message) {
    return Error(ErrorCode::kInvalidArgument, redact_url(url), "", message);
  };
  if (!is_url(url)) throw invalid("not a URL: expected s3://, gs://, az://, http:// or https://");
  ParsedUrl p;
  p.scheme = remote::url_scheme(url);
  if (std::find(std::begin(kUrlSchemes), std::end(kUrlSchemes), p.scheme) == std::end(kUrlSchemes))
    throw Error(ErrorCode::kUnsupported, redact_url(url), "",
                "the URL scheme \"" + p.scheme + "://\" is not supported (s3://, gs://, az://, http:// and https:// are)");
  const std::string_view rest = url.substr(p.scheme.size() + 3);
  if (p.scheme == "http" || p.scheme == "https") {
    const std::string_view before_query = rest.substr(0, rest.find_first_of("?#"));
    const std::string_view authority = before_query.substr(0, before_query.find('/'));
    std::string_view host = authority.substr(authority.rfind('@') == std::string_view::npos ? 0 : authority.rfind('@') + 1);
    if (host.empty()) throw invalid("no host: expected " + p.scheme + "://<host>/<path>");
    // <host>:<port> with a port that is no number: a password holding '/'
    // (user:pa/ss@host) or a malformed URL, never a host to connect to.
    const size_t colon = host.starts_with('[') ? host.find(':', host.find(']')) : host.rfind(':');
    if (colon != std::string_view::npos &&
        host.substr(colon + 1).find_first_not_of("0123456789") != std::string_view::npos)
      throw invalid(authority.find('@') == std::string_view::npos && before_query.find('@') != std::string_view::npos
                        ? "malformed userinfo (user:password@host): a '/' in it must be percent-encoded (%2F)"
                        : "the port of <host>:<port> is not a number");
    p.directory = rest.find('?') == std::string_view::npos && before_query.ends_with('/');
    return p;
  }
  const char* bucket_word = p.scheme == "az" ? "container" : "bucket";
  const std::string shape = p.scheme + "://<" + bucket_word + ">/<key>";
  const size_t slash = rest.find('/');
  const std::string_view bucket = rest.substr(0, slash);
  // user:password@bucket, also when the password holds '/' (AWS secret keys
  // do: s3://AKIA..:wJal/rXU@bucket/k puts a ':' in what would be the
  // bucket): no bucket name has '@' or ':'.
  if (bucket.find('@') != std::string_view::npos ||
      (bucket.find(':') != std::string_view::npos && rest.find('@') != std::string_view::npos))
    throw invalid("credentials in an " + p.scheme + ":// URL (user:password@" + bucket_word +
                  ") are refused: credentials belong in the environment or storage_options (" +
                  credentials_belong(p.scheme) + "); name the object " + shape);
  if (bucket.empty()) throw invalid(std::string("no ") + bucket_word + ": expected " + shape);
  if (bucket.find(':') != std::string_view::npos)
    throw invalid(std::string("a ':' in the ") + bucket_word + " name: expected " + shape +
                  " (an endpoint's host:port belongs in the environment or storage_options endpoint)");
  p.bucket = std::string(bucket);
  if (slash != std::string_view::npos) p.key = std::string(rest.substr(slash + 1));
  p.directory = url.ends_with('/');
  if (target == UrlTarget::kObject && p.key.empty())
    throw invalid("no key: an object's URL is " + shape);
  return p;
}

namespace {

std::mutex& opener_mutex() {
  static std::mutex m;
  return m;
}

SourceOpener& url_opener() {
  static SourceOpener opener;
  return opener;
}

}  // namespace

void set_url_opener(SourceOpener opener) {
  std::lock_guard<std::mutex> lock(opener_mutex());
  url_opener() = std::move(opener);
}

bool is_retryable_status(long status) noexcept {
  return status == 429 || status == 500 || status == 502 || status == 503 || status == 504;
}

ErrorCode http_error_code(long status, std::string_view s3_code, bool create_only) noexcept {
  if (status == 404 || status == 410) return ErrorCode::kNotFound;
  if (status == 412) return create_only ? ErrorCode::kAlreadyExists : ErrorCode::kCorruption;
  if (status == 409 && create_only && s3_code == "ConditionalRequestConflict") return ErrorCode::kAlreadyExists;
  if (status == 416) return ErrorCode::kCorruption;
  return ErrorCode::kIo;
}

EnvValue env_option(std::string_view scheme, std::string_view option) {
  for (const EnvOption& row : kEnvOptions) {
    if (row.scheme != scheme || row.option != option) continue;
    for (std::string_view var : row.variables) {
      if (var.empty()) break;
      const char* v = std::getenv(std::string(var).c_str());
      if (v && *v) return {v, var};
    }
  }
  return {};
}

std::map<std::string, std::string> options_from_env(std::string_view scheme) {
  std::map<std::string, std::string> out;
  for (const EnvOption& row : kEnvOptions) {
    if (row.scheme != scheme) continue;
    EnvValue v = env_option(scheme, row.option);
    if (!v.value.empty()) out[std::string(row.option)] = std::move(v.value);
  }
  return out;
}

namespace remote {

std::shared_ptr<const Source> open_object(const std::string& url) {
  SourceOpener opener;
  {
    std::lock_guard<std::mutex> lock(opener_mutex());
    opener = url_opener();
  }
  if (opener) return opener(url);
  return open_url(url);
}

namespace {

// SHA-256 of the empty body: the payload hash of a signed GET (S3 requires
// x-amz-content-sha256 on every SigV4 request).
constexpr const char* kEmptySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

constexpr const char* kS3CredentialsHint =
    "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, or storage_options "
    "access_key_id, secret_access_key and session_token";
constexpr const char* kGcsCredentialsHint =
    "GOOGLE_OAUTH_ACCESS_TOKEN or storage_options bearer_token";

char lower(char c) { return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c; }

// storage_options[key] when set and not empty, else "".
std::string option(const RemoteOptions& options, const char* key) {
  auto it = options.storage_options.find(key);
  return it != options.storage_options.end() ? it->second : std::string();
}

// option(key) when not empty, else what kEnvOptions (remote.h) gives for
// `scheme`; `from` names where it came from (for errors).
std::string setting(const RemoteOptions& options, std::string_view scheme, const char* key,
                    std::string* from = nullptr) {
  std::string v = option(options, key);
  if (!v.empty()) {
    if (from) *from = std::string("storage_options ") + key;
    return v;
  }
  EnvValue e = env_option(scheme, key);
  if (from) *from = std::string(e.variable);
  return std::move(e.value);
}

[[noreturn]] void invalid(const std::string& name, const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, name, "", message);
}

// An endpoint URL without its trailing '/'; it must be http:// or https://
// (`what` names where it came from, for the error).
std::string checked_endpoint(const std::string& name, std::string endpoint, const char* what) {
  std::string scheme = url_scheme(endpoint);
  if (scheme != "http" && scheme != "https")
    invalid(name, std::string("the endpoint from ") + what + " must start with http:// or https:// (got \"" +
                      redact_url(endpoint) + "\")");
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  return endpoint;
}

// True when `bucket` can be a host name label: virtual-hosted-style S3 URLs
// need it (a bucket with dots would not match the TLS certificate).
bool dns_label(std::string_view bucket) {
  if (bucket.size() < 3 || bucket.size() > 63) return false;
  for (char c : bucket)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  return bucket.front() != '-' && bucket.back() != '-';
}

void check_option_keys(const std::string& name, const RemoteOptions& options) {
  static constexpr std::string_view kKnown[] = {"endpoint",      "region",       "access_key_id", "secret_access_key",
                                                "session_token", "bearer_token", "ca_bundle"};
  for (const auto& [key, value] : options.storage_options) {
    bool known = false;
    for (std::string_view k : kKnown) known = known || key == k;
    if (!known)
      invalid(name, "unknown storage option \"" + key +
                        "\" (known: endpoint, region, access_key_id, secret_access_key, session_token, "
                        "bearer_token, ca_bundle)");
  }
}

Endpoint resolve_s3(const ParsedUrl& u, Endpoint e, const RemoteOptions& options) {
  const std::string& key = u.key;
  e.bucket = u.bucket;
  e.service = Service::kS3;
  std::string region = setting(options, "s3", "region");
  if (region.empty()) region = "us-east-1";

  std::string from;
  std::string endpoint = setting(options, "s3", "endpoint", &from);
  if (!endpoint.empty()) {
    e.url = checked_endpoint(e.name, endpoint, from.c_str()) + "/" + percent_encode(e.bucket, false) + "/" +
            percent_encode(key, true);
  } else if (dns_label(e.bucket)) {
    e.url = "https://" + e.bucket + ".s3." + region + ".amazonaws.com/" + percent_encode(key, true);
  } else {
    e.url = "https://s3." + region + ".amazonaws.com/" + percent_encode(e.bucket, false) + "/" +
            percent_encode(key, true);
  }

  // The key pair comes whole from storage_options, or whole from the
  // environment: never half from each.
  auto has = [&](const char* k) { return !option(options, k).empty(); };
  std::string id, secret, token;
  if (has("access_key_id") || has("secret_access_key")) {
    id = option(options, "access_key_id");
    secret = option(options, "secret_access_key");
    token = option(options, "session_token");
    if (id.empty() || secret.empty())
      invalid(e.name, std::string("storage_options has ") + (id.empty() ? "secret_access_key" : "access_key_id") +
                          " without " + (id.empty() ? "access_key_id" : "secret_access_key"));
  } else {
    id = env_option("s3", "access_key_id").value;
    secret = env_option("s3", "secret_access_key").value;
    token = setting(options, "s3", "session_token");
    if (id.empty() != secret.empty())
      invalid(e.name, std::string("the environment has ") +
                          (id.empty() ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID") + " without " +
                          (id.empty() ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY"));
  }
  if (!id.empty()) {
    e.aws_sigv4 = "aws:amz:" + region + ":s3";
    e.access_key_id = std::move(id);
    e.secret_access_key = std::move(secret);
    e.headers.push_back(std::string("x-amz-content-sha256: ") + kEmptySha256);
    if (!token.empty()) e.headers.push_back("x-amz-security-token: " + token);
    e.credentials_hint = std::string("check credentials: ") + kS3CredentialsHint;
  } else {
    e.credentials_hint = std::string("no credentials were sent: set ") + kS3CredentialsHint;
  }
  return e;
}

Endpoint resolve_gs(const ParsedUrl& u, Endpoint e, const RemoteOptions& options) {
  const std::string& key = u.key;
  e.bucket = u.bucket;
  std::string from;
  std::string emulator = setting(options, "gs", "endpoint", &from);
  if (!emulator.empty()) {
    // "host:port" or "http://host:port"; the JSON API's media download.
    if (url_scheme(emulator).empty()) emulator = "http://" + emulator;
    e.service = Service::kGcsJson;
    e.url = checked_endpoint(e.name, emulator, from.c_str()) + "/storage/v1/b/" + percent_encode(e.bucket, false) +
            "/o/" + percent_encode(key, false) + "?alt=media";
  } else {
    e.service = Service::kGcs;
    e.url = "https://storage.googleapis.com/" + percent_encode(e.bucket, false) + "/" + percent_encode(key, true);
  }
  std::string token = setting(options, "gs", "bearer_token");
  if (!token.empty()) {
    e.headers.push_back("Authorization: Bearer " + token);
    e.credentials_hint = std::string("check credentials: ") + kGcsCredentialsHint;
  } else {
    e.credentials_hint = std::string("no credentials were sent: set ") + kGcsCredentialsHint;
  }
  return e;
}

}  // namespace

std::string url_scheme(std::string_view s) {
  if (!is_url(s)) return {};
  std::string scheme(s.substr(0, s.find("://")));
  for (char& c : scheme) c = lower(c);
  return scheme;
}

std::string percent_encode(std::string_view s, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
                      c == '.' || c == '_' || c == '~' || (keep_slash && c == '/');
    if (unreserved) {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

Endpoint resolve(const std::string& url, const RemoteOptions& options) {
  Endpoint e;
  e.name = redact_url(url);
  const ParsedUrl u = parse_url(url, UrlTarget::kObject);
  const std::string& scheme = u.scheme;
  if (scheme == "az")
    throw Error(ErrorCode::kUnsupported, e.name, "",
                "az:// is read by the Python package (obstore), not by the built-in libcurl source: read it with "
                "treecask.open or the pip-installed treecask command, or pass your own Source (docs/remote.md "
                "\"Two transports\")");
  check_option_keys(e.name, options);
  e.ca_bundle = setting(options, scheme, "ca_bundle");
  if (scheme == "s3") return resolve_s3(u, std::move(e), options);
  if (scheme == "gs") return resolve_gs(u, std::move(e), options);
  e.service = Service::kHttp;
  e.url = url;
  e.follow_redirects = true;
  std::string token = option(options, "bearer_token");
  if (!token.empty()) e.headers.push_back("Authorization: Bearer " + token);
  e.credentials_hint = token.empty() ? "no credentials were sent" : "check the storage_options bearer_token";
  return e;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i])) return false;
  return true;
}

bool contains_nocase(std::string_view haystack, std::string_view needle) {
  if (needle.size() > haystack.size()) return false;
  for (size_t i = 0; i + needle.size() <= haystack.size(); ++i)
    if (iequals(haystack.substr(i, needle.size()), needle)) return true;
  return false;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n'))
    s.remove_suffix(1);
  return s;
}

std::optional<uint64_t> parse_u64(std::string_view s) {
  if (s.empty() || s.size() > 20) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    uint64_t d = uint64_t(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

std::optional<ContentRange> parse_content_range(std::string_view v) {
  v = trim(v);
  if (v.size() < 6 || !iequals(v.substr(0, 6), "bytes ")) return std::nullopt;
  v = trim(v.substr(6));
  size_t slash = v.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  std::string_view range = v.substr(0, slash), total = v.substr(slash + 1);
  ContentRange cr;
  if (total != "*") {
    cr.total = parse_u64(total);
    if (!cr.total) return std::nullopt;
  }
  if (range == "*") {
    cr.unsatisfied = true;
    return cr;
  }
  size_t dash = range.find('-');
  if (dash == std::string_view::npos) return std::nullopt;
  auto first = parse_u64(range.substr(0, dash)), last = parse_u64(range.substr(dash + 1));
  if (!first || !last || *first > *last) return std::nullopt;
  if (cr.total && *last >= *cr.total) return std::nullopt;
  cr.first = *first;
  cr.last = *last;
  return cr;
}

std::string s3_error_code(std::string_view body) {
  size_t a = body.find("<Code>");
  if (a == std::string_view::npos) return {};
  a += 6;
  size_t b = body.find("</Code>", a);
  if (b == std::string_view::npos || b - a > 64) return {};
  return std::string(body.substr(a, b - a));
}

}  // namespace remote
}  // namespace treecask
