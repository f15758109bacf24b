"""Regression pins: a few predictions from shipped configs, stored in regression_pins.json.

These are NOT accuracy tests (the values are the model's own output, not measurements): they
make any change that moves a prediction visible. When a change is meant to move them, run

    python tests/make_regression_pins.py

which rewrites tests/regression_pins.json from the cases in that script, and explain in the
commit message which pins moved, by how much and why. Compared at 1e-6 relative (float32
results of the same code are bit-identical; the slack absorbs another CPU's summation order).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from diffperf.cli.main import main

from make_regression_pins import CASES, FIELDS, PINS, predict_case

REL = 1e-6
PINNED = json.loads(PINS.read_text())["cases"]
HOW_TO_UPDATE = ("if this change is intended, re-run `python tests/make_regression_pins.py` and "
                 "explain in the commit message which predictions moved, by how much and why")


def test_pins_match_the_cases_of_the_script():
    """The JSON was generated from the script's current cases (none added or edited since)."""
    assert sorted(PINNED) == sorted(CASES), HOW_TO_UPDATE
    for name, (model, system, layout, precision) in CASES.items():
        pin = PINNED[name]
        assert (pin["model"], pin["system"], pin["layout"], pin["precision"]) == (
            model, system, layout, precision), f"{name}: inputs changed; {HOW_TO_UPDATE}"
        assert sorted(pin["expected"]) == sorted(FIELDS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_prediction_is_pinned(name):
    got = predict_case(CASES[name])
    expected = PINNED[name]["expected"]
    moved = {k: (expected[k], got[k]) for k in FIELDS
             if not math.isclose(got[k], expected[k], rel_tol=REL, abs_tol=0.0)}
    assert not moved, f"{name}: prediction moved " + "; ".join(
        f"{k} {old:.9g} -> {new:.9g} ({100 * (new - old) / old:+.4g} %)"
        for k, (old, new) in moved.items()) + f". {HOW_TO_UPDATE}"


def test_cli_default_is_the_pinned_default(capsys):
    """`diffperf predict --calibration none` is the first pinned case (DESIGN.md's default,
    physics efficiencies); with no options it is the same layout under the shipped A100
    efficiency set (docs/trust.md)."""
    from diffperf import Parallel, load_model, load_system, predict, training
    from diffperf.trust import default_set

    code = main(["predict", "--json", "--calibration", "none"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)["result"]
    expected = PINNED["gpt3-175b/a100-sxm-80gb/cli-default"]["expected"]
    got = {"step_time_s": result["step_time_s"], "memory.total_bytes":
           result["memory"]["total_bytes"], "mfu": result["mfu"]}
    for k in FIELDS:
        assert math.isclose(got[k], expected[k], rel_tol=REL), (k, got[k], expected[k],
                                                                HOW_TO_UPDATE)
    assert main(["predict", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["efficiency_set"]["name"] == "a100-default"
    model, _, layout, precision = CASES["gpt3-175b/a100-sxm-80gb/cli-default"]
    want = predict(load_model(model), Parallel(**layout),
                   load_system("a100-sxm-80gb", default_set("a100")["path"]), training(precision))
    assert math.isclose(data["result"]["step_time_s"], float(want.step_time_s), rel_tol=REL)


def test_pins_file_is_where_the_script_writes():
    assert PINS == Path(__file__).resolve().parent / "regression_pins.json"
