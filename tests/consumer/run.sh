#!/bin/sh
# Usage: run.sh CMAKE BUILD_DIR CONSUMER_SRC SCRATCH [cuda]
# Installs the `client` component of BUILD_DIR (libstraggler, its headers and
# the package config: what a trainer's machine gets) into SCRATCH/prefix, then
# configures, builds and runs the consumer project against it. The component
# keeps this test independent of whether the daemon and tools were built.
# With `cuda` (a build with straggler::cuda) the `cuda` component is installed
# too, and the consumer must find and run it.
set -eu
cmake=$1 build=$2 src=$3 scratch=$4 cuda=${5:-}
rm -rf "$scratch"
mkdir -p "$scratch"
for component in client ${cuda:+cuda}; do
  "$cmake" --install "$build" --component "$component" --prefix "$scratch/prefix" \
    >>"$scratch/install.log" 2>&1 || { cat "$scratch/install.log"; exit 1; }
done
expect=OFF
[ -n "$cuda" ] && expect=ON
"$cmake" -S "$src" -B "$scratch/build" -DCMAKE_PREFIX_PATH="$scratch/prefix" \
  -DSTRAGGLER_EXPECT_CUDA=$expect >"$scratch/configure.log" 2>&1 || {
  cat "$scratch/configure.log"; exit 1; }
"$cmake" --build "$scratch/build" >"$scratch/build.log" 2>&1 || { cat "$scratch/build.log"; exit 1; }
export LD_LIBRARY_PATH="$scratch/prefix/lib:$scratch/prefix/lib64:$scratch/prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"$scratch/build/consumer"
if [ -n "$cuda" ]; then
  "$scratch/build/consumer_cuda"
fi
