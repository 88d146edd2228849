#!/usr/bin/env bash
# Installs the client's npm dependencies from package-lock.json (`npm ci`), only when node_modules is not
# already that lock file's install: the copy of the lock file left in node_modules says which one it is.
# ops/test.sh runs it; so does tests/test_typescript_client.py (a no-op when current).
set -euo pipefail

cd "$(dirname "$0")/.."
if cmp -s package-lock.json node_modules/.installed-lock.json; then
  exit 0
fi
npm ci --no-audit --no-fund
cp package-lock.json node_modules/.installed-lock.json
