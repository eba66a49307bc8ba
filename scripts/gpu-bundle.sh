#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs into one folder of at most 64 MiB for a
# GPU machine that has Python, torch, pip's NCCL, pybind11, CMake and ninja but
# no Debian -dev packages (no gRPC or protobuf to build against) and nothing to
# fetch (docs/gpu.md):
#
#   bash scripts/gpu-bundle.sh [--build-dir build] [--out DIR]
#   # on the GPU machine, in DIR:
#   bash run-gpu-check.sh --require-gpu
#
# DIR (default BUILD/gpu-bundle) holds
#   bin/      the built binaries (daemon, agent, sim, ctl, the collective
#             driver, the CUDA timer test), debug info stripped, RPATH $ORIGIN/../lib
#   lib/      the project's shared libraries and their shared-library closure,
#             RPATH $ORIGIN, minus what the GPU machine must bring itself:
#             libcuda and libnvidia-ml (the driver's), libnccl (pip's
#             nvidia-nccl-cu13 or torch's: the backend picks its calls by the
#             version loaded), glibc, and libstdc++/libgcc_s (the machine's own
#             are as new or newer, and a module built there with a newer
#             compiler needs them)
#   include/  the public headers and what they include (straggler/, gloo/)
#   python/   the package's Python files and the extension's sources;
#             build-python.sh builds the extension there with that machine's
#             compiler, Python and pybind11 against lib/ (if Python's headers,
#             pybind11 or a compiler are missing it says so, and the Python
#             checks are skipped: the C++ paths still run)
#   tests/, scripts/  gpu-check.sh, its helpers and the test scripts it runs
# Fails, naming the file, when a binary's dependency cannot be resolved here,
# and when the folder exceeds the limit (LIMIT_MIB, default 64).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$REPO/build
OUT=""
LIMIT_MIB=${LIMIT_MIB:-64}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) BUILD=$(cd "$2" && pwd); shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,31p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "gpu-bundle.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-$BUILD/gpu-bundle}
log() { printf 'gpu-bundle.sh: %s\n' "$*"; }
die() { printf 'gpu-bundle.sh: ERROR: %s\n' "$*" >&2; exit 1; }
command -v patchelf >/dev/null || die "patchelf not found (Debian package patchelf; scripts/install-deps.sh installs it)"
[[ -x $BUILD/daemon/stragglerd ]] || die "$BUILD/daemon/stragglerd not built (bash scripts/build.sh first)"

rm -rf "$OUT"
mkdir -p "$OUT"/{bin,lib,include,python/src,python/straggler,tests/integration,tests/collective,scripts}

# name=path in the build tree; the first is required, the rest are packed
# when this build has them (no CUDA: no timer test; no NCCL: a Gloo-only driver).
BINARIES=(stragglerd=daemon/stragglerd straggler-agent=agent/straggler-agent
          straggler-sim=tools/straggler-sim/straggler-sim stragglerctl=tools/stragglerctl/stragglerctl
          straggler-collective-driver=tests/straggler-collective-driver
          cuda_timer_gpu_tests=tests/cuda_timer_gpu_tests)
packed=()
for entry in "${BINARIES[@]}"; do
  name=${entry%%=*}
  src=$BUILD/${entry#*=}
  if [[ -x $src ]]; then
    cp "$src" "$OUT/bin/$name"
    packed+=("$name")
  else
    log "not in this build, left out: $src"
  fi
done

# The libraries the GPU machine brings itself (see the header).
EXCLUDE='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so|libanl\.so|libnsl\.so|libcuda\.so|libnccl\.so|libnvidia-ml\.so|libstdc\+\+\.so|libgcc_s\.so)'
# Everything the binaries load, and what the Python extension links (the
# collective libraries and Gloo, whose Store it subclasses).
elves=("$OUT"/bin/*)
for lib in "$BUILD"/client_lib/libstraggler_collective.so "$BUILD"/client_lib/libstraggler_collective_nccl.so; do
  [[ -e $lib ]] && elves+=("$lib")
done
declare -A seen=()
for elf in "${elves[@]}"; do
  while read -r soname arrow path _; do
    [[ $arrow == "=>" ]] || continue
    [[ $soname =~ $EXCLUDE ]] && continue
    if [[ $path == "not" ]]; then die "$elf: $soname not found here (ldd)"; fi
    [[ -n ${seen[$soname]:-} ]] && continue
    seen[$soname]=1
    cp -L "$path" "$OUT/lib/$soname"
  done < <(ldd "$elf")
done
# The Python extension links the collective libraries even when no binary
# here needs them by that name.
for lib in libstraggler_collective.so libstraggler_collective_nccl.so; do
  if [[ -e $BUILD/client_lib/$lib && ! -e $OUT/lib/$lib.0 ]]; then cp -L "$BUILD/client_lib/$lib" "$OUT/lib/$lib.0"; fi
done

chmod u+w "$OUT"/bin/* "$OUT"/lib/*
strip --strip-debug "$OUT"/bin/* "$OUT"/lib/* 2>/dev/null || true
for f in "$OUT"/bin/*; do patchelf --set-rpath '$ORIGIN/../lib' "$f"; done
for f in "$OUT"/lib/*; do patchelf --set-rpath '$ORIGIN' "$f"; done

# Public headers and their closure.
cp -r "$REPO"/client_lib/include/straggler "$OUT/include/"
gloo_store=$(printf '#include <gloo/rendezvous/store.h>\n' | c++ -x c++ -std=c++20 -M - 2>/dev/null |
             tr ' \\' '\n\n' | grep '/gloo/rendezvous/store.h$' | head -n 1 || true)
[[ -n $gloo_store ]] || die "gloo/rendezvous/store.h not found (Debian package libgloo-dev)"
cp -r "${gloo_store%/rendezvous/store.h}" "$OUT/include/gloo"

# The Python package: its .py files, the extension's sources and how to build it.
cp "$REPO"/python/straggler/*.py "$OUT/python/straggler/"
cp "$REPO"/python/src/*.cc "$REPO"/python/src/*.h "$OUT/python/src/"
cat >"$OUT/build-python.sh" <<'EOF'
#!/usr/bin/env bash
# Builds python/straggler/_straggler*.so here, with this machine's compiler,
# Python and pybind11, against the bundle's lib/ (written by gpu-bundle.sh).
# Exit 0: built; 3: something is missing here (said why), the C++ checks
# still run; other: the build failed.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${PYTHON:-python3}
CXX=${CXX:-c++}
say() { printf 'build-python.sh: %s\n' "$*"; }
inc=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])" 2>/dev/null)
if [[ -z $inc || ! -f $inc/Python.h ]]; then
  say "Python headers missing (${inc:-no include dir}/Python.h): the Python checks are skipped, the C++ paths run"
  exit 3
fi
pyb=$("$PY" -c "import pybind11; print(pybind11.get_include())" 2>/dev/null)
if [[ -z $pyb ]]; then say "pybind11 is not importable by $PY: the Python checks are skipped"; exit 3; fi
if ! command -v "$CXX" >/dev/null; then say "no C++ compiler ($CXX): the Python checks are skipped"; exit 3; fi
suffix=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
libs=("$HERE/lib/libstraggler_collective.so.0" "$HERE/lib/libstraggler.so.0" "$HERE/lib/libgloo.so.0")
defs=()
if [[ -f $HERE/lib/libstraggler_collective_nccl.so.0 ]]; then
  defs=(-DSTRAGGLER_WITH_NCCL)
  libs=("$HERE/lib/libstraggler_collective_nccl.so.0" "${libs[@]}")
fi
out=$HERE/python/straggler/_straggler$suffix
say "building $out (${defs[*]:-Gloo only}) with $("$CXX" --version | head -n 1)"
"$CXX" -O2 -std=c++20 -shared -fPIC -fvisibility=hidden "${defs[@]}" -I"$inc" -I"$pyb" -I"$HERE/include" \
  "$HERE"/python/src/*.cc -o "$out" "${libs[@]}" \
  -Wl,-rpath,'$ORIGIN/../../lib' || { say "the build failed"; exit 1; }
say "built"
EOF
cat >"$OUT/run-gpu-check.sh" <<'EOF'
#!/usr/bin/env bash
# On the GPU machine: build the Python extension (skipped with the reason if
# this machine cannot), then run every GPU check (arguments go to gpu-check.sh).
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bash "$HERE/build-python.sh"
rc=$?
if [[ $rc -ne 0 && $rc -ne 3 ]]; then echo "run-gpu-check.sh: build-python.sh failed (exit $rc)"; fi
exec bash "$HERE/scripts/gpu-check.sh" --root "$HERE" "$@"
EOF
chmod +x "$OUT/build-python.sh" "$OUT/run-gpu-check.sh"

# The checks and the test scripts they run.
cp "$REPO"/scripts/gpu-check.sh "$REPO"/scripts/gpu-check-helpers.py "$OUT/scripts/"
cp "$REPO"/tests/integration/{harness.py,agent_test.py,collective_test.py} "$OUT/tests/integration/"
cp "$REPO"/tests/collective/python_nccl_test.py "$OUT/tests/collective/"

bytes=$(du -sb "$OUT" | cut -f1)
mib=$(( (bytes + 1048575) / 1048576 ))
log "packed ${packed[*]}; $(ls "$OUT/lib" | wc -l) libraries; $bytes bytes (${mib} MiB) in $OUT"
if (( bytes > LIMIT_MIB * 1048576 )); then
  du -sb "$OUT"/lib/* | sort -n | tail -n 5 >&2
  die "the bundle is $bytes bytes, over the limit of $LIMIT_MIB MiB (largest libraries above)"
fi
