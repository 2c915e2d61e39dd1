#!/usr/bin/env bash
# The main job: installs what the build needs, builds Strata, and shows a
# conversation that survives a restart of the whole cluster:
#   1. `strata up --workers 2` starts a local cluster (KV store, coordinator,
#      two pipeline workers) on the built-in demo model (models/demo);
#   2. a generation is streamed into session "demo-chat";
#   3. the session is saved (every token committed in the KV store);
#   4. every process of the cluster is stopped;
#   5. `strata up --workers 3` starts it again on the same session directory;
#   6. the session is resumed (its KV rows loaded onto the three stages) and
#   7. continued.
# Usage: scripts/demo.sh [PROMPT]
#   BUILD_DIR         build folder (default: build)
#   DEMO_SKIP_BUILD=1 use the binaries already in BUILD_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
if [ "${DEMO_SKIP_BUILD:-0}" != 1 ]; then
  scripts/install-deps.sh
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target strata strata-coordinator strata-worker strata-kvstore
fi
STRATA="$BUILD_DIR/cli/strata"
PROMPT=${1:-"The Python tutorial shows how to"}
SESSION=demo-chat
SAMPLING=(--temperature 0.7 --top-p 0.95 --seed 1)

WORK=$(mktemp -d)
KV_DIR="$WORK/sessions"
UP_PID=""
ADDR=""

stop_cluster() {
  if [ -n "$UP_PID" ] && kill -0 "$UP_PID" 2>/dev/null; then
    kill -TERM "$UP_PID"
    wait "$UP_PID" 2>/dev/null || true
  fi
  UP_PID=""
}
cleanup() {
  stop_cluster
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -t 1 ]; then BOLD=$'\033[1m' PLAIN=$'\033[0m'; else BOLD="" PLAIN=""; fi
step() { printf '\n%s== %s%s\n' "$BOLD" "$*" "$PLAIN"; }

# Starts `strata up --workers $1` in the background and waits for `ready ADDRESS`.
start_cluster() {
  local out="$WORK/up-$1.out" log="$WORK/up-$1.log"
  "$STRATA" up --workers "$1" --model models/demo --port 0 --kv-dir "$KV_DIR" >"$out" 2>"$log" &
  UP_PID=$!
  for _ in $(seq 1 900); do
    if grep -q '^ready ' "$out"; then
      ADDR=$(sed -n 's/^ready //p' "$out" | head -n 1)
      echo "ready $ADDR"
      return 0
    fi
    kill -0 "$UP_PID" 2>/dev/null || break
    sleep 0.2
  done
  echo "demo: the cluster did not become ready; its messages:" >&2
  cat "$log" >&2
  exit 1
}

step "1. strata up --workers 2 --model models/demo --kv-dir $KV_DIR"
start_cluster 2

step "2. strata generate --server $ADDR --session $SESSION --prompt \"$PROMPT\""
"$STRATA" generate --server "$ADDR" --session "$SESSION" --prompt "$PROMPT" --max-tokens 80 "${SAMPLING[@]}"

step "3. strata session save $SESSION   (waits until every token is committed in the KV store)"
"$STRATA" session save "$SESSION" --server "$ADDR"

step "4. stopping the whole cluster (KV store, coordinator, workers)"
stop_cluster
ls -l "$KV_DIR"

step "5. strata up --workers 3 --kv-dir $KV_DIR   (same sessions, another placement)"
start_cluster 3
"$STRATA" session list --server "$ADDR"

step "6. strata session resume $SESSION   (KV rows loaded onto all 3 stages, no recomputation)"
"$STRATA" session resume "$SESSION" --server "$ADDR"

step "7. strata generate --server $ADDR --session $SESSION --continue"
"$STRATA" generate --server "$ADDR" --session "$SESSION" --continue --max-tokens 80 "${SAMPLING[@]}"

step "done: the conversation continued after a restart of every process"
