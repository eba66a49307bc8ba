#include "straggler/common/config_reader.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

namespace straggler::common {

absl::StatusOr<std::string> ReadConfigFile(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "config file ", path,
        std::filesystem::is_directory(status) ? " is a directory" : " is not a regular file",
        ", not a YAML file"));
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read config file ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status ValidateAddress(absl::string_view key, absl::string_view address,
                             bool allow_unix) {
  if (address.rfind("unix:", 0) == 0) {
    if (!allow_unix) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, "=", address, " must be HOST:PORT (no unix: sockets for HTTP)"));
    }
    if (address.size() > 5) return absl::OkStatus();
  }
  const size_t colon = address.rfind(':');
  uint32_t port = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, "=", address, " is not HOST:PORT (port 0 picks a free port)"));
  }
  return absl::OkStatus();
}

std::optional<std::string> GetEnv(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

absl::Status ValidateLogLevel(absl::string_view level) {
  for (const char* ok : {"trace", "debug", "info", "warn", "error"}) {
    if (level == ok) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("log_level=", level, " is not one of trace, debug, info, warn, error"));
}

}  // namespace straggler::common
