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


# ---------------------------------------------- YAML 1.1's other number forms (PyYAML)

MODEL = ("name: t\nnum_layers: 2\nhidden: 1024\nffn_hidden: 4096\nnum_heads: 16\n"
         "vocab: 32000\nseq_len: 2048\n")


@pytest.mark.parametrize("key,text,message", [
    ("hidden", "010", "hidden=010 is written with a leading zero, which YAML 1.1 (PyYAML) reads "
     "as the octal number 8 and YAML 1.2 and diffperf's other inputs as 10; allowed: the "
     "number meant, without the leading zero: 8 or 10"),
    ("hidden", "-0_10", "hidden=-0_10 is written with a leading zero, which YAML 1.1 (PyYAML) "
     "reads as the octal number -8 and YAML 1.2 and diffperf's other inputs as -10; allowed: "
     "the number meant, without the leading zero: -8 or -10"),
    ("num_layers", "1:30", "num_layers=1:30 is written in base 60, which YAML 1.1 (PyYAML) "
     "reads as 90 and YAML 1.2, JSON and diffperf's other inputs do not read as a number; "
     "allowed: the decimal number, 90"),
    ("vocab", "0x1F", "vocab=0x1F is written in hexadecimal, which YAML reads as 31 and JSON "
     "and diffperf's other inputs do not read as a number; allowed: the decimal number, 31"),
    ("vocab", "0b101", "vocab=0b101 is written in binary, which YAML 1.1 (PyYAML) reads as 5 "
     "and YAML 1.2, JSON and diffperf's other inputs do not read as a number; allowed: the "
     "decimal number, 5"),
])
def test_a_yaml11_number_is_refused_in_a_model(tmp_path, key, text, message):
    """PyYAML (YAML 1.1) read `hidden: 010` as 8, `1:30` as 90, `0x1F` as 31 and `0b101` as
    5, silently; YAML 1.2 reads 010 as 10 and 0x1F as 31 and has no base-60 or binary
    number, JSON and a runs CSV cell have none of them."""
    import re

    from diffperf.load import load_model

    model = tmp_path / "m.yaml"
    model.write_text(re.sub(rf"(?m)^{key}: .*$", f"{key}: {text}", MODEL))
    with pytest.raises(SpecError) as err:
        load_model(model)
    assert str(err.value) == f"{model}.{message}"
    assert (err.value.field, err.value.value) == (key, text)


def test_yaml11_numbers_in_a_system_and_an_overlay_and_plain_ones_read(tmp_path):
    import re

    from diffperf import apply_overlay
    from diffperf.load import load_model, load_system
    from diffperf.resources import configs_dir

    text = (configs_dir() / "systems" / "a100-sxm-80gb.yaml").read_text()
    system = tmp_path / "s.yaml"
    system.write_text(re.sub(r"(?m)^power_W: .*$", "power_W: 0x190", text))
    with pytest.raises(SpecError, match="power_W=0x190 is written in hexadecimal, which YAML "
                                        "reads as 400 and JSON"):
        load_system(system)
    overlay = tmp_path / "o.yaml"
    overlay.write_text("efficiency:\n  kernel_s: 1:30.5\n")
    with pytest.raises(SpecError, match=r"efficiency.kernel_s=1:30.5 is written in base 60, "
                                        r"which YAML 1.1 \(PyYAML\) reads as 90.5 and"):
        apply_overlay(load_system("a100-sxm-80gb"), overlay)
    # spellings every reader takes alike still read: 07 (7 in octal and decimal), 0, a
    # decimal float with a leading zero, a YAML 1.2 exponent float
    model = tmp_path / "m.yaml"
    model.write_text(MODEL.replace("num_layers: 2", "num_layers: 07").replace(
        "seq_len: 2048", "seq_len: 1.024e3") + "moe_dense_layers: 0\n")
    m = load_model(model)
    assert (float(m.n_layers), float(m.seq_len), float(m.moe_dense_layers)) == (7, 1024, 0)
    system.write_text(re.sub(r"(?m)^power_W: .*$", "power_W: 0400.5", text))
    assert float(load_system(system).power_W) == 400.5


def test_text_inputs_say_the_yaml11_form_and_read_a_leading_zero_as_decimal():
    """A --set value (and a runs CSV cell, the same `_number`): 0x10 is refused with the
    spelling named (was 'must be a number'); 010 reads as 10, as YAML 1.2 and Python read it
    (no octal reading exists there)."""
    from diffperf.load import parse_overrides

    with pytest.raises(SpecError) as err:
        parse_overrides(["zero_shard=0x10"])
    assert str(err.value) == ("--set.zero_shard=0x10 is written in hexadecimal, which YAML "
                              "reads as 16 and JSON and diffperf's other inputs do not read "
                              "as a number; allowed: the decimal number, 16")
    par, _ = parse_overrides(["zero_shard=010"])
    assert par["zero_shard"] == 10.0


def test_a_yaml11_number_in_an_overlay_envelope_is_refused(tmp_path):
    """trust.overlay_set reads a user overlay's regimes; an envelope bound went through
    Python's float(), which read a '_'-grouped text ('1_6' -> 16) and crashed on '0x10'."""
    from diffperf.trust import overlay_set

    overlay = tmp_path / "o.yaml"
    for bound, said in (("0x10", "is written in hexadecimal"),
                        ("1_6", "is written with '_' digit grouping")):
        overlay.write_text("efficiency:\n  mm_max: 0.7\nregimes:\n- name: fit\n  q95_log: 0.2\n"
                           f"  envelope:\n    tp:\n    - 1\n    - {bound}\n")
        with pytest.raises(SpecError, match=f"regime 'fit'.envelope.tp={bound} {said}"):
            overlay_set(overlay)
