#!/usr/bin/env bash
# Installs, from Debian's packages, what building warp-tdt needs and this machine lacks.
#   scripts/install-deps.sh          the library and tdt_demo: cmake, a C/C++ compiler, OpenMP
#   scripts/install-deps.sh --test   also the test suite: GoogleTest sources, Debian's PyTorch,
#                                    numpy and pytest (for the binding's tests), clang (fuzzer)
# Packages already installed are left alone; nothing is downloaded when nothing is missing.
set -euo pipefail

packages=(cmake make gcc g++ libgomp1 pkg-config)
if [[ "${1:-}" == "--test" ]]; then
  packages+=(googletest libgtest-dev python3 python3-torch python3-numpy python3-pytest clang libclang-rt-dev)
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
