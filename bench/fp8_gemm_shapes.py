#!/usr/bin/env python3
"""The library's fp8 block-scaled GEMMs at the shapes a DeepSeek-V3.2 layer runs, on the GPU
machine (PyTorch's torch._scaled_mm, which calls cuBLASLt's block-scaled fp8 kernels):

  y[M, N] = x[M, K] · W[N, K]^T,  x e4m3 with one f32 scale per 1×128 group (per row, per 128 of K),
                                  W e4m3 with one f32 scale per 128×128 block (the checkpoint's
                                  weight_scale_inv), y bf16.

For each weight shape and M (decode batches 1…256, prefill chunks), it prints the time, the weight
bytes/s, the FLOP/s, and the ratios to the ceilings measured in the same run: the device copy
bandwidth (the byte floor: reading the weight once) and the dense fp8 and bf16 matrix rates; the
same product in bf16 (weights dequantised) next to it; and "refused" where the library does not
run the case. Weights rotate over enough copies to defeat the 60 MB L2 (each call reads its
weight from memory, as in a model). It checks every product against float64 on its first call.

Usage: python3 bench/fp8_gemm_shapes.py [--quick] [--out FILE]
"""

import argparse
import json
import sys
import time

import torch

# (name, N, K): DeepSeek-V3.2's linear layers (hidden 7168, q_lora 1536, kv_lora 512, 128 heads,
# nope 128, rope 64, v 128, MoE intermediate 2048, dense intermediate 18432).
SHAPES = [
    ("q_a_proj", 1536, 7168),
    ("q_b_proj", 24576, 1536),
    ("kv_a_proj_with_mqa", 576, 7168),
    ("o_proj", 7168, 16384),
    ("expert gate+up", 4096, 7168),
    ("expert down", 7168, 2048),
    ("dense gate+up", 36864, 7168),
    ("dense down", 7168, 18432),
]
DECODE_M = [1, 2, 4, 8, 16, 32, 64, 128, 256]
PREFILL_M = [512, 2048, 4096]
L2_BYTES = 60 << 20


def graphed(calls, replays=20):
    """Mean µs per call of `calls` (zero-argument callables, each launching its kernels), captured
    once into a CUDA graph and replayed `replays` times: no host launch cost in the figure (a
    Python call costs more than a small GEMM)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls:  # warm-up outside the capture (algorithm selection, workspaces)
            c()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / (replays * len(calls))


def timed(fn, iters):
    """Mean µs per call over `iters` calls after 3 warm-ups, by CUDA events."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


def copy_bandwidth():
    """Device copy: bytes read + written per second, 2 GiB buffers."""
    n = 1 << 31
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    us = timed(lambda: b.copy_(a), 10)
    return 2 * n / (us * 1e-6)


def dense_rates():
    """fp8 (tensor-wise scales) and bf16 matrix rates at 8192^3, FLOP/s."""
    n = 8192
    x = torch.randn(n, n, device="cuda")
    a8 = x.to(torch.float8_e4m3fn)
    b8 = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    fp8_us = timed(lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16), 20)
    a16 = x.to(torch.bfloat16)
    b16 = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    bf16_us = timed(lambda: a16 @ b16, 20)
    return 2 * n ** 3 / (fp8_us * 1e-6), 2 * n ** 3 / (bf16_us * 1e-6)


def quantise_blocks(w):
    """W [N, K] f32 -> e4m3 codes and f32 scales [ceil(N/128), ceil(K/128)] (amax / 448 per block)."""
    n, k = w.shape
    bn, bk = (n + 127) // 128, (k + 127) // 128
    pad = torch.zeros(bn * 128, bk * 128, device=w.device)
    pad[:n, :k] = w
    blocks = pad.view(bn, 128, bk, 128)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-30)
    scale = amax / 448.0
    codes = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn)
    return codes.view(bn * 128, bk * 128)[:n, :k].contiguous(), scale.contiguous()


def quantise_rows(x):
    """x [M, K] f32 -> e4m3 codes and f32 scales [M, ceil(K/128)] stored M-contiguous, as
    cuBLASLt's 1×128 mode takes them."""
    m, k = x.shape
    bk = (k + 127) // 128
    pad = torch.zeros(m, bk * 128, device=x.device)
    pad[:, :k] = x
    groups = pad.view(m, bk, 128)
    scale = (groups.abs().amax(dim=2).clamp(min=1e-30) / 448.0)
    codes = (groups / scale[:, :, None]).to(torch.float8_e4m3fn).view(m, bk * 128)[:, :k].contiguous()
    return codes, scale.t().contiguous().t()  # shape [M, K/128], stride (1, M)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.cuda.get_device_name(0)
    bw = copy_bandwidth()
    fp8_rate, bf16_rate = dense_rates()
    print(f"{dev}: copy {bw / 1e12:.2f} TB/s (read + write), fp8 {fp8_rate / 1e12:.0f} TFLOP/s, "
          f"bf16 {bf16_rate / 1e12:.0f} TFLOP/s (8192^3, measured now)", flush=True)
    # The byte floor reads each weight byte once at the copy's bytes-moved rate (a read-only
    # stream reaches about that rate; counting the copy's bytes once would halve it).
    read_bw = bw
    rows = []
    ms = DECODE_M + ([] if args.quick else PREFILL_M)
    hdr = (f"{'weight':<20}{'N':>6}{'K':>6}{'M':>6} {'fp8 µs':>9}{'TB/s':>7}{'xfloor':>7}{'TFLOP/s':>9}"
           f"{'%fp8':>6} {'bf16 µs':>9}{'fp8/bf16':>9}  max rel err")
    print(hdr, flush=True)
    for name, n, k in SHAPES:
        w = torch.randn(n, k, device="cuda") * 0.02
        codes, wscale = quantise_blocks(w)
        wbytes = n * k + wscale.numel() * 4
        copies = max(1, (2 * L2_BYTES) // max(1, n * k) + 1)
        wcodes = [codes.clone() for _ in range(copies)]
        wscales = [wscale.clone() for _ in range(copies)]
        w16 = [(codes.to(torch.float32) * wscale.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k])
               .to(torch.bfloat16) for _ in range(min(copies, max(1, (2 * L2_BYTES) // (2 * n * k) + 1)))]
        for m in ms:
            x = torch.randn(m, k, device="cuda")
            xq, xscale = quantise_rows(x)
            row = {"weight": name, "N": n, "K": k, "M": m}
            def fp8_call(j=0):
                return torch._scaled_mm(xq, wcodes[j].t(), xscale, wscales[j].t(), out_dtype=torch.bfloat16)

            try:
                y = fp8_call()
                # float64 reference of the same quantised operands.
                ref = (xq.to(torch.float64) * xscale.to(torch.float64).repeat_interleave(128, 1)[:, :k]) @ \
                      (codes.to(torch.float64) * wscale.to(torch.float64).repeat_interleave(128, 0)[:n]
                       .repeat_interleave(128, 1)[:, :k]).t()
                err = ((y.to(torch.float64) - ref).abs().max() / ref.abs().max()).item()
                # One graph of calls that each read another copy of the weight (L2 defeated).
                n_calls = max(copies, 8 if m <= 256 else 2)
                us = graphed([lambda j=j: fp8_call(j % copies) for j in range(n_calls)])
                row.update(fp8_us=us, err=err)
            except RuntimeError as e:
                row.update(fp8_us=None, refused=str(e).split("\n")[0][:120])
            x16 = x.to(torch.bfloat16)
            n16 = max(len(w16), 8 if m <= 256 else 2)
            row["bf16_us"] = graphed([lambda j=j: x16 @ w16[j % len(w16)].t() for j in range(n16)])
            floor_us = wbytes / read_bw * 1e6
            flops = 2.0 * m * n * k
            if row.get("fp8_us"):
                us = row["fp8_us"]
                print(f"{name:<20}{n:>6}{k:>6}{m:>6} {us:>9.1f}{wbytes / us / 1e6:>7.2f}{us / floor_us:>7.2f}"
                      f"{flops / us / 1e6:>9.1f}{100 * flops / (us * 1e-6) / fp8_rate:>6.1f} {row['bf16_us']:>9.1f}"
                      f"{us / row['bf16_us']:>9.2f}  {row['err']:.2e}", flush=True)
            else:
                print(f"{name:<20}{n:>6}{k:>6}{m:>6} {'refused':>9}{'':>36} {row['bf16_us']:>9.1f}"
                      f"{'':>9}  {row['refused']}", flush=True)
            row["floor_us"] = floor_us
            rows.append(row)
        del wcodes, wscales, w16
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": dev, "copy_Bps": bw, "fp8_flops": fp8_rate, "bf16_flops": bf16_rate,
                       "date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
