#include "straggler/common/channel_security.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

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
  // An ifstream opens a directory and reads it as empty: say what it is.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    *error = "cannot read " + std::string(what) + " " + path + ": " + std::strerror(EISDIR);
    return false;
  }
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad()) {
    const int e = errno;
    *error = "cannot read " + std::string(what) + " " + path + ": " +
             (e != 0 ? std::strerror(e) : "read error");
    return false;
  }
  *out = text.str();
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
