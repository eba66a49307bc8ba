// The bound every caller-supplied wait of the client goes through.
#pragma once

#include <algorithm>
#include <chrono>

namespace straggler::detail {

// condition_variable::wait_for adds the timeout to now(); clamp so a caller's
// milliseconds::max() means "a very long time", not an overflowed deadline,
// and a negative one means "do not wait".
inline std::chrono::milliseconds ClampTimeout(std::chrono::milliseconds t) {
  constexpr auto kLongestWait = std::chrono::hours(24 * 365);
  if (t.count() < 0) return std::chrono::milliseconds(0);
  return std::min<std::chrono::milliseconds>(t, kLongestWait);
}

}  // namespace straggler::detail
