#!/usr/bin/env bash
# Installs every Debian package Strata's build, tests and tools need.
# Idempotent: when everything is present it only checks and returns.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev nlohmann-json3-dev libpcre2-dev libspdlog-dev
  # the HTTP front end and /metrics ports (docs/http.md, docs/metrics.md); curl
  # for their end-to-end tests
  libcpp-httplib-dev curl
  libgtest-dev libgmock-dev libbenchmark-dev
  # the sanitize and fuzz stages of scripts/test.sh: clang, its sanitizer and
  # libFuzzer runtimes (libclang-rt-dev), llvm-symbolizer for readable reports
  clang libclang-rt-dev llvm
  python3 python3-grpcio python3-grpc-tools python3-yaml
  openssl
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
