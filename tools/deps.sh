#!/usr/bin/env bash
# Installs what sluice needs to build and test on Debian/Ubuntu (a no-op when everything is present).
set -euo pipefail
pkgs=(build-essential cmake pkg-config libjansson-dev libpcre2-dev libutf8proc-dev libedit-dev libcriterion-dev
      xz-utils jq libmicrohttpd-dev curl)
# the server tests drive it with the JavaScript SDKs; any node >= 18 with npm will do (Debian's or another)
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then pkgs+=(nodejs npm); fi
if dpkg -s "${pkgs[@]}" >/dev/null 2>&1; then exit 0; fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq "${pkgs[@]}" >/dev/null
