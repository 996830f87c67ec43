#!/usr/bin/env bash
# test-deps.sh installs the Debian packages the tests need, if any are missing.
#
#   scripts/test-deps.sh [PACKAGE...]
#
# With no packages, or when all are installed, it does nothing. Missing
# packages are installed with apt-get as root, or through sudo when sudo works
# without a password; otherwise it says what is missing and how to install it,
# and exits 0 so that a developer without root can still run the tests that
# do not need them. Safe to run any number of times, without a terminal.
set -euo pipefail

if [ "$#" -eq 0 ]; then
	exit 0
fi

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
	echo "test-deps: not a Debian-like system; make sure these are installed: $*" >&2
	exit 0
fi

missing=()
for pkg in "$@"; do
	status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
	if [ "$status" != "install ok installed" ]; then
		missing+=("$pkg")
	fi
done
if [ "${#missing[@]}" -eq 0 ]; then
	exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
	as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
	as_root=(sudo -n)
else
	echo "test-deps: missing ${missing[*]}; install with: sudo apt-get install -y ${missing[*]}" >&2
	exit 0
fi

echo "test-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
