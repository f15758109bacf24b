"""Session 16 (branch factneeds): the facts a refusing rule needs are structured
(SpecError.needs, specs.validate.FactRule.needs), and the overlay hint reads them instead of a
regex over the message; the selective-recompute-module rules are FactRules; a number written
with '_' digit grouping is refused the same way in every input; the unmeasured sink-cost note
reads the H100 system file."""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import pytest

from diffperf import SpecError
from diffperf.cli.options import overlay_fact_hint
from diffperf.load import load_model, load_system, parse_overrides, training
from diffperf.specs import Parallel, Training
from diffperf.specs.validate import LOWP_GEMMS, check_inputs

SETTABLE = [f.name for f in dataclasses.fields(Parallel)] + [
    f.name for f in dataclasses.fields(Training) if f.name != "name"]


def _refusal(model="llama3-8b", precision="bf16", system="b200-sxm-180gb", tr=None, **par):
    with pytest.raises(SpecError) as err:
        check_inputs(load_model(model), Parallel(**par), load_system(system),
                     training(precision, **(tr or {})))
    return err.value


@pytest.mark.parametrize("par,tr,precision,field,needs", [
    ({}, dict(flash_attention=0.0, attention_fa2=1.0), "bf16", "attention_fa2",
     ("flash_attention",)),
    ({}, dict(fused_softmax_max_seq=2048.0), "bf16", "fused_softmax_max_seq",
     ("flash_attention",)),
    ({}, dict(lowp_te_quantizer=1.0), "bf16", "lowp_te_quantizer", LOWP_GEMMS),
    (dict(cp_ring=0), {}, "bf16", "cp_ring", ("cp",)),
    (dict(zero3_copy_out=1), {}, "bf16", "zero3_copy_out", ("zero_stage",)),
    (dict(axonn_overlap=0), {}, "bf16", "axonn_overlap", ("gx", "gy", "gz")),
    (dict(recompute=2, recompute_mlp=1), {}, "bf16", "recompute_mlp",
     ("recompute", "recompute_policy")),
    (dict(recompute=1, recompute_layer_frac=0.5), {}, "bf16", "recompute_layer_frac",
     ("recompute",)),
    (dict(pp=2, vp=2, global_batch=3), {}, "bf16", "vp",
     ("pp", "global_batch", "micro_batch", "dp", "gz")),
    (dict(dp=2, global_batch=3), {}, "bf16", "global_batch", ("micro_batch", "dp")),
    ({}, {}, "fp8-current", "precision", LOWP_GEMMS),  # on an A100 (below)
])
def test_a_refusal_names_the_facts_its_rule_needs(par, tr, precision, field, needs):
    err = _refusal(precision=precision, tr=tr,
                   system="a100-sxm-80gb" if field == "precision" else "b200-sxm-180gb", **par)
    assert (err.field, err.needs) == (field, needs)
    if err.rule is not None:  # a FactRule: the error's needs are the rule's
        assert err.rule.needs == needs


def test_a_model_rule_needs_no_fact():
    # the rule is decided by the model (no shared experts): no overlay fact to name
    err = _refusal(model="mixtral-8x7b", recompute=1, recompute_shared_experts=1)
    assert (err.field, err.needs) == ("recompute_shared_experts", ())


def _args(applied):
    return SimpleNamespace(calibration="my-overlay",
                           overlay_applied={f: f"{f}={v}" for f, v in applied.items()})


def test_overlay_hint_reads_needs_not_the_words():
    """The hint names an applied fact the rule needs (SpecError.needs), whatever the message
    says: a fact the message names in passing is not one, and one it spells otherwise is."""
    hint = " (--set {}=0 was applied from --calibration my-overlay, which was fitted under it: " \
           "give --set {}=VALUE to override it)"
    said = SpecError("x=1 needs flash_attention=1 (got flash_attention=0)", field="x")
    assert overlay_fact_hint(said, _args({"flash_attention": 0})) == ""  # (was: a hint)
    needs = SpecError("x=1 needs GEMMs in FP8 / FP4", field="x", needs=("lowp_fprop",))
    assert overlay_fact_hint(needs, _args({"lowp_fprop": 0})) == hint.format(
        "lowp_fprop", "lowp_fprop")
    # the refused field itself, applied: the hint as before; nothing applied: none
    own = SpecError("x=0 is not allowed", field="x")
    assert overlay_fact_hint(own, _args({"x": 0})) == hint.format("x", "x")
    assert overlay_fact_hint(needs, _args({})) == ""
    assert overlay_fact_hint(needs, None) == ""
    # the first of the overlay's facts (its order) that the rule needs
    both = SpecError("x", field="x", needs=("b", "a"))
    assert overlay_fact_hint(both, _args({"a": 0, "b": 0})) == hint.format("a", "a")


def test_lowp_rule_hint_the_regex_missed():
    """'needs GEMMs in FP8 / FP4 (lowp_fprop, lowp_dgrad or lowp_wgrad = 1; ...)': the old
    regex (`\\bFIELD\\s*=`) named lowp_wgrad only; an overlay fitted with lowp_fprop=0 now
    gets its hint too."""
    err = _refusal(tr=dict(lowp_te_quantizer=1.0))
    assert not re.search(r"\blowp_fprop\s*=", str(err))
    assert "--set lowp_fprop=0 was applied" in overlay_fact_hint(err, _args({"lowp_fprop": 0}))


def test_every_need_is_a_settable_field_other_than_the_refused_one():
    """Over a small grid of refusals (the generated comparison, calibration/
    check_fact_needs.py, runs 31,516): each need is a --set field, never the refused one."""
    seen = 0
    for par in (dict(cp_ring=0), dict(tp_overlap=0.5), dict(ep_overlap=1.0),
                dict(zero_shard=2), dict(recompute_policy=1), dict(recompute_core_attn=0),
                dict(pp_first_layers=1), dict(tp=3), dict(gx=2, tp=2), {}):
        for tr in ({}, dict(te_cudnn_norm=1.0), dict(te_scale_swizzle=1.0),
                   dict(rope_kv_pass=1.0, llama_eager_pointwise=1.0)):
            try:
                check_inputs(load_model("llama3-8b"), Parallel(**par),
                             load_system("b200-sxm-180gb"), training("bf16", **tr))
            except SpecError as err:
                seen += 1
                assert set(err.needs) <= set(SETTABLE) - {err.field}, (str(err), err.needs)
    assert seen == 9 * 4 + 3  # every layout above refuses; {} only with a training fact


# -------------------------------------------------------------- '_' digit grouping (YAML 1.1)

GROUPED = ("is written with '_' digit grouping, which YAML 1.2, JSON and diffperf's other "
           "inputs do not read as a number (YAML 1.1 does); allowed: the digits alone, ")


def test_a_grouped_number_is_refused_in_every_input(tmp_path):
    """PyYAML (YAML 1.1) reads `hidden: 1_024` as 1024, YAML 1.2, JSON, a CSV cell and --set
    do not: refused everywhere, naming field and value (was: a model / system / overlay YAML
    took it, --set and a CSV cell said 'must be a number')."""
    from diffperf import apply_overlay

    model = (tmp_path / "m.yaml")
    model.write_text("name: t\nnum_layers: 2\nhidden: 1_024\nffn_hidden: 4096\nnum_heads: 16\n"
                     "vocab: 32000\nseq_len: 2048\n")
    with pytest.raises(SpecError) as err:
        load_model(model)
    assert str(err.value) == (f"{model}.hidden=1_024 is written with '_' digit grouping, which "
                              f"YAML 1.2, JSON and diffperf's other inputs do not read as a "
                              f"number (YAML 1.1 does); allowed: the digits alone, 1024")
    assert (err.value.field, err.value.value) == ("hidden", "1_024")
    from diffperf.resources import configs_dir

    text = (configs_dir() / "systems" / "a100-sxm-80gb.yaml").read_text()
    system = tmp_path / "s.yaml"
    system.write_text(re.sub(r"(?m)^power_W: .*$", "power_W: 4_00.5", text))
    with pytest.raises(SpecError, match=re.escape(f"power_W=4_00.5 {GROUPED}400.5")):
        load_system(system)
    overlay = tmp_path / "o.yaml"
    overlay.write_text("efficiency:\n  mm_max: 0.7_5\n")
    with pytest.raises(SpecError, match=re.escape(f"efficiency.mm_max=0.7_5 {GROUPED}0.75")):
        apply_overlay(load_system("a100-sxm-80gb"), overlay)
    with pytest.raises(SpecError) as err:
        parse_overrides(["zero_shard=1_000"])
    assert str(err.value) == f"--set.zero_shard=1_000 {GROUPED}1000"
    # a quoted one in a YAML is the same text: the same refusal; an unquoted plain number and
    # YAML 1.2's exponent floats read as before
    model.write_text(model.read_text().replace("hidden: 1_024", "hidden: '1_024'"))
    with pytest.raises(SpecError, match=re.escape(f"hidden=1_024 {GROUPED}1024")):
        load_model(model)
    model.write_text(model.read_text().replace("hidden: '1_024'", "hidden: 1.024e3"))
    assert float(load_model(model).hidden) == 1024.0


def test_a_grouped_number_in_a_runs_cell_and_on_the_cli(tmp_path, capsys):
    from diffperf.cli.main import main

    assert main(["predict", "--model", "gpt-small", "--dp", "1", "--set",
                 "zero_shard=1_000"]) == 2
    assert f"--set.zero_shard=1_000 {GROUPED}1000" in capsys.readouterr().err.replace("\n", "")


# ---------------------------------------------------------------- the unmeasured sink cost

def test_unmeasured_sink_note_reads_the_h100_file(monkeypatch):
    """The note's H100 figure is the shipped h100-sxm-80gb file's attn_sink_bwd_row_ns (1.52
    ns; 64 x 4096 rows x 1.52 ns = 0.398 ms per layer), read through load_system: a changed
    file changes the note."""
    import diffperf
    from diffperf.cli.options import unmeasured_cost_notes

    gpt_oss, gb200 = load_model("gpt-oss-120b"), load_system("gb200-nvl72")
    bf16 = training("bf16")
    (note,) = unmeasured_cost_notes(gpt_oss, gb200, bf16)
    assert "it is 1.52 ns per query row x head, ~0.4 ms per layer backward" in note
    real = diffperf.load_system

    def remeasured(name, **kw):
        system = real(name, **kw)
        return system.replace(attn_sink_bwd_row_s=3.04e-9) if name == "h100-sxm-80gb" else system

    monkeypatch.setattr(diffperf, "load_system", remeasured)
    (note,) = unmeasured_cost_notes(gpt_oss, gb200, bf16)
    assert "it is 3.04 ns per query row x head, ~0.8 ms per layer backward" in note
