#!/bin/sh
# Usage: run.sh CMAKE BUILD_DIR CONSUMER_SRC SCRATCH [cuda] [collective] [collective_nccl]
# Installs the `client` component of BUILD_DIR (libstraggler, its headers and
# the package config: what a trainer's machine gets) into SCRATCH/prefix, then
# configures, builds and runs the consumer project against it. The component
# keeps this test independent of whether the daemon and tools were built.
# Each further component named (those the build has) is installed too, and
# the consumer must find it and run its program against it.
set -eu
cmake=$1 build=$2 src=$3 scratch=$4
shift 4
rm -rf "$scratch"
mkdir -p "$scratch"
cuda=OFF collective=OFF nccl=OFF
for c in "$@"; do
  case $c in
    cuda) cuda=ON ;;
    collective) collective=ON ;;
    collective_nccl) nccl=ON ;;
    *) echo "run.sh: unknown component '$c'" >&2; exit 2 ;;
  esac
done
for component in client "$@"; do
  "$cmake" --install "$build" --component "$component" --prefix "$scratch/prefix" \
    >>"$scratch/install.log" 2>&1 || { cat "$scratch/install.log"; exit 1; }
done
"$cmake" -S "$src" -B "$scratch/build" -DCMAKE_PREFIX_PATH="$scratch/prefix" \
  -DSTRAGGLER_EXPECT_CUDA=$cuda -DSTRAGGLER_EXPECT_COLLECTIVE=$collective \
  -DSTRAGGLER_EXPECT_COLLECTIVE_NCCL=$nccl >"$scratch/configure.log" 2>&1 || {
  cat "$scratch/configure.log"; exit 1; }
"$cmake" --build "$scratch/build" >"$scratch/build.log" 2>&1 || { cat "$scratch/build.log"; exit 1; }
export LD_LIBRARY_PATH="$scratch/prefix/lib:$scratch/prefix/lib64:$scratch/prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"$scratch/build/consumer"
[ "$cuda" = ON ] && "$scratch/build/consumer_cuda"
[ "$collective" = ON ] && "$scratch/build/consumer_collective"
if [ "$nccl" = ON ]; then
  # libnccl is a run-time dependency of the NCCL backend, found where it was built.
  LD_LIBRARY_PATH="$LD_LIBRARY_PATH:${STRAGGLER_NCCL_LIBDIR:-}" "$scratch/build/consumer_collective_nccl"
fi
exit 0
