#!/usr/bin/env bash
# The project's test command (CI runs it: .ci/run). Installs the Debian
# packages, then runs these stages, each in a build folder of its own, and
# prints each stage's wall time against its budget (a stage over budget is
# reported, not failed: machines differ):
#
#   build     Release build of everything, the CUDA kernels too when   build/       10 min
#             the toolkit is installed (cmake/StrataCuda.cmake)
#   test      the whole CTest suite of that build (GPU tests report                  5 min
#             Skipped without a device; their host-only parts run)
#   sanitize  clang, AddressSanitizer + UndefinedBehaviorSanitizer     build-asan/   8 min
#             (halting at the first report), -Werror=thread-safety,
#             CUDA off: builds and runs the tests of kvstore/,
#             coordinator/, worker/ and tests/ (the end-to-end service
#             tests; not python_client_test and the HTTP clients' tests,
#             which need the CLI)
#   fuzz      clang, libFuzzer (-DSTRATA_FUZZ=ON): every target of     build-fuzz/   3 min
#             kvstore/fuzz replays its committed corpus, then fuzzes
#             for FUZZ_SECONDS; a crash fails and its input is printed
#
# Usage: scripts/test.sh [extra cmake arguments for the build stage]
#   STRATA_STAGES  the stages to run, comma-separated
#                  (default: build,test,sanitize,fuzz)
#   BUILD_DIR      the build and test stages' folder (default: build)
#   FUZZ_SECONDS   fuzzing time per target (default: 60)
# It exits non-zero when a stage failed; the stages after a failed one still
# run, except `test` after a failed `build`.
set -euo pipefail
cd "$(dirname "$0")/.."

STAGES=${STRATA_STAGES:-build,test,sanitize,fuzz}
BUILD_DIR=${BUILD_DIR:-build}
ASAN_DIR=build-asan
FUZZ_DIR=build-fuzz
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
JOBS=$(nproc)
CMAKE_ARGS=("$@")

declare -A BUDGET=([build]=600 [test]=300 [sanitize]=480 [fuzz]=180)
for s in ${STAGES//,/ }; do
  if [ -z "${BUDGET[$s]:-}" ]; then
    echo "test.sh: unknown stage '$s' (stages: build, test, sanitize, fuzz)" >&2
    exit 2
  fi
done
selected() { [[ ",$STAGES," == *",$1,"* ]]; }

# Test counts over every CTest run and fuzz target, for the closing line.
PASSED=0 FAILED=0 SKIPPED=0

# Runs ctest with the given arguments and adds its counts to the totals.
run_ctest() {
  local log rc=0
  log=$(mktemp)
  ctest --output-on-failure "$@" 2>&1 | tee "$log" || rc=$?
  local total failed skipped
  total=$(sed -n 's/.*tests failed out of \([0-9]*\).*/\1/p' "$log" | tail -1)
  failed=$(sed -n 's/.* \([0-9]*\) tests failed out of.*/\1/p' "$log" | tail -1)
  skipped=$(grep -c '(Skipped)$' "$log" || true)
  rm -f "$log"
  if [ -z "$total" ]; then
    echo "test.sh: ctest printed no summary" >&2
    return 1
  fi
  PASSED=$((PASSED + total - failed - skipped))
  FAILED=$((FAILED + failed))
  SKIPPED=$((SKIPPED + skipped))
  return $rc
}

stage_build() {
  scripts/install-deps.sh || return
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "${CMAKE_ARGS[@]}" || return
  cmake --build "$BUILD_DIR" -j "$JOBS"
}

stage_test() {
  run_ctest --test-dir "$BUILD_DIR" -j "$JOBS"
}

# The clang configuration shared by the sanitize and fuzz stages: ASan +
# UBSan with -fno-sanitize-recover (STRATA_SANITIZE), lock annotations
# checked, line tables for the reports.
clang_configure() {
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" \
    -DCMAKE_CXX_FLAGS="-Wthread-safety -Werror=thread-safety" \
    -DSTRATA_CUDA=OFF -DSTRATA_SANITIZE=ON "$@"
}

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

stage_sanitize() {
  scripts/install-deps.sh || return
  clang_configure "$ASAN_DIR" || return
  local dirs=(kvstore coordinator worker tests)
  cmake --build "$ASAN_DIR" -j "$JOBS" --target "${dirs[@]/%//all}" || return
  local names=() d
  for d in "${dirs[@]}"; do
    mapfile -t -O "${#names[@]}" names < <(ctest --test-dir "$ASAN_DIR/$d" -N | sed -n 's/^ *Test *#[0-9]*: //p')
  done
  local regex
  regex="^($(printf '%s\n' "${names[@]}" | grep -vxE 'python_client_test|http_(urllib|curl|openai)_test' \
    | paste -sd '|'))\$"
  run_ctest --test-dir "$ASAN_DIR" -j "$JOBS" -R "$regex"
}

# Prints a crashing input as hex and base64, and how to replay it.
show_crash() {
  local target=$1 input=$2
  echo "== $target: crashing input $input ($(stat -c %s "$input") bytes)"
  od -A x -t x1z -v "$input" | head -64
  echo "base64: $(base64 -w0 "$input")"
  echo "replay: base64 -d > crash <<< '$(base64 -w0 "$input")' && $FUZZ_DIR/kvstore/fuzz/$target crash"
}

stage_fuzz() {
  scripts/install-deps.sh || return
  clang_configure "$FUZZ_DIR" -DSTRATA_FUZZ=ON || return
  local targets=() c
  for c in kvstore/fuzz/corpus/*/; do targets+=("$(basename "$c")_fuzz"); done
  cmake --build "$FUZZ_DIR" -j "$JOBS" --target "${targets[@]}" || return
  local work status=0 t
  work=$(mktemp -d)
  local flags=(-rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10 -print_final_stats=1)
  # Replay: each committed input once, no mutation.
  for t in "${targets[@]}"; do
    local corpus=kvstore/fuzz/corpus/${t%_fuzz} bin=$FUZZ_DIR/kvstore/fuzz/$t
    mkdir -p "$work/$t/new" "$work/$t/crash"
    if "$bin" "${flags[@]}" -artifact_prefix="$work/$t/crash/" "$corpus"/* > "$work/$t/replay.log" 2>&1; then
      echo "fuzz: $t replayed $(find "$corpus" -type f | wc -l) corpus inputs"
    else
      status=1
      FAILED=$((FAILED + 1))
      tail -40 "$work/$t/replay.log"
      # A replay writes no artifact: the input is the last one it ran.
      c=$(sed -n 's/^Running: //p' "$work/$t/replay.log" | tail -1)
      [ -f "$c" ] && show_crash "$t" "$c"
      echo "fuzz: $t FAILED on its committed corpus"
      continue
    fi
    # Fuzzing: all targets at once, one core each (new inputs go to a
    # scratch folder, never into the source tree).
    "$bin" "${flags[@]}" -max_total_time="$FUZZ_SECONDS" -artifact_prefix="$work/$t/crash/" \
      "$work/$t/new" "$corpus" > "$work/$t/fuzz.log" 2>&1 &
    echo $! > "$work/$t/pid"
  done
  for t in "${targets[@]}"; do
    [ -f "$work/$t/pid" ] || continue
    if wait "$(cat "$work/$t/pid")"; then
      PASSED=$((PASSED + 1))
      echo "fuzz: $t ran ${FUZZ_SECONDS} s: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$work/$t/fuzz.log" \
        | sed 's/.*: *//') inputs, no crash"
    else
      status=1
      FAILED=$((FAILED + 1))
      tail -60 "$work/$t/fuzz.log"
      for c in "$work/$t/crash"/*; do [ -f "$c" ] && show_crash "$t" "$c"; done
      echo "fuzz: $t FAILED"
    fi
  done
  rm -rf "$work"
  return $status
}

fmt() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

SUMMARY=() FAILED_STAGES=0 BUILD_OK=1
START=$(date +%s)
for s in build test sanitize fuzz; do
  selected "$s" || continue
  if [ "$s" = test ] && [ "$BUILD_OK" = 0 ]; then
    SUMMARY+=("$(printf '%-9s %8s %8s  %s' "$s" - "$(fmt "${BUDGET[$s]}")" 'not run (build failed)')")
    FAILED_STAGES=$((FAILED_STAGES + 1))
    continue
  fi
  echo "=== stage $s (budget $(fmt "${BUDGET[$s]}"))"
  t0=$(date +%s)
  if "stage_$s"; then result=ok; else result=FAILED; fi
  dt=$(($(date +%s) - t0))
  [ "$result" = ok ] || FAILED_STAGES=$((FAILED_STAGES + 1))
  [ "$s" = build ] && [ "$result" != ok ] && BUILD_OK=0
  over=""
  [ "$dt" -le "${BUDGET[$s]}" ] || over=", over budget"
  echo "=== stage $s: $result in $(fmt "$dt") (budget $(fmt "${BUDGET[$s]}")$over)"
  SUMMARY+=("$(printf '%-9s %8s %8s  %s' "$s" "$(fmt "$dt")" "$(fmt "${BUDGET[$s]}")" "$result$over")")
done

echo
echo "stage         time   budget  result"
printf '%s\n' "${SUMMARY[@]}"
echo "total     $(printf '%8s' "$(fmt $(($(date +%s) - START)))")"
echo "tests: $PASSED passed, $FAILED failed, $SKIPPED skipped"
[ "$FAILED_STAGES" -eq 0 ]
