// The console's files, generated at build time from daemon/src/console/assets
// by embed_assets.cmake (console_assets.cc in the build tree). Constant data.
#pragma once

#include <span>
#include <string_view>

namespace straggler::daemon {

// One built-in file of the console.
struct ConsoleAsset {
  std::string_view path;          // "/", "/console/console.js", ...
  std::string_view content_type;  // with charset
  std::string_view body;
};

std::span<const ConsoleAsset> ConsoleAssets();

}  // namespace straggler::daemon
