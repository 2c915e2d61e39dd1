#!/usr/bin/env bash
# The service with GPU workers, end to end on a GPU machine: a local cluster
# (strata up --device gpu) on the demo model against the same cluster on the
# CPU, a session saved, the cluster restarted with another worker count and
# the session continued, and a worker whose KV budget is too small refusing
# a long prompt with RESOURCE_EXHAUSTED while it keeps serving.
#
#   bench/gpu_cluster_check.sh build   (build host) builds the four binaries
#                                      into build-gpu (BUILD_DIR) and stages
#                                      them with the shared libraries they
#                                      need in build-gpu/cluster-bin
#   bench/gpu_cluster_check.sh run     (GPU host, from the tree's root)
set -u -o pipefail
cd "$(dirname "$0")/.."
MODE=${1:-run}
BUILD=${BUILD_DIR:-build-gpu}
BIN=$BUILD/cluster-bin
TARGETS="strata strata-coordinator strata-worker strata-kvstore"

if [ "$MODE" = build ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON ${CMAKE_ARGS:-} || exit 1
  ninja -C "$BUILD" -j"${JOBS:-2}" $TARGETS || exit 1
  rm -rf "$BIN" && mkdir -p "$BIN"
  cp "$BUILD/cli/strata" "$BUILD/coordinator/strata-coordinator" "$BUILD/worker/strata-worker" \
    "$BUILD/kvstore/strata-kvstore" "$BIN/" || exit 1
  # Every shared library outside glibc, libstdc++ and the CUDA driver
  # (cuBLASLt comes from the GPU machine's CUDA or PyTorch).
  for lib in $(ldd "$BIN"/strata* | awk '/=> \// {print $3}' | sort -u); do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libgcc_s.so*|libstdc++.so*|libcublas*|libcuda.so*) ;;
      *) cp -L "$lib" "$BIN/" ;;
    esac
  done
  du -sh "$BIN"
  exit 0
fi

CUBLAS_DIR=$(python3 -c "import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="$BIN:/usr/local/cuda/lib64:${CUBLAS_DIR:+$CUBLAS_DIR:}${LD_LIBRARY_PATH:-}"
STRATA="$BIN/strata"
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
fails=0
check() {  # check NAME COND-RESULT
  if [ "$2" = 0 ]; then echo "PASS $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}

ADDR=""
start() {  # start NAME ARGS...: a cluster in the background; sets ADDR
  local name=$1
  shift
  "$STRATA" up --model models/demo --port 0 --bin-dir "$BIN" "$@" >"$WORK/$name.out" 2>"$WORK/$name.log" &
  PIDS+=($!)
  for _ in $(seq 1 600); do
    if grep -q '^ready ' "$WORK/$name.out"; then
      ADDR=$(sed -n 's/^ready //p' "$WORK/$name.out" | head -n 1)
      return 0
    fi
    sleep 0.2
  done
  echo "cluster $name did not start:"
  cat "$WORK/$name.log"
  return 1
}
stop() {  # stops the newest cluster
  local p=${PIDS[-1]}
  kill -TERM "$p" 2>/dev/null
  wait "$p" 2>/dev/null
  unset 'PIDS[-1]'
}
gen() {  # gen ADDR ARGS...: greedy text on stdout
  sample "$1" --temperature 0 "${@:2}"
}
sample() {  # sample ADDR ARGS...: the text on stdout
  "$STRATA" generate --server "$1" --max-tokens 48 "${@:2}" --json 2>"$WORK/gen.err" |
    python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1]).get("text",""))'
}

PROMPT="The list type in Python"
start cpu --workers 2 --kv-dir "$WORK/kv-cpu" || exit 1
CPU_TEXT=$(gen "$ADDR" --prompt "$PROMPT" --session s)
CPU_MORE=$(gen "$ADDR" --prompt " A dictionary" --session s)
SAMPLED=(--prompt "$PROMPT" --temperature 0.8 --top-p 0.9 --top-k 50 --seed 7)
PENALISED=(--repetition-penalty 1.3 --presence-penalty 0.5)
CPU_SAMPLED=$(sample "$ADDR" "${SAMPLED[@]}")
CPU_PENALISED=$(sample "$ADDR" "${SAMPLED[@]}" "${PENALISED[@]}")
stop

# f32 GEMMs (the test mode) must reproduce the CPU cluster's greedy text.
start gpu32 --workers 2 --device gpu --gpu-gemm f32 --no-kvstore || exit 1
F32_TEXT=$(gen "$ADDR" --prompt "$PROMPT" --session s)
F32_MORE=$(gen "$ADDR" --prompt " A dictionary" --session s)
echo "cpu:       $CPU_TEXT"
echo "gpu f32:   $F32_TEXT"
check "GPU workers (f32 GEMMs) generate the CPU cluster's greedy text" \
  "$([ "$CPU_TEXT" = "$F32_TEXT" ] && [ "$CPU_MORE" = "$F32_MORE" ]; echo $?)"
# Sampled tokens are drawn on the device (kernels/cuda/sampling.h) with the
# request's own generator: on logits this close to the CPU's the seeded text
# is the CPU cluster's.
F32_SAMPLED=$(sample "$ADDR" "${SAMPLED[@]}")
echo "cpu sampled (seed 7):     $CPU_SAMPLED"
echo "gpu f32 sampled (seed 7): $F32_SAMPLED"
check "GPU workers (f32 GEMMs) sample the CPU cluster's seeded text on the device" \
  "$([ -n "$CPU_SAMPLED" ] && [ "$CPU_SAMPLED" = "$F32_SAMPLED" ]; echo $?)"
F32_PENALISED=$(sample "$ADDR" "${SAMPLED[@]}" "${PENALISED[@]}")
check "... and with penalties" "$([ -n "$CPU_PENALISED" ] && [ "$CPU_PENALISED" = "$F32_PENALISED" ]; echo $?)"
stop

# bf16 (production): a session saved on 2 workers and continued on 3 after
# a restart continues exactly as a twin session that never left the GPU.
start gpu2 --workers 2 --device gpu --kv-dir "$WORK/kv-gpu" || exit 1
T0=$(date +%s.%N)
GPU_TEXT=$(gen "$ADDR" --prompt "$PROMPT" --session s)
T1=$(date +%s.%N)
TWIN_TEXT=$(gen "$ADDR" --prompt "$PROMPT" --session twin)
TWIN_MORE=$(gen "$ADDR" --prompt " A dictionary" --session twin)
echo "gpu bf16:  $GPU_TEXT"
check "bf16 GPU generation is deterministic" "$([ "$GPU_TEXT" = "$TWIN_TEXT" ]; echo $?)"
# Every token is chosen on the device (greedy, sampled, penalised, with
# logprobs): a seeded request must replay exactly.
S1=$(sample "$ADDR" "${SAMPLED[@]}")
S2=$(sample "$ADDR" "${SAMPLED[@]}")
echo "gpu bf16 sampled (seed 7): $S1"
check "seeded sampling on GPU workers replays exactly" "$([ -n "$S1" ] && [ "$S1" = "$S2" ]; echo $?)"
P1=$(sample "$ADDR" "${SAMPLED[@]}" "${PENALISED[@]}")
P2=$(sample "$ADDR" "${SAMPLED[@]}" "${PENALISED[@]}")
echo "gpu bf16 sampled with penalties (device): $P1"
check "seeded sampling with penalties replays exactly" "$([ -n "$P1" ] && [ "$P1" = "$P2" ]; echo $?)"
L1=$(sample "$ADDR" "${SAMPLED[@]}" --logprobs 2)
L2=$(sample "$ADDR" "${SAMPLED[@]}" --logprobs 2)
check "seeded sampling with logprobs replays exactly" "$([ -n "$L1" ] && [ "$L1" = "$L2" ]; echo $?)"
"$STRATA" session save s --server "$ADDR" > /dev/null 2>&1
check "session saved" $?
stop

start gpu3 --workers 3 --device gpu --kv-dir "$WORK/kv-gpu" || exit 1
GPU_MORE=$(gen "$ADDR" --prompt " A dictionary" --session s)
echo "continued after the restart: $GPU_MORE"
echo "twin, never restarted:       $TWIN_MORE"
check "after a restart with 3 GPU workers the session continues exactly" \
  "$([ -n "$GPU_MORE" ] && [ "$GPU_MORE" = "$TWIN_MORE" ]; echo $?)"
stop

# A worker KV budget of 4 page ids (256 tokens per layer) and a longer prompt.
start small --workers 1 --device gpu --gpu-kv-bytes 65536 --no-kvstore || exit 1
LONG=$(python3 -c 'print(" ".join(["the list type and the dict type"] * 60))')
"$STRATA" generate --server "$ADDR" --prompt "$LONG" --max-tokens 4 --temperature 0 > "$WORK/long.out" 2> "$WORK/long.err"
rc=$?
echo "long prompt: exit $rc, $(head -c 300 "$WORK/long.err")"
check "a prompt beyond the GPU KV budget fails with RESOURCE_EXHAUSTED" \
  "$([ $rc != 0 ] && grep -q -i "RESOURCE_EXHAUSTED\|KV cache is full" "$WORK/long.err"; echo $?)"
SHORT=$(gen "$ADDR" --prompt "$PROMPT")
check "the worker keeps serving after refusing it" "$([ -n "$SHORT" ]; echo $?)"
grep -h "refused" "$WORK"/small.log | head -2
stop
echo "gpu cluster check: $fails failed; first GPU generation took $(python3 -c "print(round($T1 - $T0, 2))") s"
exit $fails
