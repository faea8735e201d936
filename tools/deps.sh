#!/usr/bin/env bash
# Installs what sluice needs to build and test on Debian 12 / Ubuntu 24.04 (a no-op when all is present).
#
# CUDA: an existing toolkit is used as it is (nvcc on PATH, in /usr/local/cuda or /usr/local/cuda-*),
# and nothing CUDA is installed. Without one:
#   - on a machine with an NVIDIA driver, nothing is installed either (the distribution's toolkit would
#     bring its own driver libraries over the installed ones): sluice builds for the CPU and this script
#     says how to add NVIDIA's toolkit;
#   - on a machine without a driver, the distribution's toolkit is installed (Debian: the contrib and
#     non-free components are enabled for it; Ubuntu: multiverse), with the host compiler it accepts.
# SLUICE_NO_CUDA=1 skips CUDA altogether. tools/cuda-env.sh tells the build which nvcc and host compiler
# to use; cmake finds them through it as well.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pkgs=(build-essential cmake pkg-config libjansson-dev libpcre2-dev libutf8proc-dev libedit-dev libcriterion-dev
      xz-utils jq libmicrohttpd-dev liburing-dev libcurl4-openssl-dev curl ca-certificates python3 libssl-dev)
# the fuzzers (tools/fuzz.sh, run by CI) need clang and libFuzzer's runtime; Debian 12 ships them as clang 14
if [ -z "${SLUICE_NO_FUZZ:-}" ] && apt-cache show libclang-rt-14-dev >/dev/null 2>&1; then
    pkgs+=(clang libclang-rt-14-dev)
fi
# the server tests drive it with the JavaScript SDKs; any node >= 18 with npm will do (Debian's or another)
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then pkgs+=(nodejs npm); fi

os_id="" os_codename=""
if [ -r /etc/os-release ]; then
    os_id=$(. /etc/os-release && echo "${ID:-}")
    os_codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
fi
say() { printf 'deps: %s\n' "$*" >&2; }

# --- CUDA: what is here already -------------------------------------------------------------------
# shellcheck source=tools/cuda-env.sh
. "$here/cuda-env.sh"
cuda_pkgs=() components=()
if [ -n "${SLUICE_NO_CUDA:-}" ]; then
    say "SLUICE_NO_CUDA is set: building the CPU backend only"
elif [ -n "$SLUICE_NVCC" ]; then
    say "using the CUDA toolkit at $(dirname "$(dirname "$SLUICE_NVCC")") ($("$SLUICE_NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
elif sluice_has_nvidia_driver; then
    say "an NVIDIA driver is installed but no CUDA toolkit (nvcc) was found: sluice will build for the CPU only."
    say "To use the GPU, install NVIDIA's CUDA toolkit for your driver (it goes to /usr/local/cuda), then run"
    say "this again. The distribution's toolkit is not installed here: it brings driver libraries of its own."
else
    case "$os_id" in
        debian) cuda_pkgs=(nvidia-cuda-toolkit g++-11) components=(contrib non-free) ;;
        ubuntu) cuda_pkgs=(nvidia-cuda-toolkit g++-12) components=(multiverse) ;;
        *) say "no CUDA toolkit found and none is packaged for '${os_id:-this system}' here: CPU backend only" ;;
    esac
fi

all=("${pkgs[@]}" "${cuda_pkgs[@]}")
if dpkg -s "${all[@]}" >/dev/null 2>&1; then exit 0; fi
if ! command -v apt-get >/dev/null; then
    say "this script installs with apt-get (Debian, Ubuntu); install these by hand: ${all[*]}"
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive

# Enables the named components of the distribution's own archive where no source has them yet.
enable_components() {
    local missing=() c
    for c in "$@"; do
        if ! grep -rqsE "^(Components:|deb(-src)? ).*[[:space:]]$c([[:space:]]|\$)" \
            /etc/apt/sources.list /etc/apt/sources.list.d/; then missing+=("$c"); fi
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    say "enabling the ${missing[*]} component(s) of the $os_id archive for the CUDA toolkit"
    local uris suites key
    if [ "$os_id" = debian ]; then
        uris=http://deb.debian.org/debian suites="$os_codename $os_codename-updates"
        key=/usr/share/keyrings/debian-archive-keyring.gpg
    else
        uris=http://archive.ubuntu.com/ubuntu suites="$os_codename $os_codename-updates"
        key=/usr/share/keyrings/ubuntu-archive-keyring.gpg
    fi
    printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: %s\nSigned-By: %s\n' "$uris" "$suites" "${missing[*]}" "$key" |
        $SUDO tee /etc/apt/sources.list.d/sluice-cuda.sources >/dev/null
}
if [ ${#cuda_pkgs[@]} -gt 0 ]; then
    say "no CUDA toolkit and no NVIDIA driver found: installing the $os_id CUDA toolkit (SLUICE_NO_CUDA=1 skips it)"
    enable_components "${components[@]}"
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${all[@]}" >/dev/null
