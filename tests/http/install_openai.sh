#!/usr/bin/env bash
# Installs the `openai` npm package, pinned, into DIR/node_modules for the HTTP API's end-to-end
# test (tests/http/http_e2e_test.py openai; docs/http.md §7). Idempotent: an installed copy of the
# pinned version is kept. Exit 77 (the test reports itself skipped) when node or npm is missing or
# the registry cannot be reached and npm's cache does not have the package; 0 when installed.
#
# Usage: tests/http/install_openai.sh DIR
set -uo pipefail
VERSION=4.95.0
DIR=${1:?usage: install_openai.sh DIR}

if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
  echo "node or npm is not installed"
  exit 77
fi
have=$(node -e "console.log(require('$DIR/node_modules/openai/package.json').version)" 2>/dev/null || true)
if [ "$have" = "$VERSION" ]; then
  exit 0
fi
mkdir -p "$DIR"
# A registry that cannot be reached makes npm retry for minutes: ask once, else use the cache only.
mode=--prefer-offline
if ! timeout 60 npm ping --fetch-retries=0 --fetch-timeout=15000 --loglevel=error > /dev/null 2>&1; then
  mode=--offline
fi
if ! out=$(timeout 300 npm install --no-save --no-audit --no-fund --ignore-scripts --loglevel=error "$mode" \
      --prefix "$DIR" "openai@$VERSION" 2>&1); then
  echo "npm install openai@$VERSION failed ($mode): $(echo "$out" | tail -3 | tr '\n' ' ')"
  exit 77
fi
echo "installed openai@$VERSION into $DIR/node_modules"
