#include "straggler/common/channel_security.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace straggler {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace

std::string ChannelSecurity::Validate() const {
  if (!cert_file.empty() && key_file.empty()) {
    return "tls cert file " + cert_file + " is set but no tls key file";
  }
  if (cert_file.empty() && !key_file.empty()) {
    return "tls key file " + key_file + " is set but no tls cert file";
  }
  return {};
}

ChannelSecurity ChannelSecurityFromEnv() {
  return ChannelSecurity{Env(kEnvTlsCa), Env(kEnvTlsCert), Env(kEnvTlsKey)};
}

bool ReadWholeFile(const std::string& path, std::string_view what, std::string* out,
                   std::string* error) {
  const auto fail = [&](const std::string& reason) {
    *error = "cannot read " + std::string(what) + " " + path + ": " + reason;
    return false;
  };
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
  // writer, for ever (a FIFO as tls.key_file held the daemon's start, with
  // the signals it waits on not yet taken). The kind is checked on the open
  // descriptor, so the path cannot be swapped in between.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return fail(std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int e = errno;
    ::close(fd);
    if (S_ISDIR(st.st_mode)) return fail(std::strerror(EISDIR));
    if (st.st_mode != 0) {
      return fail(std::string("not a regular file (") +
                  (S_ISFIFO(st.st_mode)   ? "a FIFO"
                   : S_ISSOCK(st.st_mode) ? "a socket"
                   : S_ISCHR(st.st_mode)  ? "a character device"
                   : S_ISBLK(st.st_mode)  ? "a block device"
                                          : "not a file") +
                  "); give the path of a file");
    }
    return fail(std::strerror(e));
  }
  std::string text;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      text.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      const int e = errno;
      ::close(fd);
      return fail(std::strerror(e));
    }
  }
  ::close(fd);
  *out = std::move(text);
  return true;
}

bool ReadBearerToken(const std::string& path, std::string* token, std::string* error) {
  std::string text;
  if (!ReadWholeFile(path, "token file", &text, error)) return false;
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  size_t begin = 0, end = text.size();
  while (begin < end && space(text[begin])) ++begin;
  while (end > begin && space(text[end - 1])) --end;
  if (begin == end) {
    *error = "token file " + path + " is empty";
    return false;
  }
  for (size_t i = begin; i < end; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c <= 0x20 || c >= 0x7f) {
      // The position only: the token itself must not reach a log.
      *error = "token file " + path + " holds a space, control or non-ASCII character at byte " +
               std::to_string(i) + " (a token is one word of printable ASCII)";
      return false;
    }
  }
  *token = text.substr(begin, end - begin);
  return true;
}

std::string BearerAuthorization(std::string_view token) {
  return "Bearer " + std::string(token);
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const ChannelSecurity& sec,
                                                                 std::string_view endpoint,
                                                                 std::string* error) {
  if (!sec.tls() || endpoint.substr(0, 5) == "unix:") return grpc::InsecureChannelCredentials();
  if (std::string problem = sec.Validate(); !problem.empty()) {
    *error = std::move(problem);
    return nullptr;
  }
  grpc::SslCredentialsOptions options;
  if (!sec.ca_file.empty() &&
      !ReadWholeFile(sec.ca_file, "tls ca file", &options.pem_root_certs, error)) {
    return nullptr;
  }
  if (!sec.cert_file.empty() &&
      (!ReadWholeFile(sec.cert_file, "tls cert file", &options.pem_cert_chain, error) ||
       !ReadWholeFile(sec.key_file, "tls key file", &options.pem_private_key, error))) {
    return nullptr;
  }
  return grpc::SslCredentials(options);
}

}  // namespace straggler
