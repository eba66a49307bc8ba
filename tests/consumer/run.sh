#!/bin/sh
# Usage: run.sh CMAKE BUILD_DIR CONSUMER_SRC SCRATCH
# Installs the `client` component of BUILD_DIR (libstraggler, its headers and
# the package config: what a trainer's machine gets) into SCRATCH/prefix, then
# configures, builds and runs the consumer project against it. The component
# keeps this test independent of whether the daemon and tools were built.
set -eu
cmake=$1 build=$2 src=$3 scratch=$4
rm -rf "$scratch"
mkdir -p "$scratch"
"$cmake" --install "$build" --component client --prefix "$scratch/prefix" >"$scratch/install.log" 2>&1 || {
  cat "$scratch/install.log"; exit 1; }
"$cmake" -S "$src" -B "$scratch/build" -DCMAKE_PREFIX_PATH="$scratch/prefix" >"$scratch/configure.log" 2>&1 || {
  cat "$scratch/configure.log"; exit 1; }
"$cmake" --build "$scratch/build" >"$scratch/build.log" 2>&1 || { cat "$scratch/build.log"; exit 1; }
LD_LIBRARY_PATH="$scratch/prefix/lib:$scratch/prefix/lib64:$scratch/prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$scratch/build/consumer"
