"""Where the test suite's CPU goes, test by test: CPU seconds, XLA compilations, and programs
compiled twice with the same signature in one process.

    python benchmarks/suite_profile.py tests/test_search.py [tests/test_sweep.py ...]
        [--top 12] [--together] [--json OUT]

Each file runs in a fresh `python -m pytest -q -n 0` (CI's `--dist loadfile` gives an xdist
worker whole files, one after another, in one process); `--together` runs the files in one
process instead, to measure what programs files share inside one worker (the sum of the
separate runs minus the joint run). This module is also the pytest plugin those runs load
(`-p suite_profile`, benchmarks/ on PYTHONPATH): per test it records the CPU seconds of the
process (user + system, every thread, and the subprocesses it waited for, as
resource.getrusage counts them), and every XLA compilation JAX logs (`jax_log_compiles`:
"Compiling NAME with global shapes and types ...", then "Finished XLA compilation of NAME in
S sec"; the seconds are wall time). A "repeat" is a function compiled again with the same
argument types in the same process: a cache miss another test's program could have served,
or the same function with other static arguments (the log does not print them): read the
test before acting on one.

CPU seconds, not wall time, are the comparable figure on a shared machine; they still move by
about 10 % with the load (measured: one compile 38.5-44.9 s of CPU at load 3.5-5.9). The
`--together` saving includes one process start less (JAX and the package imported, ~2-3 s).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import logging
import os
import re
import resource
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_ENV = "SUITE_PROFILE_OUT"

# ------------------------------------------------------------------------ the pytest plugin

_COMPILING = re.compile(r"^Compiling (\S+) with global shapes and types (.*?)\. Argument",
                        re.S)
_FINISHED = re.compile(r"^Finished XLA compilation of (\S+) in ([0-9.e+-]+) sec")
_records: list = []  # (test id, kind, name, value): kind cpu / sig / xla
_test = {"id": "(collection)"}


class _CompileLog(logging.Handler):
    def emit(self, record):
        message = record.getMessage()
        if m := _COMPILING.match(message):
            digest = hashlib.md5(m.group(2).encode()).hexdigest()[:12]
            _records.append((_test["id"], "sig", m.group(1), digest))
        elif m := _FINISHED.match(message):
            _records.append((_test["id"], "xla", m.group(1), float(m.group(2))))


def _cpu_s() -> float:
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                   resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def pytest_configure(config):
    import jax

    logging.getLogger("jax").addHandler(_CompileLog(level=logging.DEBUG))
    jax.config.update("jax_log_compiles", True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _test["id"] = item.nodeid
    start = _cpu_s()
    yield
    _records.append((item.nodeid, "cpu", "", _cpu_s() - start))


def pytest_sessionfinish(session):
    out = os.environ.get(OUT_ENV)
    if out:
        with open(out, "w") as fh:
            json.dump(_records, fh)


# ------------------------------------------------------------------------------ the runner


def _run(files, out) -> tuple[float, str]:
    """(CPU seconds of one pytest process over `files`, its last output line)."""
    env = dict(os.environ, **{OUT_ENV: out})
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.join(REPO, "benchmarks"), env.get("PYTHONPATH")) if p)
    start = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p",
                           "no:cacheprovider", "-p", "suite_profile", *files], cwd=REPO,
                          env=env, capture_output=True, text=True)
    end = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (end.ru_utime - start.ru_utime) + (end.ru_stime - start.ru_stime)
    return cpu, (done.stdout.strip().splitlines() or ["(no output)"])[-1]


def _report(records, top, min_repeat_s) -> dict:
    cpu = {t: v for t, kind, _, v in records if kind == "cpu"}
    xla = collections.defaultdict(list)
    seen = collections.defaultdict(list)  # (name, signature) -> [[test, XLA seconds]]
    last = {}  # name -> its latest signature (JAX logs "Compiling" before "Finished")
    for t, kind, name, v in records:
        if kind == "xla":
            xla[t].append(v)
            if name in last:
                seen[(name, last.pop(name))][-1][1] += v
        elif kind == "sig":
            seen[(name, v)].append([t, 0.0])
            last[name] = v
    for t, s in sorted(cpu.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {s:7.1f} s CPU  {len(xla[t]):3d} compiles {sum(xla[t]):6.1f} s  "
              f"{t.split('::', 1)[-1]}")
    repeats = {f"{name} [{digest}]": uses for (name, digest), uses in seen.items()
               if len(uses) > 1 and sum(s for _, s in uses) >= min_repeat_s}
    for key, uses in repeats.items():
        print(f"  repeat: {key} compiled {len(uses)}x, "
              f"{sum(s for _, s in uses):.1f} s: "
              f"{', '.join(t.split('::', 1)[-1] for t, _ in uses)}")
    return dict(tests_cpu_s=cpu, compiles={t: len(v) for t, v in xla.items()},
                compile_s={t: sum(v) for t, v in xla.items()}, repeats=repeats)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="test files, relative to the repository root")
    ap.add_argument("--top", type=int, default=12, help="tests listed per run (by CPU)")
    ap.add_argument("--together", action="store_true", help="also run the files in one "
                    "process and print what that saves over the separate runs")
    ap.add_argument("--min-repeat-s", type=float, default=1.0, help="list a repeat when "
                    "its compilations took this many seconds in all (default 1)")
    ap.add_argument("--json", help="write every figure to this file")
    args = ap.parse_args(argv)
    import jax

    print(f"JAX {jax.__version__}, {jax.default_backend()} backend, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f}")
    runs = [[f] for f in args.files] + ([args.files] if args.together and
                                        len(args.files) > 1 else [])
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        for files in runs:
            out = os.path.join(tmp, "records.json")
            cpu, last = _run(files, out)
            name = " + ".join(files)
            print(f"{name}: {cpu:.1f} s CPU (load {os.getloadavg()[0]:.2f}): {last}")
            with open(out) as fh:
                records = json.load(fh)
            report = _report(records, args.top, args.min_repeat_s)
            figures[name] = dict(cpu_s=cpu, result=last) | report
    if args.together and len(args.files) > 1:
        apart = sum(figures[f]["cpu_s"] for f in args.files)
        joint = figures[" + ".join(args.files)]["cpu_s"]
        print(f"separate runs {apart:.1f} s CPU, one process {joint:.1f} s: "
              f"{apart - joint:+.1f} s shared")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
