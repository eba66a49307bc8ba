// Strict unsigned parse shared inside client_lib (environment variables,
// rendezvous values): digits only, no sign, no spaces, within range.
// Thread-safe: a pure function.
#pragma once

#include <charconv>
#include <string_view>
#include <system_error>

namespace straggler::detail {

template <typename T>
bool ParseUnsigned(std::string_view s, T* out) {
  if (s.empty()) return false;
  T v{};
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 10);
  if (ec != std::errc() || ptr != s.data() + s.size()) return false;
  *out = v;
  return true;
}

}  // namespace straggler::detail
