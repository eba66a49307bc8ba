#!/usr/bin/env bash
# Installs every Debian 12 package that building and testing stragglerd needs.
#
# Idempotent and non-interactive: when every package is already installed it
# says so and returns at once without touching apt. Otherwise it runs
# `apt-get update` once and installs only what is missing. Runs as root, or
# through sudo when sudo is available (non-interactively when there is no
# terminal, so CI never waits on a password prompt).
set -euo pipefail

# Keep this list in sync with the find_package() calls in the CMake files.
PACKAGES=(
  curl  # integration:security fetches /metrics over HTTPS with curl --cacert
  # toolchain
  build-essential g++ cmake ninja-build ccache pkg-config git python3
  # gRPC / protobuf (gRPCConfig.cmake also finds ZLIB, OpenSSL, c-ares, re2, absl)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libssl-dev zlib1g-dev libc-ares-dev libre2-dev
  # libraries
  libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev libcpp-httplib-dev
  nlohmann-json3-dev libsqlite3-dev
  # /metrics: prometheus-cpp core's data model (prometheus-cpp::core only)
  prometheus-cpp-dev
  # the libFuzzer targets (fuzz/, scripts/fuzz.sh, ctest fuzz:smoke): clang
  # and its runtime libraries (libFuzzer, ASan, UBSan); clang++ also runs the
  # -Wthread-safety pass (ctest layout:thread_safety, docs/development.md)
  clang-14 libclang-rt-14-dev
  # tests and benchmarks; prometheus ships /usr/bin/prometheus and promtool for
  # the observability tests, which start their own server (never the service)
  catch2 libbenchmark-dev prometheus
  # the replicas' etcd (issue 30, docs/cluster.md): the cluster: tests start
  # their own etcd on free loopback ports, never the packaged service;
  # etcdctl (etcd-client) to look at the keys by hand
  etcd-server etcd-client
  # the web console's browser test (integration:console_browser) drives
  # headless Chromium over the DevTools protocol
  chromium
  # the TLS tests make their certificates with the openssl command
  openssl
  # deploy/ linters (tests/deploy): systemd-analyze (systemd), yamllint, and
  # the Kubernetes API models of the official Python client
  systemd yamllint python3-kubernetes python3-yaml
  # the collective layer (straggler_collective: Gloo CPU backend)
  libgloo-dev
  # the straggler Python package (python/: pybind11 against Debian's python3)
  # and its PyTorch DDP test; Debian's python3-torch is 1.13, CPU only, and
  # links the same libgloo as straggler_collective
  python3-dev pybind11-dev python3-pybind11 python3-numpy python3-torch
  # `pip install ./python` into a venv (python/pyproject.toml, test
  # python:pip_install_venv): venv, pip and the setuptools build backend
  python3-venv python3-pip python3-setuptools python3-wheel
  # scripts/gpu-bundle.sh (test gpu:bundle): rpaths of the bundled binaries
  patchelf
  # the Debian packages (scripts/package.sh, tests package:deb and
  # package:lintian): CPack's DEB generator runs dpkg-shlibdeps (dpkg-dev) and
  # file; lintian checks the .debs
  dpkg-dev file lintian
)

log() { printf 'install-deps: %s\n' "$*"; }

missing_packages() {
  local pkg status
  for pkg in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
    if [[ "$status" != "installed" ]]; then
      printf '%s\n' "$pkg"
    fi
  done
}

mapfile -t MISSING < <(missing_packages)
if [[ ${#MISSING[@]} -eq 0 ]]; then
  log "all ${#PACKAGES[@]} packages are already installed; nothing to do"
  exit 0
fi
log "missing ${#MISSING[@]} of ${#PACKAGES[@]} packages: ${MISSING[*]}"

if ! command -v apt-get >/dev/null 2>&1; then
  log "ERROR: apt-get not found; this script supports Debian 12 (bookworm) only" >&2
  exit 1
fi

SUDO=()
if [[ ${EUID} -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    if [[ -t 0 ]]; then SUDO=(sudo); else SUDO=(sudo -n); fi
  else
    log "ERROR: not root and sudo is not available; run as root: bash $0" >&2
    exit 1
  fi
fi

APT=("${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get
     -o Acquire::Retries=3 -o DPkg::Lock::Timeout=300)

# Packages with a service (prometheus, etcd-server) start it from their
# postinst. Where no init system runs (a container, a chroot) that start can
# only fail, so keep invoke-rc.d from trying for the duration of the
# install, unless the image already has a policy (Docker's Debian images do).
# With systemd running, the services are left to the packages' defaults; the
# tests never use them.
POLICY_RC=/usr/sbin/policy-rc.d
if [[ ! -d /run/systemd/system && ! -e "$POLICY_RC" ]]; then
  log "no init system running: disabling service starts during the install ($POLICY_RC)"
  printf '#!/bin/sh\n# temporary, from stragglerd scripts/install-deps.sh\nexit 101\n' |
    "${SUDO[@]}" tee "$POLICY_RC" >/dev/null
  "${SUDO[@]}" chmod 755 "$POLICY_RC"
  trap '"${SUDO[@]}" rm -f "$POLICY_RC"' EXIT
fi

log "apt-get update"
"${APT[@]}" update -q
log "apt-get install ${MISSING[*]}"
"${APT[@]}" install -y -q --no-install-recommends \
  -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
  "${MISSING[@]}"

mapfile -t STILL_MISSING < <(missing_packages)
if [[ ${#STILL_MISSING[@]} -ne 0 ]]; then
  log "ERROR: still not installed after apt-get: ${STILL_MISSING[*]}" >&2
  exit 1
fi
log "all ${#PACKAGES[@]} packages installed"
