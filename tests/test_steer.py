"""A search a planner can steer, defaults that fit the model, one vocabulary (issue 19, items
3, 4 and 6; docs/guide-search.md).

Fast: gpt-small on 8 devices, global batch 16. Every CLI search here enumerates the same
restricted table (tp 2, recompute none or full), so the search kernel compiles once.
"""

from __future__ import annotations

import csv
import json
import types

import numpy as np
import pytest
import yaml

from diffperf import load_model, load_system, predict, training
from diffperf.cli.main import main
from diffperf.errors import SpecError
from diffperf.search import (COLUMNS, enumerate_layouts, merged, parallel_of, search,
                             token_budget)
from diffperf.specs.validate import check_layout

MODEL = load_model("gpt-small")
GPUS, BATCH = 8, 16
STEER = ["--model", "gpt-small", "--gpus", str(GPUS), "--global-batch", str(BATCH),
         "--no-cache", "--tp", "2", "--recompute", "none,full"]


def _json(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out), err


def _error(capsys, *argv) -> str:
    code = main(list(argv))
    _, err = capsys.readouterr()
    assert code == 2, err
    assert "Traceback" not in err
    return err


def _col(table, name):
    return table[:, COLUMNS.index(name)]


# --------------------------------------------------------------------------------------------
# enumerate_layouts(fixed=...)
# --------------------------------------------------------------------------------------------

def test_fixed_values_keep_exactly_the_matching_rows():
    """Fixing columns gives the rows of the full table with those values, in the same
    order: fixing filters, it never adds or reorders a layout."""
    full = enumerate_layouts(MODEL, GPUS, BATCH)
    fixed = {"tp": (2, 4), "pp": (1, 2), "micro_batch": (1,), "zero_stage": (0, 3),
             "recompute": (2,), "sequence_parallel": (1,), "dp": (2, 4)}
    got = enumerate_layouts(MODEL, GPUS, BATCH, fixed=fixed)
    mask = np.all([np.isin(_col(full, c), v) for c, v in fixed.items()], axis=0)
    assert len(got) and np.array_equal(got, full[mask])
    assert len(got) < len(full)


def test_fixed_value_no_layout_takes_is_a_clear_error():
    with pytest.raises(SpecError, match=r"no valid layout .* tp in \{7\}"):
        enumerate_layouts(MODEL, GPUS, BATCH, fixed={"tp": (7,)})
    with pytest.raises(SpecError, match="unknown layout column 'tensor'"):
        enumerate_layouts(MODEL, GPUS, BATCH, fixed={"tensor": (2,)})
    with pytest.raises(SpecError, match="whole numbers"):
        enumerate_layouts(MODEL, GPUS, BATCH, fixed={"tp": (1.5,)})


def test_vp_of_uneven_stages_is_enumerated():
    """Llama 3 405B: 126 layers on pp 16 (stages of 7, 8 x 14, 7 layers) with vp 8, the
    layout Meta trained (Dubey et al. 2024, 3.3.2) and predict accepts; 8 does not divide
    126, so enumerating vp among the divisors of num_layers never offered it."""
    model = load_model("llama3-405b")
    t = enumerate_layouts(model, 16384, 2048, fixed={"tp": (8,), "pp": (16,)})
    assert 8 in set(_col(t, "vp"))
    check_layout(model, parallel_of(t[_col(t, "vp") == 8][0]), 16384)
    # vp given explicitly: every vp check_layout takes, whole chunks or not (vp 3 on a stage
    # of 8 layers: chunks of 3, 3, 2); the default enumeration keeps whole chunks only.
    assert 3 not in set(_col(t, "vp"))
    t3 = enumerate_layouts(model, 16384, 2048, fixed={"tp": (8,), "pp": (16,), "vp": (3,)})
    assert len(t3) and set(_col(t3, "vp")) == {3}
    sample = t3[:: max(1, len(t3) // 20)]
    check_layout(model, type(parallel_of(sample[0]))(**{
        c: sample[:, i].astype(float) for i, c in enumerate(COLUMNS[:-1])}))


# --------------------------------------------------------------------------------------------
# near-ties, token budget, framework facts in the search
# --------------------------------------------------------------------------------------------

def _fake(step, fits=None):
    step = np.asarray(step, dtype=float)
    return types.SimpleNamespace(step_time_s=step, fits=np.ones(len(step), bool)
                                 if fits is None else np.asarray(fits))


def _rows(*specs):
    """Layout rows from (tp, micro_batch, zero_stage, placement) tuples."""
    out = np.ones((len(specs), len(COLUMNS)), dtype=np.int32)
    for r, (tp, mb, z, place) in enumerate(specs):
        out[r, COLUMNS.index("tp")], out[r, COLUMNS.index("micro_batch")] = tp, mb
        out[r, COLUMNS.index("zero_stage")], out[r, -1] = z, place
    return out


def test_near_ties_merge_only_same_degrees_within_the_tie():
    layouts = _rows((2, 1, 1, 0),   # 0: 1.000 s, opens group A
                    (2, 1, 2, 0),   # 1: 1.004 s, same degrees, +0.4 %: joins A
                    (2, 1, 3, 1),   # 2: 1.006 s, same degrees, +0.6 %: a group of its own
                    (2, 2, 1, 0),   # 3: 1.001 s, another micro-batch: its own group
                    (4, 1, 1, 0),   # 4: 1.002 s, another tp: its own group
                    (2, 1, 0, 0))   # 5: doesn't fit
    result = _fake([1.000, 1.004, 1.006, 1.001, 1.002, 0.5],
                   fits=[True, True, True, True, True, False])
    groups = merged(result, layouts, tie=0.005)
    assert [g.tolist() for g in groups] == [[0, 1], [3], [4], [2]]
    assert [g.tolist() for g in merged(result, layouts, tie=0.0)] == [[0], [3], [4], [1], [2]]
    # k groups: the walk stops once no later layout can join them
    assert [g.tolist() for g in merged(result, layouts, k=2, tie=0.005)] == [[0, 1], [3]]


def test_near_ties_by_another_key_among_the_kept_layouts():
    """merged / ranked with a key (search --robust: the interval's top) rank and tie by that
    key, and with a mask (--in-envelope) group only the layouts it keeps."""
    from diffperf.search import ranked

    layouts = _rows((2, 1, 1, 0), (2, 1, 2, 0), (2, 1, 3, 1), (2, 2, 1, 0), (4, 1, 1, 0))
    result = _fake([1.000, 1.004, 1.006, 1.001, 1.002])
    # the key turns the order around: 4, then 2 (with 1 and 0 within 0.5 % of it), then 3
    key = np.array([1.104, 1.102, 1.100, 1.200, 1.050])
    assert ranked(result, key=key).tolist() == [4, 2, 1, 0, 3]
    assert [g.tolist() for g in merged(result, layouts, tie=0.005, key=key)] == [
        [4], [2, 1, 0], [3]]
    assert [g.tolist() for g in merged(result, layouts, tie=0.0, key=key)] == [
        [4], [2], [1], [0], [3]]
    keep = np.array([True, True, False, True, False])
    assert ranked(result, key=key, keep=keep).tolist() == [1, 0, 3]
    assert [g.tolist() for g in merged(result, layouts, tie=0.005, key=key, keep=keep)] == [
        [1, 0], [3]]
    # without a key, exactly the step-time ranking (the mask still applies)
    assert ranked(result).tolist() == [0, 3, 4, 1, 2]
    assert ranked(result, keep=keep).tolist() == [0, 3, 1]


def test_token_budget_golden():
    """The docstring's example by hand: 1e12 tokens at 1e6 tokens/s on 1024 GPUs of 400 W,
    $2 per GPU-hour."""
    b = token_budget(1e12, 1e6, 1024, 400.0, 2.0)
    assert b.days == pytest.approx(1e6 / 86400)
    assert b.gpu_hours == pytest.approx(1024 * 1e6 / 3600)
    assert b.energy_MWh == pytest.approx(1024 * 400 * 1e6 / 3.6e9)
    assert b.usd == pytest.approx(2 * 1024 * 1e6 / 3600)
    assert token_budget(1e12, 1e6, 1024, 400.0).usd is None


def test_search_parallel_facts_reach_every_layout():
    """search(parallel={'dp_overlap': 0}) predicts each row as predict does with that field;
    it changes some step times (the gradient reduction no longer hides behind the
    backward)."""
    system, train = load_system("a100-sxm-80gb"), training("bf16")
    t = enumerate_layouts(MODEL, GPUS, BATCH, fixed={"tp": (2,), "recompute": (0, 2)})
    rows = t[:: max(1, len(t) // 6)]
    base = search(MODEL, system, train, t, validate=False)
    off = search(MODEL, system, train, t, validate=False, parallel={"dp_overlap": 0.0})
    assert np.any(off.step_time_s != base.step_time_s)
    idx = [int(np.flatnonzero((t == r).all(axis=1))[0]) for r in rows]
    for i, row in zip(idx, rows):
        want = predict(MODEL, parallel_of(row).replace(dp_overlap=0.0), system, train)
        assert off.step_time_s[i] == pytest.approx(float(want.step_time_s), rel=1e-5)
    with pytest.raises(SpecError, match="'tp' is a column of the layout table"):
        search(MODEL, system, train, t, parallel={"tp": 2.0})


# --------------------------------------------------------------------------------------------
# diffperf search: steering options
# --------------------------------------------------------------------------------------------

def test_search_cli_steered_csv_and_budget(capsys, tmp_path):
    path = tmp_path / "all.csv"
    data, _ = _json(capsys, "search", *STEER, "--set", "flash_attention=0", "--csv", str(path),
                    "--tokens", "1e9", "--usd-per-gpu-hour", "2", "--top", "3", "--json")
    assert data["fixed"] == {"tp": [2], "recompute": ["none", "full"]}
    entries = data["ranked"] + [s for e in data["ranked"] for s in e["similar"]] + data["pareto"]
    assert entries and all(e["layout"]["tp"] == 2 for e in entries)
    assert {e["layout"]["recompute"] for e in entries} <= {"none", "full"}
    # --csv: every layout that fits, fastest first, the best one first
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == data["feasible"] == data["csv"]["rows"]
    steps = [float(r["step_time_s"]) for r in rows]
    assert steps == sorted(steps)
    assert steps[0] == pytest.approx(data["ranked"][0]["step_time_s"], rel=1e-5)
    assert {r["recompute"] for r in rows} <= {"none", "full"}
    # --tokens: the fastest layout's throughput, the system's power
    best, b = data["ranked"][0], data["budget"]
    seconds = 1e9 / best["tokens_per_s"]
    assert b["days"] == pytest.approx(seconds / 86400, rel=1e-6)
    assert b["gpu_hours"] == pytest.approx(GPUS * seconds / 3600, rel=1e-6)
    assert b["energy_MWh"] == pytest.approx(GPUS * 400 * seconds / 3.6e9, rel=1e-6)  # A100 400 W
    assert b["usd"] == pytest.approx(2 * b["gpu_hours"], rel=1e-9)
    # --set flash_attention=0 reaches the search: the same table without it predicts
    # other times (on this small model, faster: the unfused kernels' cost model)
    plain, _ = _json(capsys, "search", *STEER, "--top", "3", "--json")
    assert plain["ranked"][0]["step_time_s"] != best["step_time_s"]
    # near-ties: members of a group share the degrees and are within --tie-pct
    for e in data["ranked"]:
        for s in e["similar"]:
            assert s["step_time_s"] <= e["step_time_s"] * 1.005
            assert all(s["layout"][c] == e["layout"][c] for c in ("tp", "pp", "dp", "cp",
                                                                   "vp", "micro_batch"))


def test_search_cli_merges_near_ties_under_robust_too(capsys):
    """--robust ranks by the 95 % interval's top and merges near-ties by that key, as the
    plain ranking merges them by the step time; --tie-pct 0 lists the plain robust ranking."""
    data, _ = _json(capsys, "search", *STEER, "--robust", "--top", "3", "--json")
    tops = [e["interval_95_s"][1] for e in data["ranked"]]
    assert tops == sorted(tops) and any(e["similar"] for e in data["ranked"])
    for e in data["ranked"]:
        for s in e["similar"]:
            assert all(s["layout"][c] == e["layout"][c] for c in ("tp", "pp", "dp", "cp",
                                                                   "vp", "micro_batch"))
    plain, _ = _json(capsys, "search", *STEER, "--robust", "--tie-pct", "0", "--top", "3",
                     "--json")
    assert len(plain["ranked"]) == 3 and not any(e["similar"] for e in plain["ranked"])
    assert plain["ranked"][0]["layout"] == data["ranked"][0]["layout"]


def test_search_cli_steering_errors(capsys):
    base = ["search", "--model", "gpt-small", "--gpus", "8", "--global-batch", "16"]
    assert "--tp='two' must be whole numbers" in _error(capsys, *base, "--tp", "two")
    assert "--pp='4-2'" in _error(capsys, *base, "--pp", "4-2")
    assert "--recompute='some'" in _error(capsys, *base, "--recompute", "some")
    assert "--set tp: the search enumerates it; give --tp VALUES" in _error(
        capsys, *base, "--set", "tp=2")
    assert "give --tokens N too" in _error(capsys, *base, "--usd-per-gpu-hour", "2")
    assert "--tokens=0.0 must be a finite number > 0" in _error(capsys, *base, "--tokens", "0")
    assert "tp in {7}" in _error(capsys, *base, "--tp", "7")


# --------------------------------------------------------------------------------------------
# predict: defaults that fit the model; overlays' framework facts; one vocabulary
# --------------------------------------------------------------------------------------------

def test_predict_model_and_gpus_only_takes_the_searched_best(capsys):
    data, _ = _json(capsys, "predict", "--model", "gpt-small", "--gpus", "8",
                    "--global-batch", "16", "--no-cache", "--json")
    assert data["layout_source"] == "search"
    assert any(n.startswith("layout chosen by search: ") for n in data["notes"])
    found, _ = _json(capsys, "search", "--model", "gpt-small", "--gpus", "8", "--global-batch",
                     "16", "--no-cache", "--top", "1", "--json")
    best = found["ranked"][0]
    assert {k: data["layout"][k] for k in best["layout"]} == best["layout"]
    assert data["result"]["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-5)
    # text: the title says so
    assert main(["predict", "--model", "gpt-small", "--gpus", "8", "--global-batch", "16",
                 "--no-cache"]) == 0
    out, err = capsys.readouterr()
    assert "(layout chosen by search)" in out and "layout chosen by search: tp" in err


def test_predict_never_takes_another_models_layout(capsys):
    err = _error(capsys, "predict", "--model", "gpt-small")
    assert "give --gpus N" in err and "GPT-3 175B's shipped job" in err
    assert "give --gpus N or --dp N beside the layout options given" in _error(
        capsys, "predict", "--model", "gpt-small", "--tp", "2")
    # some layout options: the others are 1 (not GPT-3's tp 8 / pp 8)
    data, _ = _json(capsys, "predict", "--model", "gpt-small", "--gpus", "8", "--tp", "2",
                    "--global-batch", "16", "--no-cache", "--json")
    lay = data["layout"]
    assert (lay["tp"], lay["pp"], lay["dp"], data["layout_source"]) == (2, 1, 4, "given")
    # --dp alone gives the device count
    data, _ = _json(capsys, "predict", "--model", "gpt-small", "--dp", "2", "--tp", "2",
                    "--global-batch", "16", "--no-cache", "--json")
    assert data["gpus"] == 4


# The models whose YAML states a published batch (sources cite it) and the rule for the rest.
STATED_BATCH = {"gpt3-175b": 1536, "llama3-405b": 2048, "llama3.1-405b": 2048,
                "deepseek-v3": 15360, "deepseek-v2-lite": 4608}


def test_default_global_batch_is_the_models_own():
    """issue 19: --global-batch defaulted to GPT-3's 1536 for every model. A YAML's stated
    batch (no note); else ~4M tokens (2^22) / seq_len rounded to a power of two, noted."""
    from diffperf.load import default_global_batch

    for name, batch in STATED_BATCH.items():
        assert default_global_batch(name) == (batch, None), name
        assert "global_batch" in yaml.safe_load(open(f"configs/models/{name}.yaml"))["sources"]
    # by hand: 2^22 / 8192 = 512, / 4096 = 1024, / 32768 = 128, / 1024 = 4096; ViT-ERA5's
    # 64800 tokens: 2^22 / 64800 = 64.7 -> 64
    for name, batch in [("llama3-8b", 512), ("llama3-70b", 512), ("qwen3-30b-a3b", 1024),
                        ("mixtral-8x7b", 128), ("gpt-small", 4096), ("vit-era5", 64),
                        ("tests/data/hf/qwen2.5-7b.json", 1024)]:
        got, note = default_global_batch(name)
        assert got == batch and note.startswith(f"global batch {batch} sequences of "), name
        assert "~4M tokens" in note and "--global-batch" in note
    # --seq-len on a stated batch keeps its tokens per step: 15360 x 4096 = 7680 x 8192
    got, note = default_global_batch("deepseek-v3", seq_len=8192)
    assert got == 7680 and "15360 x 4096" in note
    with pytest.raises(SpecError, match="global_batch=0 must be > 0"):
        load_model({**yaml.safe_load(open("configs/models/gpt-small.yaml")), "global_batch": 0})


def test_predict_and_search_use_the_models_default_batch(capsys):
    """predict and search without --global-batch take the model's own batch and say how; a
    default that the given dp x micro-batch does not divide is rounded up, noted; a given
    --global-batch is used as given."""
    data, _ = _json(capsys, "predict", "--model", "llama3-8b", "--system", "h100-sxm-80gb",
                    "--dp", "8", "--tp", "1", "--zero-stage", "3", "--no-cache", "--json")
    assert data["layout"]["global_batch"] == 512
    assert any(n.startswith("global batch 512 sequences of 8192") for n in data["notes"])
    data, _ = _json(capsys, "predict", "--model", "llama3-8b", "--system", "h100-sxm-80gb",
                    "--dp", "3", "--tp", "8", "--no-cache", "--json")
    assert data["layout"]["global_batch"] == 513  # 512 -> the next multiple of dp 3
    assert any("rounded up to a multiple of dp x micro-batch = 3 x 1" in n
               for n in data["notes"])
    data, _ = _json(capsys, "predict", "--model", "llama3-8b", "--system", "h100-sxm-80gb",
                    "--dp", "8", "--tp", "1", "--zero-stage", "3", "--global-batch", "64",
                    "--no-cache", "--json")
    assert data["layout"]["global_batch"] == 64
    assert not any(n.startswith("global batch") for n in data["notes"])
    found, _ = _json(capsys, "search", "--model", "gpt-small", "--gpus", "8", "--tp", "1",
                     "--pp", "1", "--no-cache", "--top", "1", "--json")
    assert found["global_batch"] == 4096 and found["ranked"][0]["layout"]["global_batch"] == 4096
    assert any(n.startswith("global batch 4096 sequences of 1024") for n in found["notes"])


def test_predict_json_types_and_keys_match_search(capsys):
    """predict --json writes the layout as search --json does: integers, recompute and
    placement by name, search's keys first (issue 19: "tp": 8.0, "recompute": 1.0)."""
    pred, _ = _json(capsys, "predict", "--model", "gpt-small", "--gpus", "8", "--tp", "2",
                    "--global-batch", "16", "--placements", "tp-cp-pp-dp", "--no-cache",
                    "--json")
    found, _ = _json(capsys, "search", *STEER, "--top", "1", "--placement",
                     "tp-cp-pp-dp,tp-cp-dp-pp", "--json")
    s_lay, p_lay = found["ranked"][0]["layout"], pred["layout"]
    assert list(p_lay)[:len(s_lay)] == list(s_lay)
    for k, v in s_lay.items():
        assert type(p_lay[k]) is type(v), k
    assert p_lay["recompute"] == "selective" and p_lay["placement"] == "tp-cp-pp-dp"
    assert found["placements"] == ["tp-cp-pp-dp", "tp-cp-dp-pp"]


def test_overlay_framework_facts_are_applied_with_a_note(capsys, tmp_path):
    """An overlay fitted under --set flash_attention=0 predicts as --set flash_attention=0
    does, and says so; the user's own --set of the same field wins."""
    overlay = tmp_path / "fit.yaml"
    overlay.write_text(yaml.safe_dump(dict(efficiency={}, fitted_on=dict(
        precision="bf16", set=["flash_attention=0"]))))
    args = ["predict", "--model", "gpt-small", "--gpus", "8", "--tp", "2", "--global-batch",
            "16", "--no-cache", "--json"]
    with_overlay, _ = _json(capsys, *args, "--calibration", str(overlay))
    by_hand, _ = _json(capsys, *args, "--calibration", "none", "--set", "flash_attention=0")
    plain, _ = _json(capsys, *args, "--calibration", "none")
    assert with_overlay["result"]["step_time_s"] == by_hand["result"]["step_time_s"]
    assert with_overlay["result"]["step_time_s"] != plain["result"]["step_time_s"]
    assert any("fitted under --set flash_attention=0: applied" in n
               for n in with_overlay["notes"])
    mine, _ = _json(capsys, *args, "--calibration", str(overlay), "--set", "flash_attention=1")
    assert mine["result"]["step_time_s"] == plain["result"]["step_time_s"]
    assert mine["notes"] == []


def test_validate_applies_the_overlay_facts(capsys, tmp_path):
    """validate --calibration applies the overlay's fitted_on.set as --set would (today's
    shipped vTrain overlay records dp_overlap=0, flash_attention=0, ...)."""
    runs = tmp_path / "runs.csv"
    runs.write_text(
        "id,system,num_gpus,num_layers,hidden,num_heads,vocab,seq_len,tp,pp,dp,global_batch,"
        "micro_batch,step_time_s\n"
        "a,a100-sxm-80gb,8,12,768,12,50257,1024,2,1,4,16,2,0.05\n"
        "b,a100-sxm-80gb,8,12,768,12,50257,1024,1,1,8,16,1,0.05\n")
    overlay = tmp_path / "fit.yaml"
    overlay.write_text(yaml.safe_dump(dict(efficiency={}, fitted_on=dict(
        set=["dp_overlap=0"]))))
    out = {}
    none = ["--calibration", "none"]  # the physics defaults, as the overlay's empty efficiency
    for name, extra in (("overlay", ["--calibration", str(overlay)]),
                        ("by_hand", [*none, "--set", "dp_overlap=0"]), ("plain", none)):
        data, _ = _json(capsys, "validate", str(runs), *extra, "--json")
        out[name] = data
    assert out["overlay"]["summary"] == out["by_hand"]["summary"]
    assert out["overlay"]["summary"] != out["plain"]["summary"]
    assert out["overlay"]["notes"] and out["plain"]["notes"] == []


def test_sweep_fields_by_leaf_path_and_tier_name():
    """--sweep takes the System leaf names that sensitivity and the API print (values in
    SI) and tiers by name, beside the YAML keys: each gives the same axis."""
    from diffperf.load import sweep_axes

    system = load_system("a100-sxm-80gb")
    yaml_key = sweep_axes(system, ["matmul_TFLOPs=200,400", "tiers[1].bandwidth_GBps=25,50"])
    leaf = sweep_axes(system, ["matmul_flops_per_s=2e14,4e14",
                               "tiers[infiniband].bandwidth_Bps=2.5e10,5e10"])
    named = sweep_axes(system, ["tiers[infiniband].bandwidth_GBps=25,50"])
    for a, b in zip(yaml_key, leaf):
        assert a[:2] == b[:2]
        np.testing.assert_allclose(a[2], b[2])
        np.testing.assert_allclose(a[3], b[3])
    assert named[0][:2] == yaml_key[1][:2] == ("tiers[1].bandwidth_GBps", "tiers[1].bandwidth_Bps")
    with pytest.raises(SpecError, match="tiers by index or name: 0 or nvlink, 1 or infiniband"):
        sweep_axes(system, ["tiers[ethernet].bandwidth_GBps=1"])


def test_model_reads_by_the_yaml_names_too():
    m = load_model("mixtral-8x7b")
    assert (m.num_layers, m.num_heads, m.num_kv_heads, m.moe_experts) == (
        m.n_layers, m.n_heads, m.n_kv_heads, m.n_experts)
    assert float(m.num_layers) == 32 and float(m.moe_experts) == 8


# --------------------------------------------------------------------------------------------
# Python API: what the CLI can do, the API can too
# --------------------------------------------------------------------------------------------

def test_api_exports_stack_names_as_dict_and_overlay_writer(tmp_path):
    import diffperf as dp
    from diffperf import Parallel

    assert dp.search.enumerate_layouts is enumerate_layouts
    assert callable(dp.sensitivity.step_time_and_elasticities)
    assert callable(dp.calibrate.calibrate_runs)
    # stack takes recompute and placement by name, as predict does
    named = [Parallel(tp=2, dp=4, global_batch=16, recompute="selective",
                      placement="tp-cp-pp-dp"),
             Parallel(tp=1, dp=8, global_batch=16, recompute="full")]
    batch = dp.stack(named)
    np.testing.assert_array_equal(batch.recompute, [1, 2])
    np.testing.assert_array_equal(batch.placement, [1, 0])
    with pytest.raises(SpecError, match="recompute='some' is not allowed"):
        dp.stack([Parallel(recompute="some")])
    system = load_system("a100-sxm-80gb")
    one = predict(MODEL, named[0], system)
    assert float(one.step_time_s) == float(predict(MODEL, Parallel(
        tp=2, dp=4, global_batch=16, recompute=1, placement=1), system).step_time_s)
    # as_dict: plain Python, nested or flat (one DataFrame row per configuration)
    d = dp.as_dict(one)
    assert d["step_time_s"] == float(one.step_time_s) and d["fits"] is True
    assert d["breakdown"]["compute_s"] == float(one.breakdown.compute_s)
    many = dp.predict_batch(dp.stack([MODEL, MODEL]), batch, system,
                            dp.stack([training("bf16")] * 2))
    flat = dp.as_dict(many, flat=True)
    assert flat["step_time_s"] == [float(x) for x in many.step_time_s]
    assert len(flat["memory.total_bytes"]) == 2 and flat["fits"] == [bool(x) for x in many.fits]
    # write_overlay: read back by load_system and --calibration (facts included)
    path = tmp_path / "o.yaml"
    dp.write_overlay(path, {"mm_max": 0.7}, fitted_on={"set": ["dp_overlap=0"]})
    assert float(load_system("a100-sxm-80gb", calibration=path).eff.mm_max) == 0.7
    from diffperf.load import overlay_facts
    assert overlay_facts(path) == (["dp_overlap=0"], None)
    with pytest.raises(SpecError, match="exists; pass force=True"):
        dp.write_overlay(path, system)
    dp.write_overlay(path, system, force=True)
    with pytest.raises(SpecError, match="unknown key 'mm_maxx'; did you mean 'mm_max'"):
        dp.write_overlay(tmp_path / "x.yaml", {"mm_maxx": 0.7})


def test_sweep_takes_the_layout_values(capsys):
    data, _ = _json(capsys, "search", *STEER, "--sweep", "hbm_bandwidth_GBps=1000,2000",
                    "--json")
    t = enumerate_layouts(MODEL, GPUS, BATCH, fixed={"tp": (2,), "recompute": (0, 2)})
    assert data["layouts"] == len(t)
    for point in data["points"]:
        for best in point["best"]:
            assert best["layout"]["tp"] == 2 and best["layout"]["recompute"] in ("none", "full")
    assert "not yet --set FIELD of Parallel" in _error(
        capsys, "search", *STEER, "--sweep", "hbm_bandwidth_GBps=1000", "--set", "dp_overlap=0")


def test_overlay_fact_with_its_own_option_goes_to_the_option(capsys, tmp_path):
    """The shipped vtrain-a100 overlay was fitted under dp_overlap=0, a field with its own
    option (--dp-overlap): applied as that option's value unless the user gives the option,
    never refused as a --set of a layout field."""
    overlay = tmp_path / "fit.yaml"
    overlay.write_text(yaml.safe_dump(dict(efficiency={}, fitted_on=dict(set=["dp_overlap=0"]))))
    args = ["predict", "--model", "gpt-small", "--gpus", "8", "--tp", "2", "--global-batch",
            "16", "--no-cache", "--json"]
    with_overlay, _ = _json(capsys, *args, "--calibration", str(overlay))
    by_hand, _ = _json(capsys, *args, "--calibration", "none", "--dp-overlap", "0")
    mine, _ = _json(capsys, *args, "--calibration", str(overlay), "--dp-overlap", "1")
    plain, _ = _json(capsys, *args, "--calibration", "none")
    assert with_overlay["result"]["step_time_s"] == by_hand["result"]["step_time_s"]
    assert mine["result"]["step_time_s"] == plain["result"]["step_time_s"]
    assert with_overlay["result"]["step_time_s"] > plain["result"]["step_time_s"]
    # the user's own --set of that field is refused (it has its own option), not mistaken
    # for the overlay's fact
    assert "--set dp_overlap: the layout has its own option --dp-overlap" in _error(
        capsys, *args, "--calibration", str(overlay), "--set", "dp_overlap=1")
