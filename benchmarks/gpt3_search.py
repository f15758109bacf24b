"""End-to-end time of the full GPT-3 175B search on 1024 A100 80 GB (global batch 1536).

    python benchmarks/gpt3_search.py [--repeat 3] [--baseline /path/to/other/checkout]

Each run is a fresh process, `python -m diffperf.cli.main search --json ...`, timed from
outside: interpreter start, imports, loading the specs, enumerating every layout (474,720),
getting the search kernel (tracing and compiling it, or loading it), evaluating, ranking and
printing JSON. Settings:
  * first run: an empty cache folder (XDG_CACHE_HOME): the kernel is traced, compiled at
    LLVM -O1 and stored (cli/cache.py);
  * cached: a fresh process with that folder filled: the kernel is loaded, not traced or
    compiled (the figure issue 14 asks to be under 2 s);
  * no cache (--no-cache): everything compiled in the process (the quick -O0 kernel);
  * warm: the second search in one process (the first one untimed; under 1 s asked);
  * with --baseline DIR: the cached and no-cache settings again with PYTHONPATH=DIR (another
    checkout, e.g. the main branch), interleaved with this one's runs, so that the ratio is
    measured under the same load.
Prints min and median wall time, the least CPU time (user + system) of the process (what the
wall time would be on an otherwise idle machine, give or take the seconds XLA spends on both
cores), the search's own `seconds` (enumeration to ranking) and the load average.
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
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARM = """
import io, sys, time
from diffperf.cli.main import main
out = io.StringIO(); sys.stdout = out
main({job})
start = time.perf_counter(); main({job}); wall = time.perf_counter() - start
sys.stdout = sys.__stdout__
print(wall)
"""


CPU = []  # CPU seconds (user + system) of each run, in the order of the runs


def _run(extra, env):
    from _common import cpu_seconds  # the runs are child processes: their CPU time

    start, cpu = time.perf_counter(), cpu_seconds(children=True)
    out = subprocess.run([sys.executable, "-m", "diffperf.cli.main", *JOB, *extra], env=env,
                         cwd=env["PYTHONPATH"], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    CPU.append(cpu_seconds(children=True) - cpu)
    return wall, json.loads(out.stdout)


def _warm(env):
    out = subprocess.run([sys.executable, "-c", WARM.format(job=repr(JOB))], env=env,
                         cwd=env["PYTHONPATH"], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1]), None


def _report(name, runs, cpu=None):
    walls = [w for w, _ in runs]
    data = next((d for _, d in runs if d), None)
    tail = "" if data is None else (
        f"; search {min(d['seconds'] for _, d in runs):.2f} s; {data['evaluated']:,} layouts, "
        f"{data['feasible']:,} fit; best {data['ranked'][0]['step_time_s']:.4g} s/step")
    cpu = "" if not cpu else f", CPU min {min(cpu):.2f} s"
    print(f"{name:>26}: wall min {min(walls):.2f} s, median {statistics.median(walls):.2f} s"
          f"{cpu}{tail}  (load {os.getloadavg()[0]:.2f})", flush=True)
    return min(walls)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--baseline", help="another checkout to time beside this one (its root "
                   "folder; each run starts there, so its modules are the ones imported)")
    args = p.parse_args()
    sys.path.insert(0, os.path.dirname(__file__))
    from _common import machine

    print(machine())
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR",
                                                            "XLA_FLAGS")}
    env["PYTHONPATH"] = REPO
    base = dict(env, PYTHONPATH=os.path.abspath(args.baseline)) if args.baseline else None
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as cache_b:
        warm_env = dict(env, XDG_CACHE_HOME=cache)
        _report("first run (empty cache)", [_run([], warm_env)], CPU[-1:])
        if base:
            _run([], dict(base, XDG_CACHE_HOME=cache_b))  # fills the baseline's cache
        runs = {k: ([], []) for k in ("cached", "nocache", "cached_b", "nocache_b")}

        def timed(key, extra, e):
            runs[key][0].append(_run(extra, e))
            runs[key][1].append(CPU[-1])

        for _ in range(args.repeat):  # interleaved: both checkouts see the same load
            timed("cached", [], warm_env)
            timed("nocache", ["--no-cache"], env)
            if base:
                timed("cached_b", [], dict(base, XDG_CACHE_HOME=cache_b))
                timed("nocache_b", ["--no-cache"], base)
        a = _report("cached (fresh process)", *runs["cached"])
        b = _report("no cache", *runs["nocache"])
        _report("warm (same process)", [_warm(warm_env) for _ in range(args.repeat)])
        if base:
            a_b = _report("baseline cached", *runs["cached_b"])
            b_b = _report("baseline no cache", *runs["nocache_b"])
            print(f"ratio this / baseline: cached {a / a_b:.2f}, no cache {b / b_b:.2f}")


if __name__ == "__main__":
    main()
