"""Review of session 16's '_' grouping refusal (branch review16a): configs/README.md says a
number written `1_000` is refused "in every file and option", but the command line's numeric
options (argparse types `cli.args.whole` / `finite`, and the layout lists of
`cli.options.parse_values`) read it through Python's int() / float(), which take one '_'
between digits: `--seq-len 1_024` ran as 1024 and search's `--tp 1_6` as 16."""

from __future__ import annotations

import pytest

from diffperf import SpecError
from diffperf.cli.main import main
from diffperf.cli.options import parse_values

GROUPED = ("is written with '_' digit grouping, which YAML 1.2, JSON and diffperf's other "
           "inputs do not read as a number (YAML 1.1 does); allowed: the digits alone, ")


@pytest.mark.parametrize("argv,said", [
    (["--seq-len", "1_024"], "argument --seq-len: '1_024' "),
    (["--global-batch", "1_6"], "argument --global-batch: '1_6' "),
    (["--gpus", "1_6"], "argument --gpus: '1_6' "),
])
def test_a_grouped_option_value_is_refused(argv, said, capsys):
    assert main(["predict", "--model", "gpt-small", "--dp", "1", *argv]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{said}{GROUPED}{argv[1].replace('_', '')}" in err


def test_a_grouped_float_option_value_is_refused(capsys):
    # a float option (cli.args.finite): design's --tokens
    assert main(["design", "--model", "gpt-small", "--tokens", "3_000"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"argument --tokens: '3_000' {GROUPED}3000" in err


def test_a_grouped_layout_list_value_is_refused():
    with pytest.raises(SpecError) as err:
        parse_values("tp", "1,1_6")
    assert str(err.value) == ("--tp=1_6 is written with '_' digit grouping, which YAML 1.2, "
                              "JSON and diffperf's other inputs do not read as a number (YAML "
                              "1.1 does); allowed: the digits alone, 16")
    assert (err.value.field, err.value.value) == ("tp", "1_6")
    assert parse_values("tp", "1,2-4,16") == (1, 2, 3, 4, 16)  # plain lists read as before
