"""End-to-end time of the full GPT-3 175B search on 1024 A100 80 GB (global batch 1536).

    python benchmarks/gpt3_search.py [--repeat 3]

Each run is a fresh process, `python -m diffperf.cli.main search --json ...`, timed from
outside: interpreter start, imports, loading the specs, enumerating every layout, tracing
and compiling the search kernel (one for every placement), evaluating, ranking and printing
JSON. Three settings:
  * cold: no persistent compilation cache (--no-cache): everything compiled in the process;
  * warm: the persistent XLA cache (~/.cache/diffperf/jax, here a fresh temporary folder
    filled by one untimed run): tracing still runs, XLA compilation is loaded from disk;
  * cold, one placement (--placements tp-cp-dp-pp): 272,280 layouts instead of 466,320
    (the second placement costs only its evaluation: no trace or compile of its own).
Prints min and median wall time, and the search's own `seconds` (enumeration to ranking).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

JOB = ["search", "--model", "gpt3-175b", "--system", "a100-sxm-80gb", "--gpus", "1024",
       "--global-batch", "1536", "--json"]


def _run(extra, env):
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "diffperf.cli.main", *JOB, *extra], env=env,
                         capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    return wall, json.loads(out.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    sys.path.insert(0, os.path.dirname(__file__))
    from _common import machine

    print(machine())
    env = dict(os.environ)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    with tempfile.TemporaryDirectory() as cache:
        warm_env = dict(env, XDG_CACHE_HOME=cache)
        _run([], warm_env)  # fills the cache
        settings = (("cold", ["--no-cache"], env), ("warm cache", [], warm_env),
                    ("cold, one placement", ["--no-cache", "--placements", "tp-cp-dp-pp"], env))
        for name, extra, e in settings:
            runs = [_run(extra, e) for _ in range(args.repeat)]
            walls = [w for w, _ in runs]
            data = runs[0][1]
            print(f"{name:>20}: wall min {min(walls):.2f} s, median "
                  f"{statistics.median(walls):.2f} s; search {min(d['seconds'] for _, d in runs):.2f}"
                  f" s; {data['evaluated']:,} layouts, {data['feasible']:,} fit; best "
                  f"{data['ranked'][0]['step_time_s']:.4g} s/step "
                  f"({data['ranked'][0]['layout']})")


if __name__ == "__main__":
    main()
