"""Issue 20: no NaN, no nonsense and no traceback reaches the user.

One test (or parametrized family) per failure the issue lists; the fuzz suite
(tests/test_fuzz.py) drives the same classes with generated inputs.
"""

from __future__ import annotations

import json
import os
import re

import jax
import numpy as np
import pytest

from diffperf import Parallel, SpecError, Training, load_model, load_system, predict
from diffperf.cli.main import main
from diffperf.load import read_yaml
from diffperf.predict import predict_step
from diffperf.search.kernel import _CPU_QUICK_OPTIONS
from diffperf.specs.validate import INT_MAX, MAX_TIERS, TRAINING_SWITCHES

SMALL = ["--model", "gpt-small", "--gpus", "8", "--tp", "2", "--pp", "2", "--global-batch",
         "8", "--no-cache"]
MODEL = load_model("gpt-small")
SYSTEM = load_system("a100-sxm-80gb")
LAYOUT = Parallel(tp=2.0, pp=2.0, dp=2.0, global_batch=8.0)


def _strict(text):
    def refuse(const):
        raise ValueError(f"non-standard JSON constant {const}")
    return json.loads(text, parse_constant=refuse)


def _one_line_exit_2(capsys, argv, *fragments):
    code = main(list(argv))
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (argv, err)
    for f in fragments:  # a fragment, or a tuple of alternatives
        assert any(a in lines[0] for a in ((f,) if isinstance(f, str) else f)), (f, lines[0])
    return lines[0]


# 1. nonsense or NaN with exit 0 ------------------------------------------------------------

@pytest.mark.parametrize("option", ["--seq-len", "--global-batch", "--tp", "--gpus", "--dp",
                                    "--micro-batch", "--vp", "--pp-first-layers"])
@pytest.mark.parametrize("value", ["99999999999999999999", str(2**31),
                                   "1" + "0" * 400, "-" + "9" * 30])
def test_integer_options_are_bounded(capsys, option, value):
    line = _one_line_exit_2(capsys, ["predict", *SMALL, option, value], f"argument {option}")
    assert "allowed:" in line and str(INT_MAX) in line and len(line) < 300


def test_search_integer_options_are_bounded(capsys):
    for opt in ("--gpus", "--global-batch", "--chunk", "--top"):
        _one_line_exit_2(capsys, ["search", opt, "1" + "0" * 400], f"argument {opt}",
                         "out of range")


@pytest.mark.parametrize("field", TRAINING_SWITCHES)
@pytest.mark.parametrize("value", ["128", "3", "5", "1e18", "0.5"])
def test_training_switches_take_0_or_1(capsys, field, value):
    _one_line_exit_2(capsys, ["predict", *SMALL, "--set", f"{field}={value}"],
                     f"{field}=", ("allowed: 0, 1", "must be 0 or 1"))


@pytest.mark.parametrize("argv, fragment", [
    (["--cp-ring", "3"], "cp_ring=3"), (["--set", "axonn_overlap=3"], "axonn_overlap=3"),
    (["--set", "zero3_regather=2"], "zero3_regather=2"), (["--dp-overlap", "5"], "--dp-overlap"),
    (["--sequence-parallel", "2"], "--sequence-parallel")])
def test_parallel_switches_take_0_or_1(capsys, argv, fragment):
    _one_line_exit_2(capsys, ["predict", *SMALL, *argv], fragment)


def test_predict_json_is_strict_and_says_valid(capsys):
    assert main(["predict", *SMALL, "--json"]) == 0
    out = _strict(capsys.readouterr().out)
    assert out["result"]["valid"] is True
    assert np.isfinite(out["result"]["step_time_s"])


def test_print_json_refuses_non_finite_numbers(capsys):
    from diffperf.cli.output import print_json

    for bad in (float("nan"), float("inf"), np.float32("-inf")):
        with pytest.raises(SpecError, match=re.escape("--json: result.x is not a finite "
                                                      "number; nothing was printed")):
            print_json({"result": {"x": bad}})
    assert capsys.readouterr().out == ""


def test_a_job_that_overflows_float32_is_an_error_not_inf():
    """hidden = ffn = layers = vocab = seq_len = global_batch ~ 2^31: the step's FLOPs exceed
    float32's 3.4e38; predict names the cause instead of returning inf / NaN."""
    big = MODEL.replace(**{k: float(INT_MAX) for k in ("hidden", "seq_len", "vocab",
                                                       "ffn_hidden", "n_layers")})
    par = Parallel(tp=1.0, pp=1.0, dp=1.0, global_batch=float(INT_MAX))
    with pytest.raises(SpecError, match=r"prediction: \S+ is not a finite number \(float32 "
                                        r"overflow\): the job is too large to predict"):
        predict(big, par, SYSTEM)


def test_validate_json_all_oom_gives_null_with_a_note(tmp_path, capsys):
    header = ("id,system,num_gpus,num_layers,hidden,num_heads,vocab,seq_len,tp,pp,dp,"
              "global_batch,micro_batch,step_time_s,status")
    rows = [f"r{i},a100-sxm-80gb,1,12,768,12,50257,1024,1,1,1,{b},1,,oom" for i, b in
            enumerate((8, 16))]
    p = tmp_path / "runs.csv"
    p.write_text("\n".join([header, *rows]) + "\n")
    assert main(["validate", str(p), "--json"]) == 0
    out = _strict(capsys.readouterr().out)
    (group,) = [v for v in out["summary"].values() if "mape_pct" in v]
    assert group["mape_pct"] is None and group["n"] == 0 and "every run is oom" in group["note"]
    assert main(["validate", str(p)]) == 0
    text = capsys.readouterr().out
    assert "nan" not in text.lower() and "every run is oom" in text


@pytest.mark.parametrize("change, fragment", [
    (lambda s: s.replace(hbm_bandwidth_Bps=0.0), "hbm_bandwidth_Bps=0 is not allowed"),
    (lambda s: s.replace(matmul_flops_per_s=0.0), "matmul_flops_per_s=0 is not allowed"),
    (lambda s: s.replace(eff=s.eff.replace(mm_max=0.0)), "eff.mm_max=0 is not allowed"),
    (lambda s: s.replace(reliability=s.reliability.replace(failure_rate_per_s=0.0)),
     "reliability.failure_rate_per_s=0 is not allowed"),
    (lambda s: s.replace(tiers=(s.tiers[0].replace(bandwidth_Bps=-25e9),) + s.tiers[1:]),
     "tiers[0].bandwidth_Bps=-2.5e+10 is not allowed (allowed: > 0)"),
    (lambda s: s.replace(tiers=(s.tiers[0].replace(oversubscription=0.5),) + s.tiers[1:]),
     "tiers[0].oversubscription=0.5 is not allowed (allowed: >= 1"),
    (lambda s: s.replace(hbm_capacity_bytes=float("nan")), "hbm_capacity_bytes=nan"),
    (lambda s: s.replace(tiers=s.tiers * (MAX_TIERS // 2 + 1)),
     f"(allowed: 1 to {MAX_TIERS})"),
])
def test_a_system_built_in_python_is_validated(change, fragment):
    with pytest.raises(SpecError, match=re.escape(fragment)):
        predict(MODEL, LAYOUT, change(SYSTEM))


def test_a_job_larger_than_the_last_tier_is_refused(capsys):
    small = SYSTEM.replace(tiers=(SYSTEM.tiers[0],))  # one tier of 8 devices
    par = Parallel(tp=2.0, pp=2.0, dp=16.0, global_batch=64.0)
    with pytest.raises(SpecError, match=re.escape(
            "the job's 64 devices exceed the system's last network tier")):
        predict(MODEL, par, small)
    from diffperf.search import enumerate_layouts, search

    rows = enumerate_layouts(MODEL, 64, 64)
    with pytest.raises(SpecError, match="exceed the system's last network tier"):
        search(MODEL, small, Training(), rows[:4])


def test_under_jit_invalid_layouts_are_marked_not_predicted():
    """dp = -16 used to give -16.65 s and tp = 7 53.75 s under jit."""
    # one compilation serves every call below (the same leaf types: Python floats), with the
    # options predict uses on XLA:CPU (search.kernel._CPU_QUICK_OPTIONS): quicker to compile
    options = dict(compiler_options=_CPU_QUICK_OPTIONS) if jax.default_backend() == "cpu" else {}
    f = jax.jit(predict_step, **options)
    good = f(MODEL, LAYOUT, SYSTEM, Training())
    assert bool(good.valid) and np.isfinite(good.step_time_s)
    assert float(good.step_time_s) == pytest.approx(
        float(predict(MODEL, LAYOUT, SYSTEM).step_time_s), rel=1e-6)
    for bad in (LAYOUT.replace(dp=-16.0), LAYOUT.replace(tp=7.0), LAYOUT.replace(tp=2.5)):
        r = f(MODEL, bad, SYSTEM, Training())
        assert not bool(r.valid) and float(r.step_time_s) == np.inf
        assert float(r.tokens_per_s) == 0.0 and float(r.mfu) == 0.0 and not bool(r.fits)
    r = f(MODEL, LAYOUT, SYSTEM.replace(hbm_bandwidth_Bps=0.0), Training())
    assert not bool(r.valid) and float(r.step_time_s) == np.inf
    from diffperf.specs.batch import stack

    pars = jax.tree.map(lambda x: np.asarray(x, np.float32),
                        stack([LAYOUT, LAYOUT.replace(tp=7.0)]))
    batch = jax.jit(jax.vmap(predict_step, in_axes=(None, 0, None, None)), **options)(
        MODEL, pars, SYSTEM, Training())
    assert batch.valid.tolist() == [True, False]
    with pytest.raises(SpecError):  # concrete values: an error, not a mask
        predict(MODEL, LAYOUT.replace(tp=7.0), SYSTEM)


def test_gradients_stay_finite_with_the_mask():
    """d step / d HBM bandwidth through the in-program validity mask (`jnp.where(valid, step,
    inf)`) is finite and negative. One jitted program with the options predict uses on XLA:CPU
    (~3 s of CPU; run eagerly, its ~500 ops compiled one by one took ~15 s)."""
    options = dict(compiler_options=_CPU_QUICK_OPTIONS) if jax.default_backend() == "cpu" else {}
    g = jax.jit(jax.grad(lambda bw: predict_step(
        MODEL, LAYOUT, SYSTEM.replace(hbm_bandwidth_Bps=bw), Training()).step_time_s),
        **options)(SYSTEM.hbm_bandwidth_Bps)
    assert np.isfinite(g) and g < 0


# 2. tracebacks -------------------------------------------------------------------------------

@pytest.mark.parametrize("option", ["--vp", "--tp", "--gpus", "--seq-len", "--zero-stage"])
def test_double_dash_as_a_value_is_one_line(capsys, option):
    _one_line_exit_2(capsys, ["predict", f"{option}=--"], f"argument {option}",
                     "expected one value")


def test_argparse_refusals_are_one_line(capsys):
    for argv in (["predict", "--tp", "x"], ["predict", "--nope"], ["frobnicate"], [],
                 ["predict", "--recompute", "partial"], ["search", "--gpus"]):
        line = _one_line_exit_2(capsys, argv, "error:")
        assert "usage:" not in line


def test_plot_validation_short_row_and_huge_cell(tmp_path, capsys):
    p = tmp_path / "pred.csv"
    p.write_text("id,step_time_s,predicted_step_time_s\nr1,1.0\n")
    _one_line_exit_2(capsys, ["plot", "validation", str(p), "--out", str(tmp_path / "a.png")],
                     "has no predicted_step_time_s cell")
    p.write_text("id,step_time_s,predicted_step_time_s\nr1,1.0,2.0,3.0\n")
    _one_line_exit_2(capsys, ["plot", "validation", str(p), "--out", str(tmp_path / "a.png")],
                     "more cells than the header")
    p.write_text("id,step_time_s,predicted_step_time_s\nr1,1.0," + "9" * 200000 + "\n")
    _one_line_exit_2(capsys, ["plot", "validation", str(p), "--out", str(tmp_path / "a.png")],
                     "malformed CSV")


# 3. YAML that exhausts memory ----------------------------------------------------------------

def _billion_laughs(levels, where):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1},"
              f" *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, levels)]
    body = "\n  ".join(lines)
    return f"{where}:\n  {body}\nname: *a{levels - 1}\n"


@pytest.mark.parametrize("where", ["sources", "attention"])
def test_yaml_aliases_are_refused_before_expansion(tmp_path, where):
    p = tmp_path / "bomb.yaml"
    p.write_text(_billion_laughs(9, where))
    assert p.stat().st_size < 2048
    with pytest.raises(SpecError, match=re.escape("malformed YAML: YAML aliases are not "
                                                  "allowed (*a0; write the value out)")):
        load_model(p)
    with pytest.raises(SpecError, match="YAML aliases are not allowed"):
        read_yaml(p)


def test_did_you_mean_is_bounded():
    from diffperf.errors import closest

    assert closest("x" * 10**6, ["num_layers"]) == ""
    assert closest("num_layer", ["num_layers"]) == "; did you mean 'num_layers'?"


# 5. errors that do not help ------------------------------------------------------------------

def test_names_are_sanitized_before_the_terminal(tmp_path, capsys):
    cfg = dict(model_type="llama", num_hidden_layers=4, hidden_size=256, intermediate_size=512,
               num_attention_heads=4, num_key_value_heads=4, vocab_size=1000,
               max_position_embeddings=128, hidden_act="silu", rms_norm_eps=1e-5,
               _name_or_path="\x1b]0;pwned\x07\x1b[2J[red]evil[/red]\x1b[31m")
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    model = load_model(p)
    assert "\x1b" not in model.name and "\x07" not in model.name
    assert main(["predict", "--model", str(p), "--gpus", "1", "--tp", "1", "--pp", "1",
                 "--global-batch", "1", "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "[red]evil[/red]" in out  # markup shown as text
    y = tmp_path / "m.yaml"
    y.write_text("name: \"bad\\e[5mname\\x07\"\nnum_layers: 2\nhidden: 64\nffn_hidden: 256\n"
                 "num_heads: 2\nnum_kv_heads: 2\nhead_dim: 32\nvocab: 100\nseq_len: 64\n")
    assert load_model(y).name == "badname"  # the whole sequence ESC [ 5 m removed


def test_bom_runs_csv_is_read(tmp_path, capsys):
    header = ("id,system,num_gpus,num_layers,hidden,num_heads,vocab,seq_len,tp,pp,dp,"
              "global_batch,micro_batch,step_time_s")
    p = tmp_path / "bom.csv"
    p.write_bytes("\ufeff".encode() + (header + "\nr1,a100-sxm-80gb,1,12,768,12,50257,1024,1,1,1,"
                                       "8,1,0.5\n").encode())
    from diffperf import load_runs

    assert load_runs(p).ids == ["r1"]
    assert main(["validate", str(p), "--json"]) == 0
    capsys.readouterr()


def test_out_links_are_written_through_and_dangling_needs_force(tmp_path, capsys):
    from diffperf.cli.output import write_atomic

    target = tmp_path / "real.txt"
    target.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    with pytest.raises(SpecError, match="exists; pass --force"):
        write_atomic(link, "new", force=False)
    write_atomic(link, "new", force=True)
    assert link.is_symlink() and target.read_text() == "new"
    dangling = tmp_path / "dangling.txt"
    dangling.symlink_to(tmp_path / "missing.txt")
    with pytest.raises(SpecError, match=re.escape("is a link to a missing file")):
        write_atomic(dangling, "x", force=False)
    assert dangling.is_symlink() and not (tmp_path / "missing.txt").exists()
    write_atomic(dangling, "x", force=True)
    assert dangling.is_symlink() and (tmp_path / "missing.txt").read_text() == "x"
    assert sorted(os.listdir(tmp_path)) == ["dangling.txt", "link.txt", "missing.txt",
                                            "real.txt"]


def test_new_messages_whole(tmp_path, capsys):
    """Each new refusal, quoted whole (tests/test_error_audit.py)."""
    import argparse

    from diffperf.cli.args import finite, whole
    from diffperf.cli.output import write_atomic

    dangling = tmp_path / "d.png"
    dangling.symlink_to(tmp_path / "gone.png")
    with pytest.raises(SpecError, match=re.escape(
            f"{dangling} is a link to a missing file ({tmp_path / 'gone.png'}); pass --force "
            f"to write that file")):
        write_atomic(dangling, "x", force=False)
    p = tmp_path / "pred.csv"
    p.write_text("id,step_time_s,predicted_step_time_s\nr1,1.0\n")
    assert _one_line_exit_2(capsys, ["plot", "validation", str(p), "--out",
                                     str(tmp_path / "a.png")]) == (
        f"error: {p}: run 'r1' has no predicted_step_time_s cell (a short row)")
    p.write_text("id,step_time_s,predicted_step_time_s\nr1,1.0,2.0,3.0\n")
    assert _one_line_exit_2(capsys, ["plot", "validation", str(p), "--out",
                                     str(tmp_path / "a.png")]) == (
        f"error: {p}: run 'r1' has more cells than the header")
    for text, message in (("x", "'x' is not a whole number (allowed: 1 to 2147483647)"),
                          ("2147483648", "'2147483648' is out of range (allowed: 1 to "
                                         "2147483647)")):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
            whole(1)(text)
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape("'y' is not a number")):
        finite("y")
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(
            "'inf' is out of range (allowed: finite numbers, magnitude at most 1e30)")):
        finite("inf")
    moe = MODEL.replace(n_experts=2.0, moe_topk=4.0, moe_ffn_hidden=3072.0)
    cases = (
        (lambda: predict(moe, LAYOUT, SYSTEM), "model: moe_topk=4 must be <= n_experts=2"),
        (lambda: predict(MODEL, LAYOUT, SYSTEM.replace(tiers=SYSTEM.tiers * 5)),
         "system: tiers has 10 network tiers (allowed: 1 to 8): real fabrics have at most"),
        (lambda: predict(MODEL, LAYOUT.replace(tp=float(2**31)), SYSTEM),
         "parallel: tp=2.14748e+09 must be a whole number >= 1 (at most 2147483647)"),
        (lambda: predict(MODEL.replace(n_layers=0.0), LAYOUT, SYSTEM),
         "model: n_layers=0 must be a whole number >= 1 (at most 2147483647)"),
        (lambda: predict(MODEL.replace(n_experts=-1.0), LAYOUT, SYSTEM),
         "model: n_experts=-1 must be a whole number >= 0 (at most 2147483647)"),
        (lambda: predict(MODEL, LAYOUT, SYSTEM.replace(power_W=float("inf"))),
         "system: power_W=inf must be a finite number (magnitude at most 1e+30)"))
    for call, message in cases:
        with pytest.raises(SpecError, match=re.escape(message)):
            call()


def test_the_mask_leaves_range_edges_to_concrete_checks():
    """Finite differences step across oversubscription = 1 and fractions = 1 under jit
    (tests/test_sensitivity.py); concrete values are still refused there."""
    # the options (and leaf types) of test_under_jit_invalid_layouts_are_marked_not_predicted:
    # JAX's in-memory cache gives this jit that test's compiled program
    options = dict(compiler_options=_CPU_QUICK_OPTIONS) if jax.default_backend() == "cpu" else {}
    f = jax.jit(predict_step, **options)
    t = SYSTEM.tiers
    for s in (SYSTEM.replace(tiers=(t[0].replace(oversubscription=0.99),) + t[1:]),
              SYSTEM.replace(eff=SYSTEM.eff.replace(coll_eff_intra=1.01))):
        r = f(MODEL, LAYOUT, s, Training())
        assert bool(r.valid) and np.isfinite(r.step_time_s)
        with pytest.raises(SpecError):
            predict(MODEL, LAYOUT, s)


def test_layout_divisors_take_square_root_memory():
    """The layout enumeration's divisors (of the batch, the device count) by trial division up
    to sqrt(x): `predict --global-batch 2147483000` with no layout given allocated a
    2^31-element array (16 GiB) and was killed by the kernel (branch frontdoor). Same divisors
    as the brute force; the largest int32 batch, a prime, in a few thousand steps."""
    import tracemalloc

    from diffperf.search.enumerate import _divisors

    for x in (*range(1, 300), 1536, 2**20, 997 * 991):
        r = np.arange(1, x + 1)
        assert np.array_equal(_divisors(x), r[x % r == 0]), x
    tracemalloc.start()
    assert _divisors(INT_MAX).tolist() == [1, INT_MAX]  # 2^31 - 1 is prime
    assert _divisors(2147483000)[-1] == 2147483000
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 10 * 2**20, peak  # sqrt(2^31) x 8 bytes ~ 0.4 MB, not 16 GiB
