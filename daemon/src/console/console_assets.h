// The console's files, generated at build time from daemon/src/console/assets
// by embed_assets.cmake (console_assets.cc in the build tree). Constant data.
#pragma once

#include <span>

#include "console/console.h"

namespace straggler::daemon {

std::span<const ConsoleAsset> ConsoleAssets();

}  // namespace straggler::daemon
