"""Session-wide test settings."""

import pytest


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


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller collects each worker's fuzz counts (pytest-xdist's workeroutput)."""
    output = getattr(node, "workeroutput", None) or {}
    node.config.stash.setdefault(_FUZZ_KEY, []).extend(output.get("fuzz_totals", []))


_FUZZ_KEY = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter):
    """The fuzz suite's counts (tests/test_fuzz.py TOTALS) in the summary of any run that
    included it, also under -q and with pytest-xdist's workers: inputs tried, refused,
    loaded, predicted, crashes."""
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


# The heaviest files first (CPU seconds per file, benchmarks/README.md "Session 11: suite
# time"): with `--dist loadfile` each xdist worker takes the next whole file when it is free,
# so a heavy file collected last leaves one worker running alone at the end (longest
# processing time first). Only the order changes: every test still runs.
_HEAVY_FIRST = ("test_gradients.py", "test_search.py", "test_properties.py", "test_sweep.py",
                "test_goodput.py", "test_sensitivity.py", "test_cli.py", "test_first_answer.py",
                "test_studies.py", "test_reliability.py", "test_steer.py", "test_compile.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(_HEAVY_FIRST)}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda it: (rank.get(it.path.name, len(rank)), order[id(it)]))


# Files that share compiled programs run on one xdist worker, in the order above: test_goodput's
# goodput and step-time elasticity programs and predict's serve test_sensitivity's
# (`sensitivity --goodput` among them). In one process the two files cost ~20 s of CPU less
# than apart (99.6 s against 121.6 s, -n 0 under load ~5, benchmarks/README.md "Session 15");
# plain `--dist loadfile` put them on one worker only when they happened to meet.
_SAME_WORKER = {"tests/test_sensitivity.py": "tests/test_goodput.py"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` with the files of _SAME_WORKER in one work unit (None: xdist's own
    scheduler for any other --dist)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid):
            scope = super()._split_scope(nodeid)
            return _SAME_WORKER.get(scope, scope)

    return SharedFileScheduling(config, log)
