#include "request_head.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <optional>
#include <utility>

namespace straggler::common::http_detail {

namespace {

Verdict Refuse(int status, std::string message) {
  return {Verdict::kRefuse, status, std::move(message)};
}
Verdict ServeOrWait(bool whole) { return {whole ? Verdict::kServe : Verdict::kWait, 0, {}}; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

bool EqualsNoCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

Verdict Judge(Connection& c, size_t max_body) {
  const std::string& in = c.in;
  if (c.need > 0) return ServeOrWait(in.size() >= c.need);
  const size_t end = in.find("\r\n\r\n", c.scanned >= 3 ? c.scanned - 3 : 0);
  if (end == std::string::npos) {
    c.scanned = in.size();
    const size_t nl = in.rfind('\n');
    if (nl == std::string::npos) {
      if (in.size() > kMaxRequestLine) {
        return Refuse(414, "request line longer than " + std::to_string(kMaxRequestLine) +
                               " bytes");
      }
    } else if (in.size() - nl > kMaxHeaderLine || in.size() > kMaxHeadBytes) {
      return Refuse(431, "request header fields larger than " + std::to_string(kMaxHeaderLine) +
                             " bytes a line or " + std::to_string(kMaxHeadBytes) + " in all");
    }
    return {};
  }
  const size_t head = end + 4;
  if (head > kMaxHeadBytes) {
    return Refuse(431, "request header fields larger than " + std::to_string(kMaxHeadBytes) +
                           " bytes in all");
  }
  std::optional<uint64_t> length;
  bool read_by_worker = false;  // chunked, or a length httplib will judge
  // in[end + 1] is '\n': every header line ends at or before it.
  for (size_t at = in.find('\n'); at < end + 1;) {
    const size_t next = in.find('\n', at + 1);
    const std::string_view line(in.data() + at + 1, next - at - 1);
    at = next;
    if (line.size() + 1 > kMaxHeaderLine) {
      return Refuse(431, "request header line longer than " + std::to_string(kMaxHeaderLine) +
                             " bytes");
    }
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, colon);
    const std::string_view value = Trim(line.substr(colon + 1));
    if (EqualsNoCase(name, "Transfer-Encoding")) read_by_worker = true;
    if (EqualsNoCase(name, "Expect") && EqualsNoCase(value, "100-continue")) {
      c.expects_continue = true;
    }
    if (EqualsNoCase(name, "Content-Length") && !length && !read_by_worker) {
      uint64_t n = 0;
      const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (ec == std::errc() && ptr == value.data() + value.size() && !value.empty()) {
        length = n;
      } else {
        read_by_worker = true;
      }
    }
  }
  if (read_by_worker) {
    c.need = head;
    return ServeOrWait(true);
  }
  if (length && *length > max_body) {
    return Refuse(413, "request body of Content-Length " + std::to_string(*length) +
                           " bytes is larger than the limit of " + std::to_string(max_body));
  }
  c.need = head + length.value_or(0);
  return ServeOrWait(in.size() >= c.need);
}

// GET /healthz and /readyz get a worker of their own: they cost microseconds,
// while the shared workers may all be rendering large /metrics or REST
// answers (50 clients asking for a 10 000-rank /metrics keep 4 workers busy
// for seconds), and a kubelet probe must not queue behind those.
bool IsProbe(std::string_view in) {
  for (std::string_view path : {"GET /healthz", "GET /readyz"}) {
    if (in.size() > path.size() && in.substr(0, path.size()) == path &&
        (in[path.size()] == ' ' || in[path.size()] == '?')) {
      return true;
    }
  }
  return false;
}

const char* Reason(int status) {
  switch (status) {
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    default: return "Bad Request";
  }
}

const char* ErrorCode(int status) {
  switch (status) {
    case 408: return "REQUEST_TIMEOUT";
    case 413: return "PAYLOAD_TOO_LARGE";
    case 414: return "URI_TOO_LONG";
    case 431: return "HEADERS_TOO_LARGE";
    default: return "INVALID_ARGUMENT";
  }
}

}  // namespace straggler::common::http_detail
