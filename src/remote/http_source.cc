// The built-in remote source (include/treecask/remote.h): an object read by
// HTTP range requests on libcurl's multi interface.
//
// The source does no request of its own: its first read() is the reader's
// (the object's head and tail, source.h), which also gives the object's
// size and version; every later read() pins that version. Ranges of one
// call that touch are fetched as one request.
//
// A read() takes a Session (a curl multi handle, whose connection cache keeps
// connections open between calls, and its idle easy handles) from the
// source's pool, runs its ranges on it with at most max_connections in
// flight, and gives it back: concurrent read() calls each hold their own
// Session, so no curl handle is ever used by two threads. DNS lookups and TLS
// sessions are shared by all of a source's handles (a curl share handle).

#include <curl/curl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "remote/url.h"
#include "treecask/error.h"
#include "treecask/remote.h"
#include "treecask/source.h"

namespace treecask {
namespace {

using Clock = std::chrono::steady_clock;
using remote::ContentRange;
using remote::Endpoint;
using remote::Service;
using remote::contains_nocase;
using remote::iequals;
using remote::parse_content_range;
using remote::parse_u64;
using remote::s3_error_code;
using remote::trim;

// A range larger than this is fetched as several requests of kPartBytes, so
// that one big read still uses several connections.
constexpr uint64_t kSplitAboveBytes = uint64_t{16} << 20;
constexpr uint64_t kPartBytes = uint64_t{8} << 20;
// How much of an error response's body is kept (for its S3 <Code>).
constexpr size_t kErrorBodyBytes = 4096;

// Initialises libcurl once per process. Throws Error(kIo) if it fails.
void global_init(const std::string& name) {
  static std::once_flag once;
  static CURLcode result = CURLE_OK;
  std::call_once(once, [] { result = curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (result != CURLE_OK)
    throw Error(ErrorCode::kIo, name, "", std::string("libcurl failed to initialise: ") + curl_easy_strerror(result));
}

// Transport errors worth another attempt: the connection failed, broke or
// stalled, or the name did not resolve (yet).
bool retryable(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    default:
      return false;
  }
}

// The message of Error(kCorruption) for a server that answered a range
// request (`range`: "bytes=0-99") with the whole object.
std::string ignored_range(const std::string& range) {
  return "the server ignored the Range request (HTTP 200 with the whole object instead of 206 Partial Content "
         "for " + range + "); it cannot serve an archive by ranges";
}

class HttpSource;

// What one request asks for.
enum class Kind {
  kRange,  // bytes [offset, offset + length) of an object of known size
  kFirst,  // bytes [offset, offset + length), clipped to the object (first read)
  kTail,   // the last `length` bytes, clipped to the object (first read)
};

// One range request and the response it got; it survives retries.
struct Transfer {
  const HttpSource* source = nullptr;
  Kind kind = Kind::kRange;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<std::span<std::byte>> out;  // `length` bytes in all, filled in order
  std::string range;                      // "bytes=0-99", "bytes=-4096"
  curl_slist* headers = nullptr;
  CURL* easy = nullptr;  // while in flight
  char errbuf[CURL_ERROR_SIZE] = {};

  // The response of the current attempt.
  long status = 0;
  std::string content_range_text;
  std::optional<ContentRange> content_range;
  std::optional<uint64_t> content_length;
  std::string etag;
  std::string generation;
  bool body_started = false;
  uint64_t received = 0;
  size_t piece = 0, piece_at = 0;  // where the next body byte goes in `out`
  std::string error_body;
  // Set by a callback that refused the response: the Error to throw.
  bool faulted = false;
  ErrorCode fault_code = ErrorCode::kCorruption;
  std::string fault;

  // When the first attempt started, attempts that failed so far, when the
  // next may start, and why the last one failed.
  std::optional<Clock::time_point> first_start;
  unsigned failures = 0;
  Clock::time_point not_before{};
  std::string last_error;

  Transfer() = default;
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;
  ~Transfer() { curl_slist_free_all(headers); }

  void reset_response() {
    status = 0;
    content_range_text.clear();
    content_range.reset();
    content_length.reset();
    etag.clear();
    generation.clear();
    body_started = false;
    received = 0;
    piece = piece_at = 0;
    error_body.clear();
    faulted = false;
    fault.clear();
    errbuf[0] = 0;
  }
  // Copies `n` body bytes to the next places of `out` (n <= length - received).
  void put(const char* data, size_t n) {
    received += n;
    while (n > 0) {
      std::span<std::byte> p = out[piece];
      const size_t k = std::min(n, p.size() - piece_at);
      std::memcpy(p.data() + piece_at, data, k);
      data += k;
      n -= k;
      piece_at += k;
      if (piece_at == p.size()) {
        ++piece;
        piece_at = 0;
      }
    }
  }
  void refuse(ErrorCode code, std::string message) {
    faulted = true;
    fault_code = code;
    fault = std::move(message);
  }
};

// A curl multi handle (with its connection cache) and its idle easy
// handles; used by one read() at a time.
struct Session {
  CURLM* multi = nullptr;
  std::vector<CURL*> idle;
  Session() = default;
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session() {
    for (CURL* e : idle) curl_easy_cleanup(e);
    if (multi) curl_multi_cleanup(multi);
  }
};

// The lock callbacks of the curl share handle: one mutex per kind of data.
struct ShareLocks {
  std::array<std::mutex, CURL_LOCK_DATA_LAST> mutexes;
  static void lock(CURL*, curl_lock_data data, curl_lock_access, void* self) {
    static_cast<ShareLocks*>(self)->mutexes[size_t(data)].lock();
  }
  static void unlock(CURL*, curl_lock_data data, void* self) {
    static_cast<ShareLocks*>(self)->mutexes[size_t(data)].unlock();
  }
};

class HttpSource final : public Source {
 public:
  HttpSource(Endpoint endpoint, const RemoteOptions& options);
  ~HttpSource() override;

  const std::string& name() const noexcept override { return endpoint_.name; }
  uint64_t size() const noexcept override { return size_.load(std::memory_order_acquire); }
  unsigned concurrency() const noexcept override { return max_connections_; }
  void read(std::span<const ReadRange> ranges) const override;

  // Callbacks (libcurl's CURLOPT_HEADERFUNCTION and CURLOPT_WRITEFUNCTION;
  // userdata: the Transfer).
  static size_t on_header(char* data, size_t size, size_t count, void* transfer);
  static size_t on_body(char* data, size_t size, size_t count, void* transfer);

 private:
  std::unique_ptr<Session> acquire_session() const;
  void release_session(std::unique_ptr<Session> session) const;
  CURL* new_easy() const;
  // Fills t.range and t.headers for t.kind, offset and length.
  void prepare(Transfer& t) const;
  // Runs `transfers` to completion on one Session, at most `limit` in
  // flight, retrying as RemoteOptions says. Throws the first Error.
  void run(std::span<Transfer> transfers, unsigned limit) const;
  // Checks a response's status, Content-Range and version before its first
  // body byte; false (with t.faulted set) refuses the body.
  bool accept_body(Transfer& t) const;
  // The first read (size unknown): runs `ranges` (the reader's head and
  // tail, source.h) clipped to the object, learns its size and pins its
  // version.
  void first_read(std::span<const ReadRange> ranges) const;
  // Judges a finished attempt: true when `t` is done, false when it should
  // be retried (t.last_error says why). Throws Error otherwise.
  bool finish(Transfer& t, CURLcode code) const;
  [[noreturn]] void fail(ErrorCode code, const std::string& message) const {
    throw Error(code, endpoint_.name, "", message);
  }
  std::string describe_status(const Transfer& t) const;
  std::string changed(const std::string& then, const std::string& now) const;

  Endpoint endpoint_;
  RemoteOptions options_;
  unsigned max_connections_;
  // Learned by the first read (kUnknownSize until then); written by it
  // alone, before any other call (source.h), like the version below.
  mutable std::atomic<uint64_t> size_{kUnknownSize};
  // The version pinned by the first read ("" when the server sent none).
  mutable std::string etag_;
  mutable std::string generation_;
  mutable std::string request_url_;

  std::unique_ptr<ShareLocks> locks_;
  CURLSH* share_ = nullptr;
  mutable std::mutex pool_mutex_;
  mutable std::vector<std::unique_ptr<Session>> pool_;
};

HttpSource::HttpSource(Endpoint endpoint, const RemoteOptions& options)
    : endpoint_(std::move(endpoint)),
      options_(options),
      max_connections_(std::max(1u, options.max_connections)),
      request_url_(endpoint_.url),
      locks_(std::make_unique<ShareLocks>()) {
  share_ = curl_share_init();
  if (!share_) throw std::bad_alloc();
  curl_share_setopt(share_, CURLSHOPT_LOCKFUNC, &ShareLocks::lock);
  curl_share_setopt(share_, CURLSHOPT_UNLOCKFUNC, &ShareLocks::unlock);
  curl_share_setopt(share_, CURLSHOPT_USERDATA, locks_.get());
  curl_share_setopt(share_, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
  curl_share_setopt(share_, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
}

HttpSource::~HttpSource() {
  pool_.clear();
  curl_share_cleanup(share_);
}

std::unique_ptr<Session> HttpSource::acquire_session() const {
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    if (!pool_.empty()) {
      auto s = std::move(pool_.back());
      pool_.pop_back();
      return s;
    }
  }
  auto s = std::make_unique<Session>();
  s->multi = curl_multi_init();
  if (!s->multi) throw std::bad_alloc();
  curl_multi_setopt(s->multi, CURLMOPT_MAXCONNECTS, long(std::max(2u, max_connections_)));
  return s;
}

void HttpSource::release_session(std::unique_ptr<Session> session) const {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  pool_.push_back(std::move(session));
}

CURL* HttpSource::new_easy() const {
  CURL* e = curl_easy_init();
  if (!e) throw std::bad_alloc();
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_SHARE, share_);
#if LIBCURL_VERSION_NUM >= 0x075500
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
  curl_easy_setopt(e, CURLOPT_PROTOCOLS, long(CURLPROTO_HTTP | CURLPROTO_HTTPS));
  curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS, long(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
  // One request per connection: max_connections connections in parallel.
  curl_easy_setopt(e, CURLOPT_HTTP_VERSION, long(CURL_HTTP_VERSION_1_1));
  curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(e, CURLOPT_BUFFERSIZE, 256L << 10);
  double connect_s = options_.connect_timeout_s > 0 ? options_.connect_timeout_s : 0.0;
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, long(std::ceil(connect_s * 1000)));
  if (options_.stall_timeout_s > 0) {
    // Fails (and retries) a transfer that moves under 1 byte/s for that long.
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, std::max(1L, long(std::ceil(options_.stall_timeout_s))));
  }
  if (!endpoint_.ca_bundle.empty()) curl_easy_setopt(e, CURLOPT_CAINFO, endpoint_.ca_bundle.c_str());
  curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, endpoint_.follow_redirects ? 1L : 0L);
  curl_easy_setopt(e, CURLOPT_MAXREDIRS, 10L);
  // An object key is sent as it is: "a/../b" is a key, not a path to tidy.
  if (endpoint_.service != Service::kHttp) curl_easy_setopt(e, CURLOPT_PATH_AS_IS, 1L);
  if (!endpoint_.aws_sigv4.empty()) {
    curl_easy_setopt(e, CURLOPT_AWS_SIGV4, endpoint_.aws_sigv4.c_str());
    curl_easy_setopt(e, CURLOPT_USERNAME, endpoint_.access_key_id.c_str());
    curl_easy_setopt(e, CURLOPT_PASSWORD, endpoint_.secret_access_key.c_str());
  }
#ifdef TREECASK_VERSION_STRING
  curl_easy_setopt(e, CURLOPT_USERAGENT, "treecask/" TREECASK_VERSION_STRING);
#else
  curl_easy_setopt(e, CURLOPT_USERAGENT, "treecask");
#endif
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, &HttpSource::on_header);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &HttpSource::on_body);
  return e;
}

void HttpSource::prepare(Transfer& t) const {
  switch (t.kind) {
    case Kind::kRange:
      t.range = "bytes=" + std::to_string(t.offset) + "-" + std::to_string(t.offset + t.length - 1);
      break;
    case Kind::kFirst:
      t.range = "bytes=" + std::to_string(t.offset) + "-" + std::to_string(t.offset + t.length - 1);
      break;
    case Kind::kTail:
      t.range = "bytes=-" + std::to_string(t.length);
      break;
  }
  auto add = [&](const std::string& h) {
    curl_slist* next = curl_slist_append(t.headers, h.c_str());
    if (!next) throw std::bad_alloc();
    t.headers = next;
  };
  for (const std::string& h : endpoint_.headers) add(h);
  add("Range: " + t.range);
  if (t.kind == Kind::kRange) {
    // Pin the version seen at open: the server refuses (412) another one.
    // (GCS: by generation; the JSON API's is a query parameter, in
    // request_url_. A weak ETag cannot be matched: only compared.)
    bool gcs = endpoint_.service == Service::kGcs || endpoint_.service == Service::kGcsJson;
    if (gcs && !generation_.empty()) {
      if (endpoint_.service == Service::kGcs) add("x-goog-if-generation-match: " + generation_);
    } else if (!etag_.empty() && etag_.rfind("W/", 0) != 0) {
      add("If-Match: " + etag_);
    }
  }
}

size_t HttpSource::on_header(char* data, size_t size, size_t count, void* transfer) {
  auto& t = *static_cast<Transfer*>(transfer);
  size_t n = size * count;
  std::string_view line = trim(std::string_view(data, n));
  if (line.size() >= 5 && line.substr(0, 5) == "HTTP/") {
    // A new response (after a redirect or a 100 Continue): start afresh.
    t.reset_response();
    size_t sp = line.find(' ');
    if (sp != std::string_view::npos) {
      auto code = parse_u64(line.substr(sp + 1, 3));
      t.status = code ? long(*code) : 0;
    }
    return n;
  }
  size_t colon = line.find(':');
  if (colon == std::string_view::npos) return n;
  std::string_view key = trim(line.substr(0, colon)), value = trim(line.substr(colon + 1));
  if (iequals(key, "content-range")) {
    t.content_range_text = std::string(value);
    t.content_range = parse_content_range(value);
  } else if (iequals(key, "content-length")) {
    t.content_length = parse_u64(value);
  } else if (iequals(key, "etag")) {
    t.etag = std::string(value);
  } else if (iequals(key, "x-goog-generation")) {
    t.generation = std::string(value);
  }
  return n;
}

size_t HttpSource::on_body(char* data, size_t size, size_t count, void* transfer) {
  auto& t = *static_cast<Transfer*>(transfer);
  size_t n = size * count;
  if (!t.body_started) {
    t.body_started = true;
    if (!t.source->accept_body(t)) return 0;  // aborts the transfer
  }
  if (t.faulted) return 0;
  if (t.status == 206 || t.status == 200) {
    if (n > t.length - t.received) {
      // Never past the range's buffer.
      if (t.status == 200)
        t.refuse(ErrorCode::kCorruption, ignored_range(t.range));
      else
        t.refuse(ErrorCode::kCorruption, "the server sent more bytes than its Content-Range \"" +
                                             t.content_range_text + "\" for " + t.range);
      return 0;
    }
    t.put(data, n);
  } else if (t.error_body.size() < kErrorBodyBytes) {
    t.error_body.append(data, std::min(n, kErrorBodyBytes - t.error_body.size()));
  }
  return n;
}

std::string HttpSource::changed(const std::string& then, const std::string& now) const {
  return "the object changed since it was opened (" + then + ", now " + now + ")";
}

bool HttpSource::accept_body(Transfer& t) const {
  if (t.status == 200) {
    // The whole object: acceptable in the first read when it fits the
    // buffer (a small object from a server that ignores Range) of a range
    // from its start or end, never for a later read.
    if (t.kind == Kind::kRange || (t.kind == Kind::kFirst && t.offset != 0) ||
        (t.content_length && *t.content_length > t.length)) {
      t.refuse(ErrorCode::kCorruption, ignored_range(t.range));
      return false;
    }
    return true;
  }
  if (t.status != 206) return true;  // an error body, kept for its message
  if (!t.content_range || t.content_range->unsatisfied || !t.content_range->total) {
    t.refuse(ErrorCode::kCorruption, "the server answered " + t.range + " with Content-Range \"" +
                                         t.content_range_text + "\" (expected bytes <first>-<last>/<size>)");
    return false;
  }
  const ContentRange& cr = *t.content_range;
  uint64_t total = *cr.total, first = 0, last = 0;
  switch (t.kind) {
    case Kind::kRange:
      first = t.offset;
      last = t.offset + t.length - 1;
      if (total != size_) {
        t.refuse(ErrorCode::kCorruption, changed("size " + std::to_string(size_) + " bytes",
                                                 std::to_string(total) + " bytes, Content-Range \"" +
                                                     t.content_range_text + "\""));
        return false;
      }
      break;
    case Kind::kFirst:
      first = t.offset;
      last = std::min(t.offset + t.length, total) - 1;
      break;
    case Kind::kTail:
      first = total - std::min(t.length, total);
      last = total - 1;
      break;
  }
  if (total == 0 || cr.first != first || cr.last != last) {
    t.refuse(ErrorCode::kCorruption, "the server answered " + t.range + " with Content-Range \"" +
                                         t.content_range_text + "\" (expected bytes " + std::to_string(first) +
                                         "-" + std::to_string(last) + "/" + std::to_string(total) + ")");
    return false;
  }
  if (t.kind == Kind::kRange) {
    if (!etag_.empty() && !t.etag.empty() && t.etag != etag_) {
      t.refuse(ErrorCode::kCorruption, changed("ETag " + etag_, t.etag));
      return false;
    }
    if (!generation_.empty() && !t.generation.empty() && t.generation != generation_) {
      t.refuse(ErrorCode::kCorruption, changed("generation " + generation_, t.generation));
      return false;
    }
  }
  return true;
}

std::string HttpSource::describe_status(const Transfer& t) const {
  std::string s = "HTTP " + std::to_string(t.status);
  std::string code = s3_error_code(t.error_body);
  if (!code.empty()) s += " " + code;
  return s;
}

bool HttpSource::finish(Transfer& t, CURLcode code) const {
  if (t.faulted) fail(t.fault_code, t.fault);
  if (code != CURLE_OK) {
    std::string why = std::string("curl error ") + std::to_string(int(code)) + " (" + curl_easy_strerror(code) + ")";
    if (t.errbuf[0]) why += ": " + std::string(t.errbuf);
    if (!retryable(code)) fail(ErrorCode::kIo, "GET " + t.range + " failed: " + why);
    t.last_error = why;
    return false;
  }
  const long status = t.status;
  if (status == 206) {
    uint64_t expected = t.content_range ? t.content_range->last - t.content_range->first + 1 : 0;
    if (!t.body_started || t.received != expected) {
      t.last_error = "a short response: " + std::to_string(t.received) + " of " + std::to_string(expected) +
                     " bytes";
      return false;
    }
    return true;
  }
  if (status == 200) {
    if (t.kind == Kind::kRange) fail(ErrorCode::kCorruption, ignored_range(t.range));
    return true;  // the whole (small) object, in the first read
  }
  if (status == 416) {
    // In the first read: an empty object has no byte to serve.
    bool empty = !t.content_range || !t.content_range->total || *t.content_range->total == 0;
    if (t.kind != Kind::kRange && empty) return true;
    if (t.kind == Kind::kRange)
      fail(ErrorCode::kCorruption, changed("size " + std::to_string(size_) + " bytes",
                                           "HTTP 416 Range Not Satisfiable for " + t.range));
    fail(ErrorCode::kCorruption, "the server refused " + t.range + " (HTTP 416) with Content-Range \"" +
                                     t.content_range_text + "\"");
  }
  // The codes are the shared classification's (remote.h http_error_code).
  const std::string code_name = s3_error_code(t.error_body);
  const ErrorCode error = http_error_code(status, code_name, false);
  if (status == 412)
    fail(error, changed(generation_.empty() ? "ETag " + etag_ : "generation " + generation_,
                       "HTTP 412 Precondition Failed"));
  if (error == ErrorCode::kNotFound) {
    bool bucket = code_name == "NoSuchBucket" || contains_nocase(t.error_body, "bucket does not exist");
    if (bucket && !endpoint_.bucket.empty())
      fail(error, "no such bucket \"" + endpoint_.bucket + "\" (" + describe_status(t) + ")");
    fail(error, "no such object (" + describe_status(t) + ")");
  }
  if (status == 401 || status == 403)
    fail(error, "access denied (" + describe_status(t) + "; " + endpoint_.credentials_hint + ")");
  if (is_retryable_status(status)) {
    t.last_error = describe_status(t);
    return false;
  }
  if (status >= 300 && status < 400 && s3_error_code(t.error_body) == "PermanentRedirect")
    fail(ErrorCode::kIo, "the bucket is in another region (" + describe_status(t) +
                             "): set AWS_REGION or storage_options region");
  fail(ErrorCode::kIo, "unexpected " + describe_status(t) + " for GET " + t.range);
}

void HttpSource::run(std::span<Transfer> transfers, unsigned limit) const {
  if (transfers.empty()) return;
  std::unique_ptr<Session> session = acquire_session();
  CURLM* multi = session->multi;
  // On every exit (an Error included): take the handles out of the multi
  // handle and give the Session back.
  struct Guard {
    const HttpSource* self;
    std::unique_ptr<Session>& session;
    std::span<Transfer> transfers;
    ~Guard() {
      for (Transfer& t : transfers) {
        if (!t.easy) continue;
        curl_multi_remove_handle(session->multi, t.easy);
        session->idle.push_back(t.easy);
        t.easy = nullptr;
      }
      self->release_session(std::move(session));
    }
  } guard{this, session, transfers};

  for (Transfer& t : transfers) {
    t.source = this;
    prepare(t);
  }
  std::vector<Transfer*> waiting;  // to start, when their not_before has come
  waiting.reserve(transfers.size());
  for (auto it = transfers.rbegin(); it != transfers.rend(); ++it) waiting.push_back(&*it);
  unsigned in_flight = 0;
  size_t done = 0;

  auto start = [&](Transfer& t) {
    CURL* e;
    if (!session->idle.empty()) {
      e = session->idle.back();
      session->idle.pop_back();
    } else {
      e = new_easy();
    }
    t.reset_response();
    if (!t.first_start) t.first_start = Clock::now();
    curl_easy_setopt(e, CURLOPT_URL, request_url_.c_str());
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, t.headers);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t.errbuf);
    curl_easy_setopt(e, CURLOPT_PRIVATE, &t);
    CURLMcode mc = curl_multi_add_handle(multi, e);
    if (mc != CURLM_OK) {
      session->idle.push_back(e);
      fail(ErrorCode::kIo, std::string("libcurl refused a request: ") + curl_multi_strerror(mc));
    }
    t.easy = e;
    ++in_flight;
  };

  while (done < transfers.size()) {
    // Start what may start: waiting transfers are kept last-first, so the
    // ranges go out in the order they were asked.
    Clock::time_point now = Clock::now();
    for (size_t i = waiting.size(); i-- > 0 && in_flight < limit;) {
      if (waiting[i]->not_before > now) continue;
      Transfer* t = waiting[i];
      waiting.erase(waiting.begin() + long(i));
      start(*t);
    }

    int running = 0;
    CURLMcode mc = curl_multi_perform(multi, &running);
    if (mc != CURLM_OK) fail(ErrorCode::kIo, std::string("libcurl failed: ") + curl_multi_strerror(mc));
    int left = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi, &left)) {
      if (msg->msg != CURLMSG_DONE) continue;
      CURL* e = msg->easy_handle;
      CURLcode code = msg->data.result;
      Transfer* t = nullptr;
      curl_easy_getinfo(e, CURLINFO_PRIVATE, reinterpret_cast<char**>(&t));
      curl_multi_remove_handle(multi, e);
      session->idle.push_back(e);
      t->easy = nullptr;
      --in_flight;
      if (finish(*t, code)) {
        ++done;
        continue;
      }
      // Retry as options_.retry says (remote.h RetryPolicy).
      const RetryPolicy& policy = options_.retry;
      ++t->failures;
      double delay = std::min(policy.max_backoff_s,
                              policy.initial_backoff_s *
                                  std::pow(std::max(1.0, policy.backoff_base), double(std::min(t->failures - 1, 60u))));
      delay = std::max(0.0, delay);
      now = Clock::now();
      t->not_before = now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(delay));
      const bool out_of_time = std::chrono::duration<double>(t->not_before - *t->first_start).count() >
                               std::max(0.0, policy.timeout_s);
      if (t->failures > policy.max_retries || out_of_time)
        fail(ErrorCode::kIo, "GET " + t->range + " failed after " + std::to_string(t->failures) + " attempts" +
                                 (out_of_time ? " (the retry time limit passed)" : "") + ": " + t->last_error);
      waiting.insert(waiting.begin(), t);
    }
    if (done == transfers.size()) break;

    // Wait for activity, at most until the next retry is due.
    long wait_ms = 1000;
    if (in_flight < limit) {
      now = Clock::now();
      for (Transfer* t : waiting) {
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t->not_before - now).count();
        wait_ms = std::min<long>(wait_ms, std::max<long>(0, long(ms)));
      }
      if (!waiting.empty() && wait_ms == 0) continue;
    }
    mc = curl_multi_poll(multi, nullptr, 0, int(wait_ms), nullptr);
    if (mc != CURLM_OK) fail(ErrorCode::kIo, std::string("libcurl failed: ") + curl_multi_strerror(mc));
  }
}

void HttpSource::first_read(std::span<const ReadRange> ranges) const {
  std::vector<Transfer> ts(ranges.size());
  size_t used = 0;
  for (const ReadRange& r : ranges) {
    if (r.out.empty()) continue;
    Transfer& t = ts[used++];
    t.kind = r.from_end ? Kind::kTail : Kind::kFirst;
    t.offset = r.from_end ? 0 : r.offset;
    t.length = r.out.size();
    t.out = {r.out};
  }
  if (used == 0) fail(ErrorCode::kInvalidArgument, "a first read without a byte to read");
  // All at once: one round trip.
  run(std::span<Transfer>(ts.data(), used), std::max(2u, max_connections_));

  // What each answer says: the object's size and version (all must agree).
  std::optional<uint64_t> size;
  std::string etag, generation;
  for (size_t i = 0; i < used; ++i) {
    const Transfer& t = ts[i];
    uint64_t total = 0;
    if (t.status == 206) total = *t.content_range->total;
    else if (t.status == 200) total = t.received;  // 416: an empty object
    if (size && *size != total)
      fail(ErrorCode::kCorruption, "the object changed while it was opened (" + std::to_string(*size) +
                                       " bytes, then " + std::to_string(total) + ")");
    if (!etag.empty() && !t.etag.empty() && t.etag != etag)
      fail(ErrorCode::kCorruption, "the object changed while it was opened (ETag " + etag + ", then " + t.etag + ")");
    if (!generation.empty() && !t.generation.empty() && t.generation != generation)
      fail(ErrorCode::kCorruption, "the object changed while it was opened (generation " + generation + ", then " +
                                       t.generation + ")");
    size = total;
    if (etag.empty()) etag = t.etag;
    if (generation.empty()) generation = t.generation;
  }
  etag_ = etag;
  generation_ = generation;
  // The JSON API pins a generation with a query parameter.
  if (endpoint_.service == Service::kGcsJson && !generation_.empty())
    request_url_ = endpoint_.url + "&ifGenerationMatch=" + generation_;
  size_.store(*size, std::memory_order_release);
}

void HttpSource::read(std::span<const ReadRange> ranges) const {
  const uint64_t size = size_.load(std::memory_order_acquire);
  if (size == kUnknownSize) return first_read(ranges);
  // Stretches: ranges that touch, fetched as one request each (a stretch
  // larger than kSplitAboveBytes as parts of kPartBytes).
  struct Stretch {
    uint64_t offset, length;
    size_t first, last;  // ranges[first, last)
  };
  std::vector<Stretch> stretches;
  size_t parts = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const ReadRange& r = ranges[i];
    uint64_t n = r.out.size();
    if (r.from_end || r.offset > size || n > size - r.offset)
      fail(ErrorCode::kInvalidArgument, "read of bytes [" + std::to_string(r.offset) + ", " +
                                            std::to_string(r.offset + n) + ") outside the object of " +
                                            std::to_string(size) + " bytes");
    if (n == 0) continue;
    if (!stretches.empty() && stretches.back().offset + stretches.back().length == r.offset) {
      stretches.back().length += n;
      stretches.back().last = i + 1;
    } else {
      stretches.push_back({r.offset, n, i, i + 1});
    }
  }
  for (const Stretch& s : stretches)
    parts += s.length > kSplitAboveBytes ? size_t((s.length + kPartBytes - 1) / kPartBytes) : 1;
  std::vector<Transfer> ts(parts);
  size_t used = 0;
  for (const Stretch& s : stretches) {
    const uint64_t part = s.length > kSplitAboveBytes ? kPartBytes : s.length;
    size_t i = s.first;
    uint64_t in_range = 0;  // bytes of ranges[i] given to earlier parts
    for (uint64_t at = 0; at < s.length; at += part) {
      Transfer& t = ts[used++];
      t.kind = Kind::kRange;
      t.offset = s.offset + at;
      t.length = std::min(part, s.length - at);
      // The pieces of the stretch's ranges that this part covers.
      for (uint64_t need = t.length; need > 0;) {
        std::span<std::byte> out = ranges[i].out;
        const uint64_t k = std::min<uint64_t>(need, out.size() - in_range);
        t.out.push_back(out.subspan(in_range, k));
        need -= k;
        in_range += k;
        if (in_range == out.size()) {
          in_range = 0;
          do ++i;
          while (i < s.last && ranges[i].out.empty());
        }
      }
    }
  }
  run(std::span<Transfer>(ts.data(), used), max_connections_);
}

}  // namespace

std::shared_ptr<Source> open_url(const std::string& url, const RemoteOptions& options) {
  remote::Endpoint endpoint = remote::resolve(url, options);
  global_init(endpoint.name);
  return std::make_shared<HttpSource>(std::move(endpoint), options);
}

}  // namespace treecask
