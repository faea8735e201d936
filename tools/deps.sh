#!/usr/bin/env bash
# Installs what sluice needs to build and test on Debian/Ubuntu (a no-op when everything is present).
# On Debian this includes the CUDA toolkit from the non-free component (enabled here when missing), so
# the CUDA backend is compiled, and g++-11, the newest host compiler Debian's nvcc 11.8 accepts;
# SLUICE_NO_CUDA=1 skips both.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libjansson-dev libpcre2-dev libutf8proc-dev libedit-dev libcriterion-dev
      xz-utils jq libmicrohttpd-dev liburing-dev curl)
# the server tests drive it with the JavaScript SDKs; any node >= 18 with npm will do (Debian's or another)
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then pkgs+=(nodejs npm); fi
cuda=0
if [ -z "${SLUICE_NO_CUDA:-}" ] && [ -r /etc/os-release ] && grep -qx 'ID=debian' /etc/os-release; then
    cuda=1
    pkgs+=(nvidia-cuda-toolkit g++-11)
fi
if dpkg -s "${pkgs[@]}" >/dev/null 2>&1; then exit 0; fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
if [ $cuda = 1 ] && ! grep -rqsE '^(Components:|deb ).*non-free( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    . /etc/os-release
    printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s %s-updates\nComponents: non-free\n%s\n' \
        "$VERSION_CODENAME" "$VERSION_CODENAME" "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" |
        $SUDO tee /etc/apt/sources.list.d/sluice-non-free.sources >/dev/null
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
