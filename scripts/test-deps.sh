#!/usr/bin/env bash
# test-deps.sh installs what the tests need, if any of it is missing.
#
#   scripts/test-deps.sh [--npm DIR]... [PACKAGE...]
#
# PACKAGEs are Debian packages. Each --npm DIR is a directory with a
# package.json and a package-lock.json whose packages the tests run: npm ci
# installs them there from the npm registry, with node and npm from
# Debian's nodejs and npm packages when they are not on PATH.
#
# With nothing missing it does nothing: npm ci runs again only when
# DIR/package-lock.json changed since its last install. Missing Debian
# packages are installed with apt-get as root, or through sudo when sudo
# works without a password; otherwise it says what is missing and how to
# install it, and exits 0 so that a developer without root can still run
# the tests that do not need them (those that do fail, saying what to
# install). Safe to run any number of times, without a terminal.
set -euo pipefail

apt_pkgs=()
npm_dirs=()
while [ "$#" -gt 0 ]; do
	case "$1" in
	--npm)
		if [ "$#" -lt 2 ]; then
			echo "test-deps: --npm needs a directory" >&2
			exit 2
		fi
		npm_dirs+=("$2")
		shift 2
		;;
	*)
		apt_pkgs+=("$1")
		shift
		;;
	esac
done

# node and npm are looked for on PATH, not as Debian packages: a machine
# may have them from elsewhere (NodeSource's nodejs carries its own npm,
# which Debian's npm package would conflict with).
if [ "${#npm_dirs[@]}" -gt 0 ] && { ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; }; then
	apt_pkgs+=(nodejs npm)
fi

# install_apt installs those of its Debian packages that are missing.
install_apt() {
	if [ "$#" -eq 0 ]; then
		return 0
	fi
	if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
		echo "test-deps: not a Debian-like system; make sure these are installed: $*" >&2
		return 0
	fi
	local missing=() pkg status
	for pkg in "$@"; do
		status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
		if [ "$status" != "install ok installed" ]; then
			missing+=("$pkg")
		fi
	done
	if [ "${#missing[@]}" -eq 0 ]; then
		return 0
	fi
	local as_root=()
	if [ "$(id -u)" -ne 0 ]; then
		if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
			as_root=(sudo -n)
		else
			echo "test-deps: missing ${missing[*]}; install with: sudo apt-get install -y ${missing[*]}" >&2
			return 0
		fi
	fi
	echo "test-deps: installing ${missing[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	"${as_root[@]}" apt-get update -qq
	"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
}

install_apt "${apt_pkgs[@]}"

for dir in "${npm_dirs[@]}"; do
	if ! command -v npm >/dev/null 2>&1; then
		echo "test-deps: npm is missing, so the packages of $dir are not installed; install with: sudo apt-get install -y nodejs npm" >&2
		exit 0
	fi
	# The lock of the last install, kept beside what it installed (npm ci
	# starts by removing node_modules, and with it this copy).
	stamp="$dir/node_modules/.test-deps-lock.json"
	if [ -f "$stamp" ] && cmp -s "$dir/package-lock.json" "$stamp"; then
		continue
	fi
	echo "test-deps: npm ci in $dir" >&2
	(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error </dev/null)
	cp "$dir/package-lock.json" "$stamp"
done
