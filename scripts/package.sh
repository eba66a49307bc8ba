#!/usr/bin/env bash
# Builds the Debian packages (stragglerd, libstraggler0, and the collective and
# GPU library packages where the build has those parts) from an already built
# tree with CPack: nothing is recompiled, CPack runs the tree's install rules
# into a staging root under /usr (cmake/StragglerPackaging.cmake says what
# goes where). Build first with scripts/build.sh.
#
#   bash scripts/package.sh [OUTPUT_DIR]     (default: $BUILD_DIR/packages)
#
# Environment: BUILD_DIR (default: build). Needs dpkg-dev (dpkg-shlibdeps)
# and file; scripts/install-deps.sh installs them.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
OUT=${1:-$BUILD_DIR/packages}

if [[ ! -f "$BUILD_DIR/CPackConfig.cmake" ]]; then
  echo "package.sh: $BUILD_DIR/CPackConfig.cmake not found; build with scripts/build.sh first" >&2
  exit 1
fi
mkdir -p "$OUT"
cpack -G DEB --config "$BUILD_DIR/CPackConfig.cmake" -B "$OUT"
rm -rf "$OUT/_CPack_Packages"
ls -l "$OUT"/*.deb
