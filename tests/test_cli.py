"""The command line (STYLE.md section 7, kind 7; DESIGN.md "Command line").

In-process through `diffperf.cli.main.main([...])` (one shared compilation per shape) and once
through a subprocess. A SpecError must give exit code 2 and one `error:` line on stderr with no
traceback; `--json` output is parsed and checked, never compared as text.
"""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from diffperf import Parallel
from diffperf.cli.main import main
from diffperf.result import EXPOSED_PARTS

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"  # the measured runs shipped in the repository (data/README.md)
RUN_CSVS = sorted(DATA.glob("*.csv"))
OUT_COLUMNS = ["id", "step_time_s", "predicted_step_time_s", "predicted_peak_memory_GB",
               "predicted_fits"]  # DESIGN.md, `diffperf validate --out`


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _assert_one_line_error(code, err, *fragments):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for f in fragments:
        assert f in lines[0], (f, err)


# --------------------------------------------------------------------------------------------
# predict
# --------------------------------------------------------------------------------------------

def test_version_flag(capsys):
    """`diffperf --version` said 'the following arguments are required: command'."""
    import diffperf

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"diffperf {diffperf.__version__}"


def test_predict_default_prints_a_table(capsys):
    code, out, err = _run(capsys, "predict")
    assert code == 0, err
    assert "step_time_s" in out and "compute_s" in out  # breakdown table, units in the header
    assert "memory per device" in out and "MFU" in out
    assert "Traceback" not in err


def test_predict_json_breakdown_sums_to_step_time(capsys):
    code, out, err = _run(capsys, "predict", "--json")
    assert code == 0, err
    data = json.loads(out)
    res = data["result"]
    step = res["step_time_s"]
    assert math.isfinite(step) and step > 0
    parts = sum(res["breakdown"][k] for k in EXPOSED_PARTS)
    assert abs(parts - step) <= 1e-5 * step
    assert all(res["breakdown"][k] >= 0 for k in res["breakdown"])
    # The shipped default (DESIGN.md): GPT-3 175B on 1024 A100 80 GB.
    assert data["model"] == "gpt3-175b" and data["gpus"] == 1024
    lay = data["layout"]
    assert lay["tp"] * lay["pp"] * lay["dp"] * lay["cp"] == 1024
    assert 0 < res["mfu"] < 1 and res["tokens_per_s"] > 0
    assert isinstance(res["fits"], bool)


def test_predict_reports_goodput(capsys):
    """predict prints the goodput table and --json reports Result.goodput: the four fractions
    of wall time sum to 1, effective tokens/s = tokens/s x goodput, and --set
    checkpoint_interval_s replaces Daly's optimal interval (issue 14: `predict --json`
    reports goodput)."""
    from diffperf.result import GOODPUT_FRACS, Goodput

    code, out, err = _run(capsys, "predict")
    assert code == 0, err
    assert "goodput" in out and "training kept %" in out and "Daly optimum" in out
    code, out, err = _run(capsys, "predict", "--json")
    assert code == 0, err
    res = json.loads(out)["result"]
    g = res["goodput"]
    assert set(g) == set(Goodput.__dataclass_fields__)
    assert sum(g[k] for k in GOODPUT_FRACS) == pytest.approx(1.0, abs=1e-5)
    assert 0 < g["goodput_frac"] < 1 and g["mtbf_s"] > 0 and g["checkpoint_s"] > 0
    assert g["effective_tokens_per_s"] == pytest.approx(res["tokens_per_s"] * g["goodput_frac"],
                                                        rel=1e-6)
    code, out, err = _run(capsys, "predict", "--json", "--set", "checkpoint_interval_s=7200")
    assert code == 0, err
    given = json.loads(out)["result"]
    assert given["goodput"]["checkpoint_interval_s"] == 7200.0
    assert given["goodput"]["goodput_frac"] < g["goodput_frac"]  # Daly's interval is better
    assert given["step_time_s"] == res["step_time_s"]


def test_predict_options_change_the_layout(capsys):
    code, out, err = _run(capsys, "predict", "--json", "--tp", "4", "--pp", "16",
                          "--recompute", "full")
    assert code == 0, err
    lay = json.loads(out)["layout"]
    assert (lay["tp"], lay["pp"], lay["dp"], lay["recompute"]) == (4, 16, 16, "full")
    assert all(type(lay[k]) is int for k in ("tp", "pp", "dp", "micro_batch", "zero_stage"))


def test_predict_set_applies_framework_facts_like_the_api(capsys):
    """--set FIELD=VALUE reaches the Training / Parallel of the prediction: the same as
    predicting through the API with those fields."""
    import diffperf
    from diffperf.specs.parallel import Recompute

    def step(*argv):
        assert main(["predict", "--json", "--tp", "4", "--pp", "2", "--gpus", "64",
                     "--calibration", "none", *argv]) == 0
        return json.loads(capsys.readouterr().out)["result"]["step_time_s"]

    base = step()
    changed = step("--set", "flash_attention=0", "--set", "tp_overlap=0")
    par = diffperf.Parallel(tp=4, pp=2, dp=8, global_batch=1536, sequence_parallel=1,
                            recompute=float(Recompute.SELECTIVE), zero_stage=1, tp_overlap=0)
    want = diffperf.predict(diffperf.load_model("gpt3-175b"), par,
                            diffperf.load_system("a100-sxm-80gb"),
                            diffperf.training("bf16", flash_attention=0)).step_time_s
    assert changed != base
    assert changed == pytest.approx(float(want), rel=1e-6)


def test_predict_placement_moves_groups_between_tiers(capsys):
    """16 GPUs in 8-GPU nodes, tp 2 pp 4 dp 2: Megatron's order (tp-cp-dp-pp) puts the pipeline
    chain at stride 4 (across the two nodes) and DP inside a node; tp-cp-pp-dp puts the chain
    inside a node (stride 2) and DP across nodes."""
    out = {}
    for place in ("tp-cp-dp-pp", "tp-cp-pp-dp"):
        assert main(["predict", "--model", "megatron-1.7b", "--gpus", "16", "--tp", "2", "--pp",
                     "4", "--global-batch", "64", "--zero-stage", "0", "--placement", place,
                     "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["layout"]["placement"] == place
        out[place] = data["result"]["breakdown"]
    megatron, inner_pp = out["tp-cp-dp-pp"], out["tp-cp-pp-dp"]
    assert inner_pp["pp_exposed_s"] < megatron["pp_exposed_s"]
    dp = lambda b: b["dp_exposed_s"] + b["dp_hidden_s"]  # noqa: E731
    assert dp(inner_pp) > dp(megatron)
    assert main(["predict", "--placement", "tp-pp-dp"]) == 2
    assert "placement='tp-pp-dp' must order each of tp, cp, dp, pp once" in capsys.readouterr().err


def test_subprocess_bad_input_exits_2_without_traceback():
    # As a real process (`python -m diffperf.cli.main`, what the `diffperf` script runs): the
    # interpreter would print a traceback for any uncaught exception; a SpecError must instead
    # give exit code 2 and one line. (The in-process tests above and below cover the success
    # paths; this one needs no compilation, so it stays fast.)
    proc = subprocess.run([sys.executable, "-m", "diffperf.cli.main", "predict", "--model",
                           "gpt3-175"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.stdout == ""
    _assert_one_line_error(proc.returncode, proc.stderr, "unknown model 'gpt3-175'",
                           "did you mean 'gpt3-175b'?")


def test_predict_tp_not_dividing_gpus(capsys):
    code, _, err = _run(capsys, "predict", "--tp", "7")
    _assert_one_line_error(code, err, "--gpus=1024 must be a multiple of tp x cp x pp = 56")


def test_predict_tp_not_dividing_heads(capsys):
    # 7 x 8 x 16 = 896 devices, so the layout reaches the heads rule.
    code, _, err = _run(capsys, "predict", "--tp", "7", "--gpus", "896")
    _assert_one_line_error(code, err, "tp=7 must divide model.num_heads=96",
                           "allowed tp: 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96")


def test_predict_unknown_model(capsys):
    code, _, err = _run(capsys, "predict", "--model", "gpt3-175")
    _assert_one_line_error(code, err, "unknown model 'gpt3-175'",
                           "did you mean 'gpt3-175b'?")


def test_predict_system_yaml_with_typo(capsys, tmp_path):
    d = yaml.safe_load((REPO / "configs" / "systems" / "a100-sxm-80gb.yaml").read_text())
    d["hbm_bandwith_GBps"] = d.pop("hbm_bandwidth_GBps")
    p = tmp_path / "typo.yaml"
    p.write_text(yaml.safe_dump(d))
    code, _, err = _run(capsys, "predict", "--system", str(p))
    _assert_one_line_error(code, err, "unknown key 'hbm_bandwith_GBps'",
                           "did you mean 'hbm_bandwidth_GBps'?")


def test_predict_bad_seq_len(capsys):
    code, _, err = _run(capsys, "predict", "--seq-len", "0")
    _assert_one_line_error(code, err, "--seq-len=0 must be > 0")


@pytest.mark.parametrize("command", ["predict", "search", "sensitivity"])
@pytest.mark.parametrize("model", ["tests/data/hf/llama-3-8b.json", "llama3-8b",
                                   "configs/models/llama3-8b.yaml"])
@pytest.mark.parametrize("value", ["-5", "0"])
def test_bad_seq_len_on_every_model_source(capsys, command, model, value):
    """A zero or negative --seq-len on a Hugging Face config.json, a YAML or a shipped name:
    exit 2 with one line naming the option, the value and what is allowed (a config.json once
    raised a TypeError); checked before any model is built, so no search runs."""
    code, _, err = _run(capsys, command, "--model", model, "--gpus", "8", "--seq-len", value)
    _assert_one_line_error(code, err, f"--seq-len={value} must be > 0")


@pytest.mark.parametrize("model", ["tests/data/hf/llama-3-8b.json", "llama3-8b"])
@pytest.mark.parametrize("value,message", [(-5, "must be > 0"), (0, "must be > 0"),
                                           (1.5, "must be a whole number")])
def test_load_model_bad_seq_len(model, value, message):
    """The Python API refuses the same values for a name or YAML as for a config.json (a
    name's seq_len was replaced unchecked)."""
    from diffperf import load_model
    from diffperf.errors import SpecError

    with pytest.raises(SpecError, match=f"seq_len={value:g} {message}"):
        load_model(model, seq_len=value)


def test_search_refuses_what_it_chooses_itself(capsys):
    """search --set of a field the search enumerates or balances itself, and a price without
    a token budget: exit 2, one line naming the option to give instead."""
    base = ("search", "--model", "gpt-small", "--gpus", "8", "--global-batch", "16")
    code, _, err = _run(capsys, *base, "--set", "tp=2")
    _assert_one_line_error(code, err, "--set tp: the search enumerates it; give --tp VALUES")
    code, _, err = _run(capsys, *base, "--set", "pp_first_layers=2")
    _assert_one_line_error(code, err, "--set pp_first_layers: the search balances the "
                           "pipeline stages itself (give it to predict)")
    code, _, err = _run(capsys, *base, "--usd-per-gpu-hour", "2")
    _assert_one_line_error(code, err, "--usd-per-gpu-hour prices a token budget: give "
                           "--tokens N too")


def test_predict_unknown_precision(capsys):
    code, _, err = _run(capsys, "predict", "--precision", "bf61")
    _assert_one_line_error(code, err, "precision='bf61'", "did you mean 'bf16'?")


# --------------------------------------------------------------------------------------------
# validate
# --------------------------------------------------------------------------------------------

def test_the_shipped_runs_are_there():
    assert {"h100_jax_single_gpu.csv", "h100_single_gpu.csv", "vtrain_a100.csv"} <= {
        p.name for p in RUN_CSVS}


@pytest.mark.parametrize("path", RUN_CSVS, ids=[p.name for p in RUN_CSVS])
def test_validate_json_gives_a_mape(capsys, path):
    code, out, err = _run(capsys, "validate", str(path), "--json")
    assert code == 0, err
    summary = json.loads(out)["summary"]
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    measured = sum(1 for r in rows if (r.get("status") or "ok") == "ok")
    assert summary["all"]["n"] == measured
    mape = summary["all"]["mape_pct"]
    assert math.isfinite(mape) and mape >= 0
    assert summary["all"]["median_pct"] <= summary["all"]["max_pct"]


def test_validate_prints_a_table(capsys):
    path = DATA / "h100_single_gpu.csv"
    code, out, err = _run(capsys, "validate", str(path))
    assert code == 0, err
    assert "MAPE_%" in out


def test_validate_out_writes_documented_columns_and_refuses_overwrite(capsys, tmp_path):
    runs = DATA / "h100_single_gpu.csv"
    out_csv = tmp_path / "pred.csv"
    code, _, err = _run(capsys, "validate", str(runs), "--out", str(out_csv))
    assert code == 0, err
    with out_csv.open(newline="") as fh:
        reader = csv.DictReader(fh)
        header, rows = reader.fieldnames, list(reader)
    assert header == OUT_COLUMNS
    with runs.open(newline="") as fh:
        ids = [r["id"] for r in csv.DictReader(fh)]
    assert [r["id"] for r in rows] == ids
    for r in rows:
        assert float(r["predicted_step_time_s"]) > 0
        assert float(r["predicted_peak_memory_GB"]) > 0
        assert r["predicted_fits"] in ("0", "1")
    before = out_csv.read_text()

    code, _, err = _run(capsys, "validate", str(runs), "--out", str(out_csv))
    _assert_one_line_error(code, err, f"{out_csv} exists; pass --force to overwrite it")
    assert out_csv.read_text() == before

    code, _, err = _run(capsys, "validate", str(runs), "--out", str(out_csv), "--force")
    assert code == 0, err
    assert out_csv.read_text() == before  # same inputs, same predictions


def test_validate_out_into_missing_folder(capsys, tmp_path):
    runs = DATA / "h100_single_gpu.csv"
    target = tmp_path / "no" / "pred.csv"
    code, _, err = _run(capsys, "validate", str(runs), "--out", str(target))
    _assert_one_line_error(code, err, f"folder {target.parent} does not exist")


def test_validate_bad_csv(capsys, tmp_path):
    p = tmp_path / "runs.csv"
    p.write_text("id,num_gpus\nr1,1\n")
    code, _, err = _run(capsys, "validate", str(p))
    _assert_one_line_error(code, err, f"{p}: missing column 'num_layers'")


def test_validate_missing_file(capsys, tmp_path):
    p = tmp_path / "none.csv"
    code, _, err = _run(capsys, "validate", str(p))
    _assert_one_line_error(code, err, f"{p}: cannot read")


def test_predict_loads_its_compiled_program_from_the_store():
    """predict(store=...) puts the compiled program in the store once; a later process (here:
    the in-process table of loaded programs and JAX's in-memory caches emptied) loads it from
    there without compiling (nothing written) and gives the result of the uncached path; a
    new store gets the program the process has loaded; a store that is not a mapping is a
    SpecError."""
    import jax

    from diffperf import executables, load_model, load_system, predict
    from diffperf.errors import SpecError

    class Store(dict):  # counts writes: a program is written only when it was compiled
        writes = 0

        def __setitem__(self, key, value):
            Store.writes += 1
            super().__setitem__(key, value)

    model, system = load_model("gpt3-175b"), load_system("a100-sxm-80gb")
    par = Parallel(tp=8.0, pp=8.0, dp=4.0, micro_batch=1.0, global_batch=64.0)
    other = par.replace(dp=8.0, global_batch=128.0)
    executables._LOADED.clear()
    jax.clear_caches()  # a fresh process: JAX's in-memory programs gone too
    store = Store()
    first = predict(model, par, system, store=store)
    assert len(store) == 1 and Store.writes == 1
    plain = predict(model, other, system)
    executables._LOADED.clear()
    jax.clear_caches()
    again = predict(model, other, system, store=store)
    assert len(store) == 1 and Store.writes == 1  # loaded, not compiled
    assert float(again.step_time_s) == pytest.approx(float(plain.step_time_s), rel=1e-6)
    assert float(first.step_time_s) != float(again.step_time_s)
    fresh = {}
    predict(model, par, system, store=fresh)  # loaded in the process: no compile, stored
    assert fresh == dict(store)
    with pytest.raises(SpecError, match=re.escape(
            "store='~/.cache' must be None or a mapping key -> bytes (a dict, "
            "cli.cache.KernelStore)")):
        predict(model, par, system, store="~/.cache")


def test_predict_cli_keeps_its_program_on_disk(tmp_path, monkeypatch, capsys):
    """`diffperf predict` writes the program to the cache folder (a fresh process: the
    in-process table of loaded programs emptied); --no-cache writes nothing."""
    import jax

    from diffperf import executables

    executables._LOADED.clear()
    jax.clear_caches()  # a fresh process: JAX's in-memory programs gone too
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "on"))
    assert main(["predict", "--gpus", "128", "--tp", "8", "--pp", "8", "--global-batch",
                 "64"]) == 0
    assert list((tmp_path / "on").rglob("*.bin")) and list((tmp_path / "on").rglob("*.json"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "off"))
    assert main(["predict", "--gpus", "128", "--tp", "8", "--pp", "8", "--global-batch",
                 "64", "--no-cache"]) == 0
    assert not (tmp_path / "off").exists()
    capsys.readouterr()
