#!/usr/bin/env bash
# The test command (README command 2): installs what the tests need on a Debian/Ubuntu machine, then runs
# the whole suite. On a machine that already has everything it downloads nothing and goes straight to
# pytest. Extra arguments go to pytest (e.g. `ops/test.sh tests/test_cli.py -x`).
#
# Needs: apt-get (as root, or sudo), python3 >= 3.11. Installs when missing: redis-server (the tests'
# Redis), docker-compose and chromium + chromium-driver (their suites), a JDK 17+ and Maven (the Neo4j
# launcher, built once from Maven Central), Go (helm, built from the Go module proxy for the chart's
# tests), Node.js and npm (the TypeScript client's tests), then `pip install -e '.[dev,torch]'` (torch: the
# tests that compare the ONNX encoder with sentence-transformers on torch, and the torch backend's), the
# launcher build and the TypeScript client's npm dependencies (`npm ci`, only when its lock file changed).
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
command -v go >/dev/null || wanted+=(golang-go)
command -v node >/dev/null || wanted+=(nodejs)
command -v npm >/dev/null || wanted+=(npm)
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
python3 -m pip install -e '.[dev,torch]'

phase "neo4j launcher"
ops/neo4j-launcher/build.sh

phase "typescript client"
clients/typescript/scripts/install.sh

phase "helm"
# tests/test_helm_chart.py lints and renders ops/helm/engram. Helm is built from source through the Go
# module proxy (minutes, then cached in GOPATH/bin). Its go.mod wants Go >= HELM_GO; an older Go (Debian
# 12's golang-go is 1.19, too old to switch toolchains by itself) fetches that toolchain, itself a module.
HELM_VERSION=v4.3.2
HELM_GO=1.26.0
export PATH="$PATH:$(go env GOPATH)/bin"
if command -v helm >/dev/null; then
  echo "found $(command -v helm)"
else
  go_bin=go
  have_go="$(go env GOVERSION | sed 's/^go//')"
  if [ "$(printf '%s\n' "$HELM_GO" "$have_go" | sort -V | head -n1)" != "$HELM_GO" ]; then
    toolchain="golang.org/toolchain@v0.0.1-go${HELM_GO}.$(go env GOOS)-$(go env GOARCH)"
    echo "Go $have_go is older than helm needs: fetching $toolchain"
    dir="$(go mod download -json "$toolchain" | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')"
    # A module zip keeps no file modes: set the execute bits, as Go's own toolchain switch does.
    chmod +x "$dir"/bin/* "$dir"/pkg/tool/*/*
    go_bin="$dir/bin/go"
  fi
  GOFLAGS=-mod=mod GOTOOLCHAIN=local nice "$go_bin" install "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
fi

phase "tests"
python3 -m pytest -q --durations=25 "$@"
