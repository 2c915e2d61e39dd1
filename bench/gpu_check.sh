#!/usr/bin/env bash
# GPU check for the CUDA kernels: tests, then the attention benchmark, then the
# disassembly summary. Two modes:
#
#   bench/gpu_check.sh build   (on a build machine with nvcc) configures and
#                              builds the GPU tests and the benchmark into
#                              build-cuda (BUILD_DIR; extra CMAKE_ARGS) and
#                              stages them in build-cuda/gpu-bin
#   bench/gpu_check.sh run     (on the GPU machine) runs everything from
#                              build-cuda/gpu-bin; logs go to $OUT (default out/)
#
# The run prints a short table last; full logs, the SASS summary and the
# measured ceilings are under $OUT (eight files at most). Options of the run:
#   PREV_BIN=dir   a previous build's gpu-bin: its benchmark runs too (--quick),
#                  for a comparison on the same card in the same run
#   NCU=1          one profiler pass (Nsight Compute, clocks left alone) of the
#                  decode kernels at B=1 T=128k
#   SANITIZE=0     skips compute-sanitizer
#   ATTENTION_BENCH=0, E2E_BENCH=0, FP8_BENCH=0   skip the attention kernel
#                  benchmark, the end-to-end synthetic DeepSeek-V3 and MoE
#                  benchmarks, or the fp8 small-M GEMM benchmark
set -u -o pipefail
cd "$(dirname "$0")/.."
MODE=${1:-run}
BUILD=${BUILD_DIR:-build-cuda}
BIN=$BUILD/gpu-bin
TESTS="kv_layout_test fp8_quantize_cuda_test dsa_indexer_cuda_test mla_decode_cuda_test moe_gemv_cuda_test gemm_cuda_test layer_ops_cuda_test small_gemm_cuda_test fp8_gemv_cuda_test fp8_gemm_cuda_test sampling_cuda_test gpu_engine_test"
BENCHES="strata_attention_bench strata_gpu_e2e_bench strata_moe_bench strata_fp8_gemv_bench strata_load_bench strata_make_checkpoint"

if [ "$MODE" = build ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON ${CMAKE_ARGS:-} || exit 1
  ninja -C "$BUILD" -j"${JOBS:-2}" $TESTS $BENCHES || exit 1
  mkdir -p "$BIN"
  # (the staging folders are skipped: a stale staged copy must not win)
  for t in $TESTS $BENCHES; do
    cp "$(find "$BUILD" -path "$BUILD/gpu-bin*" -prune -o -name "$t" -type f -perm -u+x -print | head -1)" "$BIN/" || exit 1
  done
  # The CUDA runtime and the Abseil libraries the binaries were linked
  # against, in case the GPU machine lacks them (cuBLASLt comes from its
  # CUDA or PyTorch installation).
  for lib in $(ldd "$BIN"/* 2>/dev/null | awk '/libcudart|libabsl_/ {print $3}' | sort -u); do
    cp -L "$lib" "$BIN/" || exit 1
  done
  ls -la "$BIN"
  exit 0
fi

OUT=${OUT:-out}
mkdir -p "$OUT"
CUBLAS_DIR=$(python3 -c "import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="$BIN:/usr/local/cuda/lib64:${CUBLAS_DIR:+$CUBLAS_DIR:}${LD_LIBRARY_PATH:-}"
{ date -u; nvidia-smi; nvidia-smi -q -d CLOCK | head -40; } > "$OUT/env.txt" 2>&1
START=$(date +%s)

# Matrix ceiling: a large bf16 GEMM (cuBLAS through PyTorch), random data.
PEAK=$(timeout 120 python3 - <<'PY' 2>>"$OUT/env.txt"
import torch
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(3): a @ b
torch.cuda.synchronize()
ts = []
for _ in range(10):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); a @ b; e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
ts.sort()
print(f"{2 * n**3 / (ts[len(ts)//2] * 1e-3) / 1e12:.0f}")
PY
)
[ -n "$PEAK" ] || PEAK=989
echo "bf16 matrix peak (median of 10 8192^3 GEMMs): $PEAK TFLOP/s" | tee -a "$OUT/env.txt"

fails=0
for t in $TESTS; do
  echo "=== $t" | tee -a "$OUT/tests.log"
  timeout 240 "$BIN/$t" 2>&1 | tee -a "$OUT/tests.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |worst|Failure|error|Expected|Which is|seed|mode|kernels:" | head -60
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || { echo "!!! $t exited $rc"; fails=$((fails + 1)); }
done

# Disassembly: per kernel, tensor-core, 16-byte, local-memory and barrier
# instructions; the resource report (registers, shared memory, stack).
if command -v cuobjdump > /dev/null; then
  cuobjdump --dump-sass "$BIN/strata_attention_bench" 2>&1 |
    awk '/Function :/ {keep = index($0, "strata") > 0} keep' > "$OUT/sass.txt"
  {
    awk '/Function :/ {f=$3} f && /^ +\/\*[0-9a-f]+\*\// {
           for (o in ops) if (index($0, o)) n[f, o]++ }
         BEGIN { split("HMMA HGMMA QGMMA LDG.E.128 LDGSTS LDSM STS.128 LDS.128 LDL STL BAR.SYNC", a, " "); for (i in a) ops[a[i]] = 1 }
         END { for (k in n) { split(k, p, SUBSEP); printf "%-8s %6d  %s\n", p[2], n[k], p[1] } }' \
      "$OUT/sass.txt" | sort -k3
    echo "--- resource usage"
    cuobjdump --dump-resource-usage "$BIN/strata_attention_bench" 2>&1 | grep -A1 "strata" | grep -v "^--"
  } > "$OUT/sass_summary.txt"
  cat "$OUT/sass_summary.txt"
fi

if [ "${ATTENTION_BENCH:-1}" = 1 ]; then
  timeout 180 "$BIN/strata_attention_bench" --matrix_tflops="$PEAK" --graph 2>&1 | tee "$OUT/bench.log" | grep -v "^|"
fi
# DeepSeek-V3-sized layers end to end (synthetic weights), dense and DSA,
# then the routed experts of one MoE step (random routing).
if [ "${E2E_BENCH:-1}" = 1 ]; then
  for flag in "" --dsa; do
    timeout 240 "$BIN/strata_gpu_e2e_bench" $flag 2>&1 | tee -a "$OUT/e2e.log"
    echo "e2e bench $flag rc=${PIPESTATUS[0]}"
  done
  timeout 120 "$BIN/strata_moe_bench" 2>&1 | tee -a "$OUT/e2e.log"
  echo "moe bench rc=${PIPESTATUS[0]}"
fi
# fp8 block-scaled weights at small M (kernels/cuda/fp8_gemv.h).
if [ "${FP8_BENCH:-1}" = 1 ]; then
  timeout 120 "$BIN/strata_fp8_gemv_bench" 2>&1 | tee "$OUT/fp8_gemv.log"
  echo "fp8 gemv bench rc=${PIPESTATUS[0]}"
fi
# The previous build's benchmark on the same card (quick: up to T = 128k).
if [ -n "${PREV_BIN:-}" ] && [ -x "$PREV_BIN/strata_attention_bench" ]; then
  LD_LIBRARY_PATH="$PREV_BIN:$LD_LIBRARY_PATH" timeout 90 "$PREV_BIN/strata_attention_bench" \
    --matrix_tflops="$PEAK" --quick > "$OUT/bench_prev.log" 2>&1
  echo "previous build's benchmark rc=$?"
fi
# Out-of-bounds and race check of the small cases (slow under the tool).
if [ "${SANITIZE:-1}" = 1 ] && command -v compute-sanitizer > /dev/null; then
  {
    timeout 90 compute-sanitizer --tool memcheck --print-limit 5 "$BIN/mla_decode_cuda_test" \
      --gtest_filter='*MixedBatchesOfThree*:*Sparse*'
    echo "mla memcheck rc=$?"
    timeout 60 compute-sanitizer --tool memcheck --print-limit 5 "$BIN/dsa_indexer_cuda_test" \
      --gtest_filter='*IndexerScoresAndSelection*'
    echo "dsa memcheck rc=$?"
    for tool in memcheck racecheck; do
      timeout 120 compute-sanitizer --tool $tool --print-limit 5 "$BIN/sampling_cuda_test" \
        --gtest_filter='*SmallVocabularies*'
      echo "sampling $tool rc=$?"
    done
  } > "$OUT/memcheck.log" 2>&1
  grep -E "SUMMARY|check rc" "$OUT/memcheck.log"
fi
# One profiler pass over the split and merge kernels (clocks as found).
if [ "${NCU:-0}" = 1 ] && command -v ncu > /dev/null; then
  timeout 75 ncu --clock-control none -k regex:MlaDecode -c 2 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section Occupancy "$BIN/strata_attention_bench" --case="dense B=1 T=128k" > "$OUT/ncu.txt" 2>&1
  echo "ncu rc=$? ($(grep -c "MlaDecode" "$OUT/ncu.txt") kernel lines)"
fi
echo "tests failed: $fails; run took $(( $(date +%s) - START )) s"
if [ -f "$OUT/bench_prev.log" ]; then echo "previous build:"; grep "^|" "$OUT/bench_prev.log"; fi
if [ -f "$OUT/bench.log" ]; then echo "this build:"; grep "^|" "$OUT/bench.log"; fi
