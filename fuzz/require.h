// The invariant check of the fuzz targets: a broken one is a finding, so it
// aborts (libFuzzer then keeps the input as a crash artifact).
#pragma once

#include <cstdio>
#include <cstdlib>

namespace straggler::fuzz {

inline void Require(bool ok, const char* target, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "%s: invariant broken: %s\n", target, what);
  std::abort();
}

}  // namespace straggler::fuzz
