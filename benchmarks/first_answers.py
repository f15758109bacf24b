"""Issue 19 item 5's timings of calibrate, design and sensitivity --optimum, each in fresh
processes started in the checkout's folder (`python -m diffperf.cli.main`):

    python benchmarks/first_answers.py [--only calibrate,design,sensitivity] [--repeat 1]

  * calibrate cold: `calibrate vtrain_a100 --folds 5` (the vTrain A100 CSV, 5-fold CV, the
    default 400 steps) in a fresh process with an empty cache folder (XDG_CACHE_HOME): every
    program is traced and compiled (asked: < 30 s on an idle 2-core machine);
  * design warm: `design --cost illustrative-usd` (GPT-3 175B on 1,024 A100 80 GB, global
    batch 1536), first and second call in one process (asked: the second < 5 s), then the
    command in a fresh process with the program store that the first process filled;
  * sensitivity warm: `sensitivity --optimum` (the default job), first and second call in
    one process (asked: the second < 5 s).
Prints wall and CPU seconds (user + system of the process, every thread: what the wall time
would be on one idle core; XLA's compilations and kernels use both cores) and the 1-minute
load average before and after each figure, and the held-out figures of the calibration.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALIBRATE = ["calibrate", "vtrain_a100", "--folds", "5", "--json"]
DESIGN = ["design", "--cost", "illustrative-usd"]
SENSITIVITY = ["sensitivity", "--optimum"]
# Two calls of a command in one process: wall and CPU seconds of each (stdout discarded).
TWICE = """
import contextlib, io, json, os, resource, sys, time
from diffperf.cli.main import main

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

out = []
for _ in range(2):
    load, wall, c = os.getloadavg()[0], time.perf_counter(), cpu()
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(sys.argv[1:])
    out.append(dict(code=code, wall_s=time.perf_counter() - wall, cpu_s=cpu() - c,
                    load=[load, os.getloadavg()[0]]))
print(json.dumps(out))
"""


def _child_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def fresh(argv, cache, code=None) -> dict:
    """One fresh process (the CLI, or `code` with argv), timed from outside."""
    env = os.environ | {"XDG_CACHE_HOME": cache}
    cmd = [sys.executable] + (["-c", code] if code else ["-m", "diffperf.cli.main"]) + argv
    load, wall, c = os.getloadavg()[0], time.perf_counter(), _child_cpu()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return dict(wall_s=time.perf_counter() - wall, cpu_s=_child_cpu() - c,
                load=[load, os.getloadavg()[0]], stdout=done.stdout)


def _line(label, r) -> str:
    return (f"{label:<58} {r['wall_s']:7.2f} s wall {r['cpu_s']:7.2f} s CPU   load "
            f"{r['load'][0]:.1f}-{r['load'][1]:.1f}")


def calibrate() -> None:
    with tempfile.TemporaryDirectory() as cache:
        r = fresh(CALIBRATE, cache)
    rep = json.loads(r["stdout"])["report"]
    print(_line("calibrate vtrain_a100 --folds 5, cold (empty cache)", r))
    print(f"  held-out MAPE {rep['heldout']['mape_pct']:.5f} %, fitted "
          f"{rep['fitted']['mape_pct']:.5f} %, interval coverage "
          f"{100 * rep['heldout_interval_coverage']:.3f} %")


def twice(label, argv) -> None:
    with tempfile.TemporaryDirectory() as cache:
        r = fresh(argv, cache, TWICE)
        first, second = json.loads(r["stdout"])
        print(_line(f"{label}: first call in a process (empty cache)", first))
        print(_line(f"{label}: second call in the process (warm)", second))
        print(_line(f"{label}: fresh process, program store filled", fresh(argv, cache)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", default="calibrate,design,sensitivity")
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args()
    from _common import machine  # benchmarks/ (this script's folder) is on sys.path

    print(machine())
    for _ in range(args.repeat):
        for what in args.only.split(","):
            if what == "calibrate":
                calibrate()
            elif what == "design":
                twice(" ".join(DESIGN), DESIGN)
            elif what == "sensitivity":
                twice(" ".join(SENSITIVITY), SENSITIVITY)
            else:
                raise SystemExit(f"--only: unknown {what!r} (calibrate, design, sensitivity)")


if __name__ == "__main__":
    main()
