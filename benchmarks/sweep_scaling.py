"""Layout x hardware points per second of a sweep (search.sweep) on 1, 2, 4, ... devices.

    python benchmarks/sweep_scaling.py [--devices 1,2,4] [--cores] [--points 32]
        [--axes flops] [--full] [--repeat 2]

The job: every layout of GPT-3 175B on 1024 A100 80 GB, global batch 1536 (474,720 layouts
since pipelines may be uneven; 466,320 before) at each point of a hardware grid. Each setting runs in a fresh process: on the CPU with
XLA_FLAGS=--xla_force_host_platform_device_count=N (N host devices); on a GPU machine the
first N GPUs. Each process first compiles the sweep kernel (a sweep of one call's points, the
same shapes), then times the whole sweep (best of --repeat) and reports points/s, the
speed-up over the first setting, the CPU seconds the process used per 10^6 points (user +
system: unlike the wall time, it does not depend on what else runs on the machine) and the
peak memory (RSS).

On the CPU, XLA runs every host device's kernels on one intra-op thread pool with a thread
per core, and one device already keeps every core busy (two XLA threads at equal CPU time on
2 cores), so more host devices cannot add speed there: their figure shows the cost of the
split. --cores runs one device pinned to 1 core (taskset), then on every core: the scaling
that the CPU has. Linear scaling in devices is for devices with their own processors (GPUs).

--axes flops sweeps the 16-bit matrix peak (every part of every prediction changes with the
point: the worst case for a sweep); --axes network sweeps the InfiniBand bandwidth (the GEMM
and memory times stay shared between points, vmap computes them once per chunk). --full runs
one sweep of at least 1e9 points (33 x 65 = 2,145 points of InfiniBand x HBM bandwidth) on
the first device count, to show that memory stays bounded (the peak RSS of a 10^9-point sweep
is that of a 10^7-point one).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = r"""
import json, os, resource, sys, time
import jax, numpy as np
sys.path.insert(0, {bench!r})
from _common import cpu_seconds as cpu, machine
from diffperf import load_model, load_system
from diffperf.search import POINTS_PER_CALL, enumerate_layouts, sweep
n, points, kind = {n}, {points}, {kind!r}
devices = jax.devices()[:n]
model, system = load_model("gpt3-175b"), load_system("a100-sxm-80gb")
table = enumerate_layouts(model, 1024, 1536)
if kind == "flops":
    axes = {{"matmul_flops_per_s": np.geomspace(150e12, 2500e12, points)}}
elif kind == "network":
    axes = {{"tiers[1].bandwidth_Bps": np.geomspace(5e9, 400e9, points)}}
else:  # full: 33 x 65 points of InfiniBand x HBM bandwidth
    axes = {{"tiers[1].bandwidth_Bps": np.geomspace(5e9, 400e9, 33),
             "hbm_bandwidth_Bps": np.geomspace(1e12, 8e12, 65)}}
dev = None if n == 1 else devices
block = {{p: v[:POINTS_PER_CALL * n] for p, v in axes.items()}}
start = time.perf_counter()
sweep(model, system, None, table, block, devices=dev, validate=False)
compile_s = time.perf_counter() - start
best, best_cpu = float("inf"), float("inf")
for _ in range({repeat}):
    start, c0 = time.perf_counter(), cpu()
    result = sweep(model, system, None, table, axes, devices=dev, validate=False)
    best, best_cpu = min(best, time.perf_counter() - start), min(best_cpu, cpu() - c0)
print(json.dumps(dict(machine=machine(), n=n, points=result.n_points, hardware=int(np.prod(
    result.shape)), compile_s=compile_s, sweep_s=best, rate=result.n_points / best,
    cpu_per_M=best_cpu / result.n_points * 1e6, cores=len(os.sched_getaffinity(0)),
    rss_MB=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    load=os.getloadavg()[0], best_s=float(np.min(result.step_time_s)))))
"""


def _child(n, points, kind, repeat, pin=None):
    env = dict(os.environ, PYTHONPATH=REPO)
    import jax  # noqa: F401 (the backend decides how N devices are made)

    if jax.default_backend() == "cpu":
        flags = env.get("XLA_FLAGS", "").replace("--xla_force_host_platform_device_count", "")
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    code = CHILD.format(bench=os.path.dirname(os.path.abspath(__file__)), n=n, points=points,
                        kind=kind, repeat=repeat)
    pinned = ["taskset", "-c", pin] if pin else []
    out = subprocess.run([*pinned, sys.executable, "-c", code], env=env, cwd=REPO,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", default="1,2,4", help="device counts (default 1,2,4)")
    p.add_argument("--points", type=int, default=32, help="hardware points (default 32)")
    p.add_argument("--axes", default="flops", choices=("flops", "network"))
    p.add_argument("--full", action="store_true", help="then one sweep of >= 1e9 points")
    p.add_argument("--cores", action="store_true", help="then 1 device on 1 core, and on all")
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    counts = [int(c) for c in args.devices.split(",")]
    settings = [(f"{n} device(s)", n, None) for n in counts]
    if args.cores:
        settings += [("1 device, 1 core", 1, "0"), (f"1 device, {os.cpu_count()} cores", 1,
                                                     None)]
    base = None
    for name, n, pin in settings:
        r = _child(n, args.points, args.axes, args.repeat, pin)
        if base is None:
            print(r["machine"].replace(" x 1 ", " x N "))
            base = r["rate"]
        print(f"{name}: {r['points']:,} points ({r['hardware']} hardware x "
              f"{r['points'] // r['hardware']:,} layouts, "
              f"--axes {args.axes}) in {r['sweep_s']:.2f} s = {r['rate'] / 1e6:.2f} M points/s,"
              f" x{r['rate'] / base:.2f}; CPU {r['cpu_per_M']:.3f} s per 1e6 points; compile "
              f"{r['compile_s']:.1f} s; peak RSS {r['rss_MB']:.0f} MB; load {r['load']:.2f}",
              flush=True)
    if args.full:
        r = _child(counts[0], 0, "full", 1)
        print(f"full: {r['points']:,} points ({r['hardware']:,} hardware points) on "
              f"{counts[0]} device(s) in {r['sweep_s']:.1f} s = {r['rate'] / 1e6:.2f} M "
              f"points/s; CPU {r['cpu_per_M']:.3f} s per 1e6 points; peak RSS "
              f"{r['rss_MB']:.0f} MB; load {r['load']:.2f}")


if __name__ == "__main__":
    main()
