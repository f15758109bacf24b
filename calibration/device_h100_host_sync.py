"""Host syncs and per-GEMM host time on one H100 and its x86 host (docs/accuracy-bridge.md,
"Session 15: host syncs inside the MoE layer (branch `hostsync`)"). A device script: PyTorch
only, < 1 min on an H100; writes CSVs to the folder argv[1] and prints a short table.

    python calibration/device_h100_host_sync.py OUT_DIR

1. host_launch.csv: host seconds to issue one call (GPU kept busy by torch.cuda._sleep so the
   host never waits): torch.mm BF16, torch._scaled_mm FP8 (cuBLASLt), an elementwise add, at a
   small expert shape (m 1024, n 2048, k 2048).
2. te_like_loop.csv: host seconds per expert of a Python copy of Transformer Engine's
   multi-stream grouped GEMM (one event on the main stream, 4 streams wait on it, one
   _scaled_mm / mm per expert on stream i % 4, each stream's event waited by the main stream):
   E = 4, 8, 16, 32 (TE runs this loop in C++: a Python loop is an upper bound of its host
   time per expert).
3. sync_bubble.csv: GPU idle seconds around a blocking `.tolist()` (an event recorded after the
   last kernel before it, one before the first kernel after it).
4. region.csv: the region form itself. After a blocking `.tolist()` the host enqueues a large
   GEMM (the "dispatch", G_d) then E = 16 small GEMMs (G_x), each preceded by a host busy-wait
   of tau; wall time from the sync's return to the last GEMM's end, against max(G_d + G_x,
   H_x) (the region's smooth max) and against the no-sync case (the host enqueued the same
   loop while the GPU still had 20 ms of earlier work: one max over everything).
"""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path

import torch

DEV = "cuda"


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def gpu_busy(ms):
    """Keep the GPU busy for about `ms` milliseconds (torch.cuda._sleep counts clock cycles)."""
    torch.cuda._sleep(int(ms * 1e-3 * 1.7e9))


def write(out, name, rows):
    if not rows:
        return
    with open(out / name, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(list(rows[0].keys()))
        for r in rows:
            w.writerow(list(r.values()))


def operands(m, n, k):
    a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=DEV, dtype=torch.bfloat16)
    a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    one = torch.ones((), device=DEV, dtype=torch.float32)
    return a, w, a8, w8, one


def host_launch(out):
    a, w, a8, w8, one = operands(1024, 2048, 2048)
    ops = {
        "mm_bf16": lambda: torch.mm(a, w.t()),
        "scaled_mm_fp8": lambda: torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one,
                                                  out_dtype=torch.bfloat16),
        "add_bf16": lambda: a.add(a),
    }
    rows = []
    for name, fn in ops.items():
        try:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            n = 300
            gpu_busy(60.0)
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            rows.append(dict(op=name, m=1024, n=2048, k=2048, calls=n,
                             host_s_per_call=(t1 - t0) / n))
        except Exception as e:  # noqa: BLE001 - report and go on
            rows.append(dict(op=name, m=1024, n=2048, k=2048, calls=0,
                             host_s_per_call=float("nan")))
            print(f"host_launch {name}: {e!r}")
    write(out, "host_launch.csv", rows)
    return rows


def te_like(fn_list, streams):
    main = torch.cuda.current_stream()
    ev = main.record_event()
    for s in streams:
        s.wait_event(ev)
    for i, fn in enumerate(fn_list):
        with torch.cuda.stream(streams[i % len(streams)]):
            fn()
    for s in streams:
        main.wait_event(s.record_event())


def te_like_loop(out):
    a, w, a8, w8, one = operands(1024, 2048, 2048)
    streams = [torch.cuda.Stream() for _ in range(4)]
    rows = []
    for dtype in ("fp8", "bf16"):
        if dtype == "fp8":
            fn = lambda: torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one,  # noqa: E731
                                          out_dtype=torch.bfloat16)
        else:
            fn = lambda: torch.mm(a, w.t())  # noqa: E731
        for E in (4, 8, 16, 32):
            try:
                te_like([fn] * E, streams)
                torch.cuda.synchronize()
                reps = max(120 // E, 4)  # < ~600 queued entries: the host never waits
                gpu_busy(60.0)
                t0 = time.perf_counter()
                for _ in range(reps):
                    te_like([fn] * E, streams)
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                rows.append(dict(dtype=dtype, experts=E, reps=reps,
                                 host_s_per_grouped=(t1 - t0) / reps,
                                 host_s_per_expert=(t1 - t0) / reps / E))
            except Exception as e:  # noqa: BLE001
                print(f"te_like_loop {dtype} E {E}: {e!r}")
    write(out, "te_like_loop.csv", rows)
    return rows


def sync_bubble(out):
    x = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16)
    small = torch.zeros(16, device=DEV, dtype=torch.int64)
    rows = []
    for rep in range(20):
        torch.mm(x, x)
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        small.add_(1).tolist()  # the blocking D2H read (as TEGroupedMLP's .tolist())
        e1.record()
        torch.mm(x, x)
        torch.cuda.synchronize()
        rows.append(dict(rep=rep, gpu_idle_s=e0.elapsed_time(e1) * 1e-3))
    write(out, "sync_bubble.csv", rows)
    return rows


def region(out):
    big = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    a, w, _, _, _ = operands(2048, 768, 2048)
    small = torch.zeros(16, device=DEV, dtype=torch.int64)
    E = 16
    # GPU times alone (CUDA events, host far ahead)
    for _ in range(3):
        torch.mm(big, big)
        torch.mm(a, w.t())
    torch.cuda.synchronize()

    def timed(fn, reps=10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        gpu_busy(5.0)
        e0.record()
        for _ in range(reps):
            fn()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) * 1e-3 / reps

    g_d = timed(lambda: torch.mm(big, big))
    g_1 = timed(lambda: torch.mm(a, w.t()), 50)
    rows = []
    for tau_us in (0, 10, 20, 50, 100, 200, 400):
        tau = tau_us * 1e-6
        for mode in ("after_sync", "no_sync"):
            vals = []
            for _ in range(5):
                torch.cuda.synchronize()
                if mode == "no_sync":
                    gpu_busy(20.0)  # earlier work queued: the host runs ahead of it
                    t_start = time.perf_counter()
                else:
                    small.add_(1).tolist()
                    t_start = time.perf_counter()
                e0 = torch.cuda.Event(enable_timing=True)
                e1 = torch.cuda.Event(enable_timing=True)
                e0.record()
                torch.mm(big, big)
                h0 = time.perf_counter()
                for _ in range(E):
                    spin(tau)
                    torch.mm(a, w.t())
                h_x = time.perf_counter() - h0
                e1.record()
                torch.cuda.synchronize()
                wall = time.perf_counter() - t_start
                vals.append((e0.elapsed_time(e1) * 1e-3, h_x, wall))
            gpu_span = sorted(v[0] for v in vals)[2]
            h_x = sorted(v[1] for v in vals)[2]
            wall = sorted(v[2] for v in vals)[2]
            rows.append(dict(mode=mode, tau_s=tau, experts=E, g_d_s=g_d, g_x_s=E * g_1,
                             host_loop_s=h_x, gpu_span_s=gpu_span, wall_s=wall,
                             region_max_s=max(g_d + E * g_1, h_x + g_1)))
    write(out, "region.csv", rows)
    return rows


def main(argv) -> int:
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    print(torch.cuda.get_device_name(), torch.__version__)
    for r in host_launch(out):
        print(f"host per call  {r['op']:14s} {r['host_s_per_call'] * 1e6:7.1f} us")
    for r in te_like_loop(out):
        print(f"TE-like loop   {r['dtype']:4s} E {r['experts']:2d}: "
              f"{r['host_s_per_expert'] * 1e6:6.1f} us per expert")
    b = sync_bubble(out)
    idle = sorted(r["gpu_idle_s"] for r in b)
    print(f"sync bubble    median {idle[len(idle) // 2] * 1e6:.1f} us, min {idle[0] * 1e6:.1f} us")
    print(f"{'mode':10s} {'tau us':>6s} {'G_d+G_x ms':>10s} {'H_x ms':>7s} {'span ms':>8s} "
          f"{'region max':>10s}")
    for r in region(out):
        print(f"{r['mode']:10s} {r['tau_s'] * 1e6:6.0f} {(r['g_d_s'] + r['g_x_s']) * 1e3:10.3f} "
              f"{r['host_loop_s'] * 1e3:7.3f} {r['gpu_span_s'] * 1e3:8.3f} "
              f"{r['region_max_s'] * 1e3:10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
