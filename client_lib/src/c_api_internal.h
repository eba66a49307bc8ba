// The definition behind the opaque straggler_client_t, private to this source
// tree: libstraggler_cuda's C ABI (client_lib/cuda) reaches the C++ client
// of a straggler_client_t through it. Both libraries are built from the same
// tree in one build, so they always agree on this layout. Also the error
// reporting both C ABIs share (WriteError, CreateHandle).
#pragma once

#include <cstddef>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "straggler/client.h"

struct straggler_client {
  std::unique_ptr<straggler::Client> client;
};

namespace straggler::c_api {

// Copies `message` into the caller's buffer of `errlen` bytes, truncated and
// NUL-terminated; nothing when the caller passed none.
inline void WriteError(char* err, size_t errlen, const std::string& message) {
  if (err == nullptr || errlen == 0) return;
  std::snprintf(err, errlen, "%s", message.c_str());
}

// The body of the C create function `function`: `make(&error)` builds the C++
// object (nullptr and `error` when it cannot); it is returned as a new
// Handle{object} with `err` set to "". Otherwise nullptr, with `err` holding
// the error, or "FUNCTION: " and the message of an exception (none escapes
// into C).
template <class Handle, class Make>
Handle* CreateHandle(const char* function, char* err, size_t errlen, Make&& make) {
  try {
    std::string error;
    auto made = make(&error);
    if (!made) {
      WriteError(err, errlen, error);
      return nullptr;
    }
    WriteError(err, errlen, "");
    return new Handle{std::move(made)};
  } catch (const std::exception& e) {
    WriteError(err, errlen, std::string(function) + ": " + e.what());
  } catch (...) {
    WriteError(err, errlen, std::string(function) + ": unknown error");
  }
  return nullptr;
}

}  // namespace straggler::c_api
