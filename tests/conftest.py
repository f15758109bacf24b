"""Session-wide test settings."""

import os
import shutil
import tempfile

import pytest

# The folder of this run's compiled programs (below), made by the controlling process and
# handed to pytest-xdist's workers through the environment (they start after
# pytest_configure and inherit it).
_PROGRAMS_ENV = "DIFFPERF_TEST_PROGRAM_STORE"
# Programs that take less than this to compile are not kept: a jnp op run eagerly compiles
# a tiny program in ~10 ms, whose store entry (hash, two files) would cost about as much as it
# saves.
_PROGRAMS_MIN_COMPILE_S = 0.1


def pytest_configure(config):
    """Every test process of one run (the two pytest-xdist workers, or the one process of
    -n 0) shares JAX's persistent compilation cache: a program that one of them compiled
    (XLA:CPU, same module, options and JAX) is loaded by any later compilation of it, in
    the same worker (a new jitted closure, after jax.clear_caches) or the other one. The
    cache is served by a `cli.cache.KernelStore` (atomic writes, sha256-checked reads:
    safe for two processes; diffperf.executables.serve_globally) in a fresh folder of
    this run, deleted when it ends: nothing is read from an earlier run or from a
    user's cache. Tests that must see XLA compile take the `no_program_store` fixture."""
    folder = os.environ.get(_PROGRAMS_ENV) if os.environ.get("PYTEST_XDIST_WORKER") else None
    if folder is None:  # the controller, or a run without workers: a fresh folder
        folder = tempfile.mkdtemp(prefix="diffperf-test-programs-")
        os.environ[_PROGRAMS_ENV] = folder
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
        if getattr(config.option, "numprocesses", None):
            return  # the controller of pytest-xdist's workers compiles nothing itself
    import jax

    from diffperf.executables import serve_globally

    jax.config.update("jax_persistent_cache_min_compile_time_secs", _PROGRAMS_MIN_COMPILE_S)
    serve_globally(_run_store(folder))


_STORES = []  # this process's run store (pytest_configure), for its counts


def _run_store(folder):
    """A KernelStore in `folder` that keeps the run's counts: programs written and loaded,
    the seconds JAX spent writing (serialize, compress, store) and loading (read,
    decompress, deserialize) them, and the XLA compile time of each program it hands out
    (JAX's own measurement when the program was compiled, kept beside it as KEY.secs)."""
    import time

    from jax._src import compilation_cache, compiler

    from diffperf.cli.cache import KernelStore

    class RunStore(KernelStore):
        written = loaded = 0
        saved_s = write_s = read_s = 0.0

        def __getitem__(self, key):
            blob = super().__getitem__(key)
            self.loaded += 1
            try:
                self.saved_s += float(self._path(key, ".secs").read_text())
            except (OSError, ValueError):
                pass
            return blob

        def __setitem__(self, key, value):
            super().__setitem__(key, value)
            self.written += 1

    store = RunStore(folder=folder)
    cache_write, put, get = (compiler._cache_write, compilation_cache.put_executable_and_time,
                             compilation_cache.get_executable_and_time)

    def timed_cache_write(cache_key, compile_time_secs, *args, **kwargs):
        if compile_time_secs >= _PROGRAMS_MIN_COMPILE_S:  # a program the store keeps
            try:
                store._path(cache_key, ".secs").write_text(repr(float(compile_time_secs)))
            except (OSError, KeyError):
                pass
        return cache_write(cache_key, compile_time_secs, *args, **kwargs)

    def timed_put(*args, **kwargs):
        t = time.perf_counter()
        try:
            return put(*args, **kwargs)
        finally:
            store.write_s += time.perf_counter() - t

    def timed_get(*args, **kwargs):
        t = time.perf_counter()
        try:
            return get(*args, **kwargs)
        finally:
            store.read_s += time.perf_counter() - t

    compiler._cache_write = timed_cache_write
    compilation_cache.put_executable_and_time = timed_put
    compilation_cache.get_executable_and_time = timed_get
    _STORES.append(store)
    return store


def _store_counts() -> list[dict]:
    return [dict(written=s.written, loaded=s.loaded, saved_s=s.saved_s, write_s=s.write_s,
                 read_s=s.read_s) for s in _STORES]


@pytest.fixture
def no_program_store(monkeypatch):
    """JAX's persistent compilation cache off for one test (pytest_configure turns it on):
    every compilation of the test runs XLA, as in a process of its own."""
    from jax._src import compilation_cache

    monkeypatch.setattr(compilation_cache, "_cache_checked", True)
    monkeypatch.setattr(compilation_cache, "_cache_used", False)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """The CLI keeps compiled programs under $XDG_CACHE_HOME/diffperf (cli.cache): tests get
    a folder of their own, so they neither read a user's store nor write into it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


@pytest.fixture
def x64():
    """float64 for the duration of one test, restored afterwards (the library never sets it:
    STYLE.md section 4)."""
    import jax

    previous = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


def _fuzz_totals() -> list[dict]:
    """This process's fuzz counts (tests/test_fuzz.py TOTALS), as plain dicts."""
    import sys

    return [dict(family=t.family, tried=t.tried, refused=t.refused, loaded=t.loaded,
                 predicted=t.predicted, crashes=len(t.crashes))
            for name, mod in list(sys.modules.items()) if name.endswith("test_fuzz")
            for t in getattr(mod, "TOTALS", ())]


def pytest_sessionfinish(session):
    """Under pytest-xdist a worker hands its fuzz counts to the controller."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["fuzz_totals"] = _fuzz_totals()
        workeroutput["store_counts"] = _store_counts()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller collects each worker's fuzz counts (pytest-xdist's workeroutput)."""
    output = getattr(node, "workeroutput", None) or {}
    node.config.stash.setdefault(_FUZZ_KEY, []).extend(output.get("fuzz_totals", []))
    node.config.stash.setdefault(_STORE_KEY, []).extend(output.get("store_counts", []))


_FUZZ_KEY = pytest.StashKey[list]()
_STORE_KEY = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter):
    """The fuzz suite's counts (tests/test_fuzz.py TOTALS) in the summary of any run that
    included it, also under -q and with pytest-xdist's workers: inputs tried, refused,
    loaded, predicted, crashes. Then what the run's program store (pytest_configure) kept
    and handed out, per process."""
    counts = _store_counts() + terminalreporter.config.stash.get(_STORE_KEY, [])
    if counts:
        terminalreporter.section("compiled programs shared within the run")
        for i, c in enumerate(counts):
            terminalreporter.write_line(
                f"process {i}: {c['written']} programs written ({c['write_s']:.1f} s), "
                f"{c['loaded']} loaded instead of compiled ({c['read_s']:.1f} s of lookups "
                f"and loads, for {c['saved_s']:.1f} s of XLA compilation they had taken)")
    totals = _fuzz_totals() + terminalreporter.config.stash.get(_FUZZ_KEY, [])
    if not totals:
        return
    terminalreporter.section("fuzz counts")
    for t in totals:
        terminalreporter.write_line(
            f"{t['family']}: {t['tried']} inputs, {t['refused']} refused, {t['loaded']} "
            f"loaded, {t['predicted']} predicted, {t['crashes']} crashes")
    terminalreporter.write_line(
        f"total: {sum(t['tried'] for t in totals)} inputs, "
        f"{sum(t['crashes'] for t in totals)} crashes (tracebacks, hangs, non-finite "
        f"outputs, bad values accepted)")
