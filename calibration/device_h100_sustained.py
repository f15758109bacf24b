"""Burst vs sustained GEMM throughput on one H100 (run on the device machine; docs/kernels-h100.md,
point 6: is the large-GEMM rate of a training run ~0.71 or ~0.80 of the bf16 peak?).

For each GEMM below, the same CUDA graph (``inner`` back-to-back calls, ~20-40 ms of GPU work)
is replayed without pause for ``--seconds`` (default 3 s), after the GPU rested 3 s. Each replay is
timed with CUDA events, so the CSV holds the throughput against time from the first replay (the
burst a short benchmark sees) to the end (what a training step's GEMMs see under full power).
``nvidia-smi`` samples SM clock, power and throttle reasons every 100 ms beside it.

Writes into OUTDIR (argv[1]):

- ``h100_gemm_sustained.csv``: shape, dtype, fast_accum, m, n, k, replay, t_s (seconds since the
  GEMM's first replay started, at the replay's end), replay_s, calls, tflops (2 m n k calls /
  replay_s).
- ``h100_smi.csv``: nvidia-smi's samples (timestamp, clocks.sm, power.draw, temperature.gpu,
  clocks_throttle_reasons.active), when nvidia-smi is there.
- ``h100_sustained_marks.csv``: shape, dtype, fast_accum, host wall-clock start / end (to align the
  samples).

Prints per GEMM: TFLOP/s of the first replay, median of the first 100 ms, median of the last 1 s.
Run: ``python calibration/device_h100_sustained.py OUTDIR [--seconds 3]`` (~1 minute for the eight
GEMMs at 3 s each; nothing else needed but PyTorch with CUDA).
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import time

import torch

DEV = "cuda"
E4M3 = torch.float8_e4m3fn

# (label, m, n, k): the cubes of the lowp file, its best bf16 grid shape, and a dense linear of the
# DGX-H100 Bridge rows (Llama 3 70B at TP 4, fc1 forward, 8192 tokens)
SHAPES = [("cube8192", 8192, 8192, 8192), ("best-bf16", 2048, 2048, 8192),
          ("llama3-70b-tp4.fc1.fwd", 8192, 14336, 8192), ("cube16384", 16384, 16384, 16384)]
KINDS = [("bf16", 0), ("fp8", 0), ("fp8", 1)]


def operands(dtype, m, n, k):
    if dtype == "bf16":
        a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=DEV, dtype=torch.bfloat16)
        return lambda: torch.matmul(a, b)
    a = torch.randn(m, k, device=DEV).to(E4M3)
    b = torch.randn(n, k, device=DEV).to(E4M3).t()  # column-major [k, n]: TN as cuBLASLt needs
    one = torch.ones((), device=DEV)
    return a, b, one


def make_fn(dtype, fast, m, n, k):
    if dtype == "bf16":
        return operands(dtype, m, n, k)
    a, b, one = operands(dtype, m, n, k)
    return lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16,
                                    use_fast_accum=bool(fast))


def graph_of(fn, inner):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    torch.cuda.synchronize()
    return g


def run_one(g, seconds, max_replays=2000):
    """Replays g back to back for ~seconds; returns per-replay GPU seconds (events)."""
    starts, ends = [], []
    t_host = time.time()
    while time.time() - t_host < seconds and len(starts) < max_replays:
        # queue a few replays at a time so the GPU never idles between them
        for _ in range(4):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            g.replay()
            e.record()
            starts.append(s)
            ends.append(e)
        ends[-4].synchronize()  # keep the host at most ~4 replays ahead
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e-3 for s, e in zip(starts, ends)], starts[0], ends


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rest", type=float, default=3.0)
    args = p.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    print(torch.cuda.get_device_name(), torch.__version__, torch.version.cuda, flush=True)
    smi = None
    if shutil.which("nvidia-smi"):
        # the throttle-reason field was renamed in newer drivers: take the first set that works
        for fields in ("timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active",
                       "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active",
                       "timestamp,clocks.sm,power.draw,temperature.gpu"):
            ok = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv"],
                                capture_output=True, text=True, timeout=20)
            if ok.returncode == 0:
                print(ok.stdout.strip(), flush=True)
                break
        else:
            fields = None
        if fields:
            smi_out = open(os.path.join(args.outdir, "h100_smi.csv"), "w")
            smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={fields}", "--format=csv",
                                    "-lms", "100"], stdout=smi_out, stderr=subprocess.DEVNULL)
    rows, marks = [], []
    try:
        for label, m, n, k in SHAPES:
            flop = 2.0 * m * n * k
            # ~30 ms of GPU work per replay at ~700 (bf16) / ~1300 (FP8) TFLOP/s
            for dtype, fast in KINDS:
                rate = 700e12 if dtype == "bf16" else 1300e12
                inner = max(1, round(0.03 * rate / flop))
                fn = make_fn(dtype, fast, m, n, k)
                g = graph_of(fn, inner)
                time.sleep(args.rest)  # start from a rested GPU
                t0 = time.time()
                times, first, ends = run_one(g, args.seconds)
                t1 = time.time()
                marks.append([label, dtype, fast, f"{t0:.3f}", f"{t1:.3f}"])
                t_since = [first.elapsed_time(e) * 1e-3 for e in ends]
                tf = [flop * inner / t / 1e12 for t in times]
                for i, (ts, t, x) in enumerate(zip(t_since, times, tf)):
                    rows.append([label, dtype, fast, m, n, k, i, f"{ts:.6f}", f"{t:.6e}", inner,
                                 f"{x:.1f}"])
                burst = [x for ts, x in zip(t_since, tf) if ts <= 0.1]
                late = [x for ts, x in zip(t_since, tf) if ts >= t_since[-1] - 1.0]
                med = lambda v: sorted(v)[len(v) // 2] if v else float("nan")  # noqa: E731
                print(f"{label:24s} {dtype} fast={fast}  first {tf[0]:7.1f}  first 100 ms "
                      f"{med(burst):7.1f}  last 1 s {med(late):7.1f} TFLOP/s  ({len(tf)} replays of "
                      f"{inner})", flush=True)
                del g, fn
                torch.cuda.empty_cache()
    finally:
        if smi is not None:
            smi.terminate()
            smi.wait()
            smi_out.close()
        with open(os.path.join(args.outdir, "h100_gemm_sustained.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["shape", "dtype", "fast_accum", "m", "n", "k", "replay", "t_s", "replay_s",
                        "calls", "tflops"])
            w.writerows(rows)
        with open(os.path.join(args.outdir, "h100_sustained_marks.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["shape", "dtype", "fast_accum", "host_start_s", "host_end_s"])
            w.writerows(marks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
