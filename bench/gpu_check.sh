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
# measured ceilings are under $OUT.
set -u -o pipefail
cd "$(dirname "$0")/.."
MODE=${1:-run}
BUILD=${BUILD_DIR:-build-cuda}
BIN=$BUILD/gpu-bin
TESTS="kv_layout_test fp8_quantize_cuda_test dsa_indexer_cuda_test mla_decode_cuda_test"

if [ "$MODE" = build ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON ${CMAKE_ARGS:-} || exit 1
  ninja -C "$BUILD" -j"${JOBS:-2}" $TESTS strata_attention_bench || exit 1
  mkdir -p "$BIN"
  for t in $TESTS; do cp "$(find "$BUILD" -name "$t" -type f -perm -u+x | head -1)" "$BIN/"; done
  cp "$(find "$BUILD" -name strata_attention_bench -type f | head -1)" "$BIN/"
  # The CUDA runtime the binaries were linked against, in case the GPU machine lacks it.
  cp -L "$(ldd "$BIN/strata_attention_bench" | awk '/libcudart/ {print $3}')" "$BIN/" 2>/dev/null || true
  ls -la "$BIN"
  exit 0
fi

OUT=${OUT:-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
{ date -u; nvidia-smi; nvidia-smi -q -d CLOCK | head -40; } > "$OUT/env.txt" 2>&1

# Matrix ceiling: a large bf16 GEMM (cuBLAS through PyTorch), random data.
PEAK=$(timeout 120 python3 - <<'PY' 2>>"$OUT/matrix.log"
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
echo "bf16 matrix peak (median of 10 8192^3 GEMMs): $PEAK TFLOP/s" | tee "$OUT/ceilings.txt"

fails=0
for t in $TESTS; do
  echo "=== $t" | tee -a "$OUT/tests.log"
  timeout 200 "$BIN/$t" 2>&1 | tee -a "$OUT/tests.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |worst|Failure|error|Expected|Which is|seed" | head -40
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || { echo "!!! $t exited $rc"; fails=$((fails + 1)); }
done

# Disassembly: per kernel, tensor-core, 16-byte and local-memory instructions.
if command -v cuobjdump > /dev/null; then
  cuobjdump --dump-sass "$BIN/strata_attention_bench" > "$OUT/sass.txt" 2>&1
  awk '/Function :/ {f=$3} f && /^ +\/\*[0-9a-f]+\*\// {
         for (o in ops) if (index($0, o)) n[f, o]++ }
       BEGIN { split("HMMA HGMMA QGMMA LDG.E.128 LDGSTS LDSM STS.128 LDS.128 LDL STL", a, " "); for (i in a) ops[a[i]] = 1 }
       END { for (k in n) { split(k, p, SUBSEP); printf "%-8s %6d  %s\n", p[2], n[k], p[1] } }' \
    "$OUT/sass.txt" | sort -k3 > "$OUT/sass_summary.txt"
  cat "$OUT/sass_summary.txt"
fi

timeout 240 "$BIN/strata_attention_bench" --matrix_tflops="$PEAK" 2>&1 | tee "$OUT/bench.log" | grep -v "^|"
# Out-of-bounds and race check of the small cases (slow under the tool).
if [ "${SANITIZE:-1}" = 1 ] && command -v compute-sanitizer > /dev/null; then
  timeout 90 compute-sanitizer --tool memcheck --print-limit 5 "$BIN/mla_decode_cuda_test" \
    --gtest_filter='*MixedBatchesOfThree*:*Sparse*' > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
fi
echo "tests failed: $fails"
grep "^|" "$OUT/bench.log"
