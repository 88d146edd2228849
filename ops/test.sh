#!/usr/bin/env bash
# The test command (README command 2): installs what the tests need on a Debian/Ubuntu machine, then runs
# the whole suite. On a machine that already has everything it downloads nothing and goes straight to
# pytest. Extra arguments go to pytest (e.g. `ops/test.sh tests/test_cli.py -x`).
#
# Needs: apt-get (as root, or sudo), python3 >= 3.11. Installs when missing: redis-server (the tests'
# Redis), docker-compose and chromium + chromium-driver (their suites), a JDK 17+ and Maven (the Neo4j
# launcher, built once from Maven Central), then `pip install -e '.[dev]'` and the launcher build.
set -euo pipefail

cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

phase() { printf '\n[%s +%ss] == %s\n' "$(date -u +%H:%M:%S)" "$SECONDS" "$*"; }

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

phase "system packages"
wanted=(redis-server docker-compose chromium chromium-driver)
# Any JDK 17+ and Maven already on PATH will do.
command -v java >/dev/null || wanted+=(default-jdk-headless)
command -v mvn >/dev/null || wanted+=(maven)
python3 -m pip --version >/dev/null 2>&1 || wanted+=(python3-pip)
missing=()
for pkg in "${wanted[@]}"; do
  installed "$pkg" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  as_root apt-get update -q
  as_root apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "all installed: ${wanted[*]}"
fi

phase "python dependencies"
# Debian's own python3 refuses pip installs into it (PEP 668) unless told; a pyenv/venv python does not care.
if python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
  export PIP_BREAK_SYSTEM_PACKAGES=1
fi
python3 -m pip install -e '.[dev]'

phase "neo4j launcher"
ops/neo4j-launcher/build.sh

phase "tests"
python3 -m pytest -q "$@"
