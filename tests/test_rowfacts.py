"""The shipped runs say what they ran: each row's `precision` column names the preset whose
bytes and execution are the ones its own notes describe (data/README.md, "Changed in the
shipped copies"), and `diffperf validate` says what the efficiency set means for rows that are
one XLA program. Cheap: reads the CSV files and the presets, compiles nothing.
"""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import pytest

from diffperf import load_runs
from diffperf.cli.options import row_precision_note
from diffperf.cli.validate_cmd import load_systems, xla_set_notes
from diffperf.specs.training import PRECISIONS

DATA = Path(__file__).resolve().parents[1] / "data"
# This project's own measured runs (data/README.md, "Licences": "this project's own
# measurements"): every row's notes state the precision and the framework.
OWN = ("h100_single_gpu.csv", "h100_jax_single_gpu.csv")

# What a phrase of the notes says about the run -> the preset fields it fixes (specs.training).
FP32_STATE = dict(weight_bytes=4.0, grad_bytes=4.0, master_bytes=0.0, optimizer_bytes=8.0)
BF16_MATMULS = dict(activation_bytes=2.0, matmul_fp32=0.0)
RULES = (
    ("fp32 master weights with bf16 autocast", FP32_STATE | BF16_MATMULS),
    ("fp32 params and adamw states with bf16 matmuls", FP32_STATE | BF16_MATMULS),
    ("one jit", dict(xla_compiled=1.0)),  # the whole step one XLA program
    ("eager", dict(xla_compiled=0.0)),
)


def _runs_files():
    return sorted(p for p in DATA.glob("*.csv")
                  if "precision" in next(csv.reader(p.open(newline="", encoding="utf-8"))))


def _preset(name) -> dict:
    fields = dict(PRECISIONS[name])
    fields.setdefault("xla_compiled", 0.0)
    return fields


@pytest.mark.parametrize("path", _runs_files(), ids=lambda p: p.name)
def test_precision_column_agrees_with_the_row_notes(path):
    """Wherever a row's notes say how weights, optimizer state and matrix products were held
    (fp32 state with bf16 products) or how the step ran (one jit / eager), its precision
    preset has those bytes and that execution; the own-measured files say it on every row.
    (The shared copies said `bf16`, Megatron mixed precision: 2 B weights + 4 B master.)"""
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    checked = 0
    for row in rows:
        notes = (row.get("notes") or "").lower()
        preset = _preset(row["precision"])
        said = [want for phrase, want in RULES if phrase in notes]
        for want in said:
            got = {k: float(preset.get(k, 0.0)) for k in want}
            assert got == want, (f"{path.name} {row['id']}: precision={row['precision']!r} "
                                 f"has {got}, its notes say {want}")
        checked += bool(said)
        if path.name in OWN:
            assert len(said) >= 2, f"{path.name} {row['id']}: notes state no precision/framework"
    if path.name in OWN:
        assert checked == len(rows) > 0


def test_loaded_own_runs_carry_their_precision():
    """load_runs without --precision: the PyTorch rows hold fp32 weights eagerly, the JAX rows
    are one XLA program with the same bytes."""
    torch = load_runs("h100_single_gpu")
    jax = load_runs("h100_jax_single_gpu")
    assert {(t.name, float(t.weight_bytes), float(t.xla_compiled)) for t in torch.trainings} \
        == {("amp-bf16", 4.0, 0.0)}
    assert {(t.name, float(t.weight_bytes), float(t.xla_compiled)) for t in jax.trainings} \
        == {("xla-amp-bf16", 4.0, 1.0)}


def test_validate_notes_on_the_set_of_xla_rows():
    """validate names what the GPU's default set means for XLA rows: its eager terms off, the
    queued kernel time used (and where from), its precision outside the set's envelope; no
    note for eager rows."""
    jax = load_runs("h100_jax_single_gpu")
    sets = {}
    systems = load_systems(jax, None, None, sets)
    (note,) = xla_set_notes(jax, systems, sets)
    assert note.startswith("25 row(s) on h100-sxm-80gb are one XLA-compiled step "
                           "(precision xla-amp-bf16): efficiency set h100-default")
    assert "kernel_s, host_kernel_s" in note and "queued_kernel_s = 3 us" in note
    assert "physics default" in note and "outside the set's fitted envelope" in note
    torch = load_runs("h100_single_gpu")
    sets = {}
    assert xla_set_notes(torch, load_systems(torch, None, None, sets), sets) == []


def test_overlay_precision_note_compares_the_rows():
    """--calibration X without --precision: a note only when rows' precision column differs
    from the precision X was fitted under."""
    args = SimpleNamespace(calibration="jax-h100", precision=None,
                           overlay_precision="xla-amp-bf16")
    assert row_precision_note(args, ["xla-amp-bf16"] * 25) == []
    assert row_precision_note(args, ["xla-amp-bf16", "amp-bf16", "amp-bf16"]) == [
        "--calibration jax-h100 was fitted under --precision xla-amp-bf16; 2 of 3 rows' "
        "precision column says amp-bf16"]
    assert row_precision_note(SimpleNamespace(**{**vars(args), "precision": "bf16"}),
                              ["amp-bf16"]) == []  # --precision given: framework_facts says it


def _overlays():
    import yaml

    from diffperf import resources

    return {name: yaml.safe_load(path.read_text())
            for name, path in resources.calibration_files().items()}


@pytest.mark.parametrize("name", sorted(_overlays()))
def test_shipped_overlay_was_fitted_under_what_its_rows_say(name):
    """A shipped overlay fitted on a shipped dataset was fitted under the precision and the
    framework facts that dataset's rows now carry themselves (precision column, 'set' cell),
    so `validate NAME` without --precision / --set predicts what the fit saw."""
    fitted = _overlays()[name]["fitted_on"]
    path = DATA / f"{fitted['runs']}.csv"
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    for row in rows:
        if fitted.get("precision"):
            assert row["precision"] == fitted["precision"], (name, row["id"])
        cell = {f.strip() for f in (row.get("set") or "").split(";") if f.strip()}
        assert set(fitted.get("set") or []) <= cell, (name, row["id"], cell)


def test_command_fact_a_row_overrides_is_noted():
    """A --set value that a row's own 'set' cell replaces is named, with the rows' value."""
    from diffperf.cli.options import row_fact_notes

    rows = [{"set": "flash_attention=0;dp_overlap=0"}, {"set": ""}, {}]
    assert row_fact_notes(["flash_attention=1", "dp_overlap=0", "grad_bytes=4"], rows) == [
        "--set flash_attention=1 does not act on 1 of 3 rows: their 'set' cell says "
        "flash_attention=0 (what those runs ran, applied after --set; edit the cells for a "
        "what-if)"]


def test_calibrate_records_what_the_rows_ran():
    """An overlay's fitted_on says the precision and facts every fitted row ran under, from
    the rows' own columns when the command gives none (vtrain_a100's set cells, the H100
    precision columns), the command's otherwise; a fact some rows override is not recorded."""
    from diffperf.cli.options import fitted_under

    with (DATA / "vtrain_a100.csv").open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))  # (load_runs reads the same cells; 3 s for 1549 rows)
    vtrain = SimpleNamespace(rows=rows, trainings=[SimpleNamespace(name=r["precision"])
                                                   for r in rows])
    assert fitted_under(None, None, vtrain) == (
        "fp16", ["dp_overlap=0", "flash_attention=0", "fused_softmax_max_seq=2048"])
    # the rows' flash_attention=0 replaces the command's 1 on every row: 0 is what was fitted
    assert fitted_under(None, ["flash_attention=1", "grad_bytes=4"], vtrain)[1] == [
        "flash_attention=0", "grad_bytes=4", "dp_overlap=0", "fused_softmax_max_seq=2048"]
    jax = load_runs("h100_jax_single_gpu")
    assert fitted_under(None, ["dp_overlap=0"], jax) == ("xla-amp-bf16", ["dp_overlap=0"])
    assert fitted_under("amp-bf16", None, jax) == ("amp-bf16", [])
    mixed = SimpleNamespace(trainings=jax.trainings[:1] + load_runs("h100_single_gpu").trainings,
                            rows=[{"set": "a=1;b=2"}, {"set": "a=1"}, {"set": "a=1.0;c=3"}])
    assert fitted_under(None, None, mixed) == (None, ["a=1"])
