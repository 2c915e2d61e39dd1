#!/usr/bin/env bash
# The main job: installs what the build needs, builds the `strata` command and
# generates text from the built-in demo model (models/demo), streaming it.
# Usage: scripts/demo.sh [PROMPT]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target strata
PROMPT=${1:-"The Python tutorial shows how to"}
echo "== strata generate --model models/demo --prompt \"$PROMPT\""
"$BUILD_DIR/cli/strata" generate --model models/demo --prompt "$PROMPT" \
  --max-tokens 120 --temperature 0.7 --top-p 0.95 --seed 1
