#!/usr/bin/env bash
# Installs the dependencies, builds, and runs the whole test suite with ctest.
#
#   bash scripts/test.sh [extra ctest options, e.g. -L integration or -R engine]
#
# Environment: SKIP_DEPS=1 skips install-deps.sh; BUILD_DIR (default: build);
# CTEST_JOBS (default: 2); CTEST_TIMEOUT per test in seconds for tests that set
# no TIMEOUT of their own (default: 900). Exits with ctest's exit code.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD_DIR=${BUILD_DIR:-build}
export BUILD_DIR

if [[ "${SKIP_DEPS:-0}" != "1" ]]; then
  bash scripts/install-deps.sh
fi
bash scripts/build.sh

echo "test.sh: ctest --test-dir $BUILD_DIR --output-on-failure -j${CTEST_JOBS:-2}"
set +e
ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error \
  -j "${CTEST_JOBS:-2}" --timeout "${CTEST_TIMEOUT:-900}" "$@"
rc=$?
set -e
if [[ $rc -ne 0 ]]; then
  echo "test.sh: ctest FAILED (exit $rc)" >&2
else
  echo "test.sh: all tests passed"
fi
exit "$rc"
