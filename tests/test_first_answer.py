"""Fast first answers (issue 19, item 5): the Python API keeps its compiled program in the
on-disk store by default, so a second process loads it instead of compiling it; calibrate's
folds and starts share one compiled fit; calibrate's progress shows on stderr when piped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np

import diffperf
from diffperf import api, calibrate as cal
from diffperf.api import _as_float
from diffperf.specs.batch import anonymous, stack

ROOT = Path(__file__).resolve().parents[1]

# One prediction in a fresh process; prints JAX's persistent-cache hits (the program store is
# served through JAX's cache interface: diffperf.executables) and the step time.
_FIRST_PREDICT = """
import json, sys
import jax
hits = []
jax.monitoring.register_event_listener(
    lambda name, **kw: hits.append(name) if name == "/jax/compilation_cache/cache_hits" else None)
import diffperf as dp
r = dp.predict(dp.load_model("gpt-small"), dp.Parallel(tp=2, dp=4, global_batch=8),
               dp.load_system("a100-sxm-80gb"))
print(json.dumps(dict(hits=len(hits), step=float(r.step_time_s))))
"""


def _first_predict(cache, **env):
    out = subprocess.run([sys.executable, "-c", _FIRST_PREDICT], cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=300,
                         env=os.environ | {"XDG_CACHE_HOME": str(cache)} | env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_api_predict_uses_the_program_store_across_processes(tmp_path):
    """The first process compiles and writes the store under $XDG_CACHE_HOME/diffperf; the
    second loads the program from it (a cache hit, no compilation) and gives the same value;
    DIFFPERF_NO_CACHE=1 reads and writes nothing."""
    off = _first_predict(tmp_path / "off", DIFFPERF_NO_CACHE="1")
    assert off["hits"] == 0 and not (tmp_path / "off").exists()
    first = _first_predict(tmp_path / "xdg")
    stored = list((tmp_path / "xdg" / "diffperf" / "kernels").glob("*/*.bin"))
    assert first["hits"] == 0 and len(stored) == 1, stored
    second = _first_predict(tmp_path / "xdg")
    assert second["hits"] == 1
    assert second["step"] == first["step"] == off["step"]


def test_default_store_is_switchable(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(api.NO_CACHE_ENV, "1")
    assert api.default_store() is None
    monkeypatch.setenv(api.NO_CACHE_ENV, "0")
    store = api.default_store()
    assert store is not None and store.folder.is_relative_to(tmp_path / "diffperf")
    assert api.default_store() is store  # one store per folder and process


def _runs():
    """A small measured-run table: GPT-2 small layouts on one A100 node, step times from the
    model with 2 % noise (shapes only matter here). The step times come from the program
    without optional features, as calibrate traces these runs (`set_features`: none can act
    on them, the same numbers), which compiles in about half the time of the full one."""
    model = diffperf.load_model("gpt-small")
    layouts = [diffperf.Parallel(tp=tp, dp=dp, micro_batch=mb, global_batch=8)
               for tp in (1, 2) for dp in (1, 2) for mb in (1, 2)]
    n = len(layouts)
    system = _as_float(anonymous(diffperf.load_system("a100-4nic")))
    M, P, T = _as_float((stack([model] * n), stack(layouts), stack([diffperf.Training()] * n)))
    runs = cal.RunSet(system, M, P, T, np.zeros(n), np.full(n, np.nan), np.ones(n), np.zeros(n))
    assert cal.set_features([runs]) == frozenset()
    step, _ = cal.run_predictions(system.eff, runs, None, features=frozenset())
    noise = np.random.default_rng(0).normal(0, 0.02, n)
    return system, cal.RunSet(system, M, P, T, np.log(np.asarray(step)) + noise,
                              np.full(n, np.nan, np.float32), np.ones(n, np.float32),
                              np.zeros(n, np.float32))


def test_folds_and_starts_share_one_compiled_fit(x64):
    """Three folds x two starts: one compile of the fit (`_fit_chunk`) serves them all, and
    each fit equals the same fit run alone (batching changes no result beyond rounding). In
    float64: twelve Adam steps carry float32's rounding of the batched vs the single program
    (their reductions run in another order) up to ~4e-5 relative; float64 leaves 1e-5 to the
    batching itself."""
    system, rs = _runs()
    fields = ("mm_max", "host_layer_s")
    starts = [system.eff, system.eff.replace(host_layer_s=1e-3)]
    folds = [np.arange(8) % 3 != k for k in range(3)]
    jobs = [(f, s) for f in folds for s in starts]
    programs = cal._fit_programs().values()
    for p in programs:
        p.clear_cache()
    traced = []  # on_traced: once, after tracing and before the compile (calibrate_folds)
    fits = cal.fit_many([s for _, s in jobs], [(f.astype(np.float32),) for f, _ in jobs],
                        [rs], fields, steps=12,
                        on_traced=lambda: traced.append(sum(p._cache_size() for p in programs)))
    assert traced == [0]
    assert sum(p._cache_size() for p in programs) == 1
    alone = cal.fit(starts[1], [rs._replace(weight=folds[2].astype(np.float32))], fields,
                    steps=12)
    assert sum(p._cache_size() for p in programs) == 2  # another batch size: one more
    np.testing.assert_allclose(fits[-1].loss_history, alone.loss_history, rtol=1e-5)
    for k in fields:
        np.testing.assert_allclose(float(getattr(fits[-1].eff, k)),
                                   float(getattr(alone.eff, k)), rtol=1e-5)
    assert len({f.loss_history[-1] for f in fits}) == len(fits)  # six different fits


def test_chunking_covers_every_step():
    for steps in (1, 7, 40, 41, 300, 400, 401):
        calls, length = cal._chunking(steps)
        assert calls * length >= steps > (calls - 1) * length
        assert calls * length - steps < calls


def test_calibrate_progress_shows_on_piped_stderr():
    """calibrate's progress (`fit_progress`, the callable calibrate_folds advances) with
    stderr a pipe: a line at the start and at each tenth of the steps, on stderr only."""
    code = ("from diffperf.cli.calibrate_cmd import fit_progress\n"
            "with fit_progress(6, 400) as advance:\n"
            "    for _ in range(10):\n"
            "        advance(40)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert lines[0] == "fitting 6 fits x 400 steps: compiling ...", lines
    assert [ln.split(": ")[1].split(",")[0] for ln in lines[1:]] == [
        f"{40 * k}/400 steps" for k in range(1, 11)], lines


def test_jacobian_by_looped_jvp_equals_jacfwd():
    """calibrate's Jacobian (one JVP per fitted field, lax.map) is jax.jacfwd's (the tangents
    batched), to float32 rounding."""
    system, rs = _runs()
    fields = ("mm_max", "host_layer_s", "kernel_s")
    got = cal.log_jacobian(system.eff, fields, rs, 0.02, frozenset())

    def log_step(u):
        step, _ = cal.run_predictions(cal.from_unconstrained(system.eff, u), rs, 0.02,
                                      features=frozenset())
        return jax.numpy.log(step)

    ref = jax.jacfwd(log_step)(cal.to_unconstrained(system.eff, fields))
    np.testing.assert_allclose(got, np.stack([np.asarray(ref[k]) for k in fields], axis=1),
                               rtol=1e-5, atol=1e-7)


def _unregister(listener):
    from jax._src import monitoring

    drop = getattr(monitoring, "_unregister_event_duration_listener_by_callback", None)
    if drop is not None:
        drop(listener)


def test_post_fit_programs_compile_once_beside_the_fit(request):
    """`_compile_after_fit` compiles the exact predictions and the Jacobian in a thread; the
    fitted efficiencies (same types and shapes as the start) then find them compiled: the
    calls after the fit trace and compile nothing. The runs need no optional feature."""
    system, rs = _runs()
    fields = ("mm_max", "host_layer_s")
    assert cal.set_features([rs]) == frozenset()
    events = []

    def listen(name, _s, **_kw):
        if name.startswith("/jax/core/compile/"):
            events.append(name)

    jax.monitoring.register_event_duration_secs_listener(listen)
    request.addfinalizer(lambda: _unregister(listen))
    for p in cal._exact_predictions.programs + cal._jacobian.programs:
        p.clear_cache()
    cal._compile_after_fit(system.eff, [(np.arange(8), rs)], (fields,), 0.02).join()
    assert events.count("/jax/core/compile/backend_compile_duration") >= 2
    fitted = cal._unfitted_to_base(cal.Fit(cal.from_unconstrained(
        system.eff, {k: v + 0.1 for k, v in cal.to_unconstrained(system.eff, fields).items()}),
        fields, np.zeros(1)), system.eff, system.eff)
    events.clear()
    cal._exact_predictions(fitted.eff, rs, None, features=frozenset())
    cal.log_jacobian(fitted.eff, fields, rs, 0.02, frozenset())
    assert events == []
