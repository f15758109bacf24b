"""Output files are written atomically and never clobbered; results are deterministic.

- `diffperf.cli.output.write_atomic`: a write interrupted half-way (the write or the rename
  raising, as an interrupt or a full disk would) leaves the destination as it was and no
  temporary file behind; an existing file is refused without `force` and replaced with it;
  a destination that cannot be a file is a SpecError, not a traceback;
- `diffperf calibrate --out`: the overlay it writes is one `apply_overlay` reads back, an
  interrupted write leaves nothing, an existing file is refused before any fitting
  (the fit itself is replaced by a stub: these tests are about the files, not the fit);
- `diffperf validate --out` with an existing file is refused before anything is predicted;
- determinism: the same prediction twice is bit-identical in every leaf of the Result, and
  equal to the one a fresh Python process computes.
(test_cli.py already checks that `validate --out` refuses an existing file and that --force
rewrites it with the same bytes.)
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml

import diffperf
from diffperf import Parallel, SpecError, load_model, load_system, predict, training
from diffperf.cli import output
from diffperf.cli.main import main
from diffperf.cli.output import write_atomic

REPO = Path(__file__).resolve().parents[1]
RUNS_CSV = REPO / "data" / "h100_single_gpu.csv"  # shipped in the repository (data/README.md)


def _leftovers(folder: Path, name: str):
    """Temporary files write_atomic would leave for `name` (.NAME.*.tmp)."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f".{name}.")
                  and p.name.endswith(".tmp"))


def _one_line_error(capsys, code, *fragments):
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
    assert "Traceback" not in err
    for f in fragments:
        assert f in lines[0], (f, err)


# ------------------------------------------------------------------------------ write_atomic

def test_write_atomic_writes_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "out.csv"
    write_atomic(target, "a,b\n1,2\n", force=False)
    assert target.read_text() == "a,b\n1,2\n"
    assert _leftovers(tmp_path, "out.csv") == []


def test_write_atomic_refuses_existing_without_force(tmp_path):
    target = tmp_path / "out.csv"
    target.write_text("precious\n")
    with pytest.raises(SpecError, match="exists; pass --force to overwrite it"):
        write_atomic(target, "new\n", force=False)
    assert target.read_text() == "precious\n"
    write_atomic(target, "new\n", force=True)
    assert target.read_text() == "new\n"
    assert _leftovers(tmp_path, "out.csv") == []


class _HalfWriter:
    """A file object that writes half of what it is given, then raises `error`."""

    def __init__(self, fh, error):
        self.fh, self.error = fh, error

    def write(self, text):
        self.fh.write(text[: len(text) // 2])
        self.fh.flush()
        raise self.error

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()
        return False


@pytest.mark.parametrize("error", [KeyboardInterrupt(), OSError(28, "No space left on device")],
                         ids=["interrupt", "disk-full"])
@pytest.mark.parametrize("existing", [False, True], ids=["new", "existing"])
def test_write_interrupted_mid_write_leaves_destination_untouched(tmp_path, monkeypatch, error,
                                                                  existing):
    target = tmp_path / "pred.csv"
    if existing:
        target.write_text("old content\n")
    monkeypatch.setattr(output, "open", lambda *a, **k: _HalfWriter(open(*a, **k), error),
                        raising=False)
    # An interrupt propagates; an OS error becomes a clear SpecError (exit 2 in the CLI).
    expected = SpecError if isinstance(error, OSError) else type(error)
    with pytest.raises(expected):
        write_atomic(target, "x" * 10_000, force=True)
    monkeypatch.undo()
    if existing:
        assert target.read_text() == "old content\n"
    else:
        assert not target.exists()
    assert _leftovers(tmp_path, "pred.csv") == []


def test_write_interrupted_at_the_rename_leaves_destination_untouched(tmp_path, monkeypatch):
    target = tmp_path / "overlay.yaml"
    target.write_text("efficiency: {}\n")

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(output.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, "efficiency: {mm_max: 0.5}\n", force=True)
    monkeypatch.undo()
    assert target.read_text() == "efficiency: {}\n"
    assert _leftovers(tmp_path, "overlay.yaml") == []


@pytest.mark.parametrize("where", ["a folder", "inside a file"])
def test_write_atomic_to_an_impossible_destination_is_a_spec_error(tmp_path, where):
    """`--out some/folder --force` or `--out file.csv/x`: a clear error (exit 2), not an
    IsADirectoryError / NotADirectoryError traceback after the whole computation."""
    if where == "a folder":
        target = tmp_path / "results"
        target.mkdir()
    else:
        (tmp_path / "file.csv").write_text("x\n")
        target = tmp_path / "file.csv" / "out.csv"
    with pytest.raises(SpecError, match=str(target.name)):
        write_atomic(target, "a\n", force=True)
    assert not [p for p in tmp_path.rglob("*.tmp")]


# ------------------------------------------------------------------------------ CLI --out

def _stub_calibration(monkeypatch):
    """Replace the fit by a stub returning the starting efficiencies: the file handling of
    `calibrate --out` is tested without minutes of optimisation."""
    from diffperf import calibrate as cal

    calls = []

    def stub(runs, systems, fit_mask, *, benches=(), fields=None, steps=400, **kw):
        calls.append(steps)
        eff = next(iter(systems.values())).eff
        n = len(runs)
        step = np.where(np.isfinite(runs.step_time_s), runs.step_time_s, 1.0)
        fit = cal.Fit(eff, ("mm_max", "kernel_s"), np.zeros(steps))
        return cal.Calibration(fit, step, np.ones(n), np.ones(n, bool), np.full(n, 0.1))

    monkeypatch.setattr(cal, "calibrate_runs", stub)
    return calls


def test_calibrate_out_writes_an_overlay_apply_overlay_reads(tmp_path, monkeypatch, capsys):
    _stub_calibration(monkeypatch)
    out = tmp_path / "fit.yaml"
    code = main(["calibrate", str(RUNS_CSV), "--steps", "2", "--json", "--out", str(out),
                 "--precision", "amp-bf16", "--set", "dp_overlap=0"])
    assert code == 0, capsys.readouterr().err
    overlay = yaml.safe_load(out.read_text())
    system = load_system("h100-sxm-80gb")
    applied = diffperf.apply_overlay(system, out)
    for key in ("mm_max", "kernel_s"):
        assert float(getattr(applied.eff, key)) == overlay["efficiency"][key]
    # The overlay records the framework facts it was fitted under.
    assert overlay["fitted_on"]["precision"] == "amp-bf16"
    assert overlay["fitted_on"]["set"] == ["dp_overlap=0"]
    assert _leftovers(tmp_path, "fit.yaml") == []


def test_calibrate_out_interrupted_leaves_nothing(tmp_path, monkeypatch, capsys):
    _stub_calibration(monkeypatch)

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(output.os, "replace", interrupted)
    out = tmp_path / "fit.yaml"
    code = main(["calibrate", str(RUNS_CSV), "--steps", "2", "--json", "--out", str(out)])
    assert code == 130  # KeyboardInterrupt: main's exit code for an interrupt
    assert not out.exists()
    assert _leftovers(tmp_path, "fit.yaml") == []


def test_calibrate_out_existing_is_refused_before_fitting(tmp_path, monkeypatch, capsys):
    """An existing --out must be refused up front: the user should not wait for a whole
    calibration (minutes) to learn that the file exists."""
    calls = _stub_calibration(monkeypatch)
    out = tmp_path / "fit.yaml"
    out.write_text("efficiency: {}\n")
    code = main(["calibrate", str(RUNS_CSV), "--steps", "2", "--json", "--out", str(out)])
    _one_line_error(capsys, code, f"{out} exists; pass --force to overwrite it")
    assert out.read_text() == "efficiency: {}\n"
    assert calls == [], f"calibrate fitted {len(calls)} time(s) before refusing the existing --out"


def test_validate_out_existing_is_refused_before_predicting(tmp_path, monkeypatch, capsys):
    import diffperf.validation

    predicted = []
    real = diffperf.validation.predict_runs
    monkeypatch.setattr(diffperf.validation, "predict_runs",
                        lambda *a, **k: predicted.append(1) or real(*a, **k))
    out = tmp_path / "pred.csv"
    out.write_text("precious\n")
    code = main(["validate", str(RUNS_CSV), "--out", str(out)])
    _one_line_error(capsys, code, f"{out} exists; pass --force to overwrite it")
    assert out.read_text() == "precious\n"
    assert _leftovers(tmp_path, "pred.csv") == []
    assert predicted == [], "validate predicted every run before refusing the existing --out"


# ------------------------------------------------------------------------------ determinism

CASE = ("megatron-1.7b", "a100-4nic", dict(tp=2, pp=2, dp=4, micro_batch=2, global_batch=64,
                                          zero_stage=1, recompute=1, sequence_parallel=1),
        "fp16")

_SNIPPET = """
import json, sys, jax
from diffperf import Parallel, load_model, load_system, predict, training
m, s, layout, precision = json.loads(sys.argv[1])
r = predict(load_model(m), Parallel(**layout), load_system(s), training(precision))
print(json.dumps({jax.tree_util.keystr(p): float(v).hex()
                  for p, v in jax.tree_util.tree_flatten_with_path(r)[0]}))
"""


def _leaves(result) -> dict:
    return {jax.tree_util.keystr(p): np.asarray(v)
            for p, v in jax.tree_util.tree_flatten_with_path(result)[0]}


def _predict_case():
    model, system, layout, precision = CASE
    return predict(load_model(model), Parallel(**layout), load_system(system),
                   training(precision))


def test_same_inputs_bit_identical_results():
    first, second = _leaves(_predict_case()), _leaves(_predict_case())
    assert first.keys() == second.keys() and len(first) > 20
    for key in first:
        assert np.array_equal(first[key], second[key]), (key, first[key], second[key])
        assert first[key].dtype == second[key].dtype


def test_same_result_in_a_fresh_process():
    here = {k: float(v).hex() for k, v in _leaves(_predict_case()).items()}
    proc = subprocess.run([sys.executable, "-c", _SNIPPET, json.dumps(CASE)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    there = json.loads(proc.stdout.strip().splitlines()[-1])
    assert there == here


def test_dataclass_fields_cover_every_leaf():
    """The determinism checks above compare every leaf: Result, Breakdown and Memory fields
    are all leaves (a new field would be compared automatically)."""
    r = _predict_case()
    n_fields = sum(len(dataclasses.fields(getattr(r, f.name)))
                   if dataclasses.is_dataclass(getattr(r, f.name)) else 1
                   for f in dataclasses.fields(r))
    assert len(jax.tree.leaves(r)) == n_fields


def test_atomic_writes_get_the_umask_permissions_and_leave_nothing_on_failure(tmp_path):
    """Text outputs and figures go through `output.atomic_path`: the file appears whole, with
    the permissions of a new file under the umask (mkstemp alone would make it 0600), and a
    failed write leaves the old file and no temporary behind."""
    import stat

    from diffperf.cli.output import atomic_path, write_atomic

    umask = os.umask(0o022)
    try:
        out = tmp_path / "overlay.yaml"
        write_atomic(out, "a: 1\n", force=False)
        assert out.read_text() == "a: 1\n"
        assert stat.S_IMODE(out.stat().st_mode) == 0o644
        with pytest.raises(RuntimeError):
            with atomic_path(out) as tmp:
                Path(tmp).write_text("half")
                raise RuntimeError("interrupted")
        assert out.read_text() == "a: 1\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["overlay.yaml"]
    finally:
        os.umask(umask)
