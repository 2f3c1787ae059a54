#!/usr/bin/env bash
# Installs, from Debian's packages, what building warp-tdt needs and this machine lacks.
#   scripts/install-deps.sh          the library and tdt_demo: cmake, a C/C++ compiler, OpenMP
#                                    (the CUDA backend is built where nvcc is found; CUDA itself
#                                    is not installed here)
#   scripts/install-deps.sh --test   also everything the test suite uses: GoogleTest sources,
#                                    Debian's PyTorch, torchaudio, numpy and pytest (the
#                                    binding's tests), python3-venv, setuptools and wheel (the
#                                    wheel test), pkg-config (the install test), OpenBLAS, clang
#                                    (the fuzzer), and the aarch64 cross compiler with qemu-user
#                                    (the aarch64 build's tests)
# Packages already installed are left alone; nothing is downloaded when nothing is missing.
set -euo pipefail

case "${1:-}" in
  "" | --test) ;;
  *) echo "usage: $0 [--test]" >&2; exit 2 ;;
esac

packages=(cmake make gcc g++ libgomp1)
if [[ "${1:-}" == "--test" ]]; then
  packages+=(googletest libgtest-dev pkg-config libopenblas-dev clang libclang-rt-dev
             python3 python3-torch python3-torchaudio python3-numpy python3-pytest
             python3-venv python3-setuptools python3-wheel python3-pip
             gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
