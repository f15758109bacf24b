"""`diffperf plot`: figures of a prediction, a search and a validation (files and the numbers
they report, not pixels)."""

from __future__ import annotations

import json

import pytest

from diffperf.cli.main import main

PNG = b"\x89PNG\r\n\x1a\n"


def _json(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_plot_predict_writes_the_breakdown_figure(tmp_path, capsys):
    fig = tmp_path / "pred.png"
    out = _json(capsys, "plot", "predict", "--model", "gpt-small", "--system", "a100-sxm-80gb",
                "--gpus", "8", "--tp", "2", "--pp", "1", "--global-batch", "16", "--out",
                str(fig), "--json")
    assert fig.read_bytes()[:8] == PNG
    r = out["result"]
    assert r["step_time_s"] > 0 and r["memory"]["total_bytes"] > 0


def test_plot_search_writes_the_pareto_figure(tmp_path, capsys):
    fig = tmp_path / "search.svg"
    out = _json(capsys, "plot", "search", "--model", "gpt-small", "--system", "a100-sxm-80gb",
                "--gpus", "8", "--global-batch", "16", "--no-cache", "--out", str(fig),
                "--json")
    assert fig.read_text().lstrip().startswith("<?xml")
    assert 0 < out["pareto_points"] <= out["feasible"] <= out["evaluated"]
    assert out["best_layout"]["tp"] * out["best_layout"]["pp"] * out["best_layout"]["dp"] == 8


def _write(path, text):
    path.write_text(text)
    return str(path)


def test_plot_validation_reads_validate_output_and_runs(tmp_path, capsys):
    pred = _write(tmp_path / "pred.csv", "id,step_time_s,predicted_step_time_s,"
                  "predicted_peak_memory_GB,predicted_fits\n"
                  "a,1.0,1.1,10,1\nb,2.0,1.5,10,1\nc,,3.0,90,0\nd,4.0,4.0,10,1\n")
    runs = _write(tmp_path / "runs.csv", "id,source,step_time_s\na,x,1.0\nb,x,2.0\nc,y,\n"
                  "d,y,4.0\n")
    fig = tmp_path / "val.png"
    out = _json(capsys, "plot", "validation", pred, runs, "--out", str(fig), "--json")
    assert fig.read_bytes()[:8] == PNG
    assert out["n"] == 3  # run c has no measured time (OOM)
    assert out["per_source"]["x"]["mape_pct"] == pytest.approx(100 * (0.1 + 0.25) / 2)
    assert out["per_source"]["y"]["mape_pct"] == pytest.approx(0.0)


@pytest.mark.parametrize("argv, fragment", [
    (("plot", "validation", "MISSING.csv", "--out", "x.png"), "cannot read"),
    (("plot", "validation", "PRED", "--out", "x.txt"), "must be .png, .svg or .pdf"),
])
def test_plot_errors_are_one_line(tmp_path, capsys, argv, fragment):
    argv = [a.replace("PRED", _write(tmp_path / "p.csv", "id,step_time_s\na,1\n"))
            .replace("x.png", str(tmp_path / "x.png")) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err


def test_plot_validation_names_a_missing_column(tmp_path, capsys):
    pred = _write(tmp_path / "p.csv", "id,step_time_s\na,1\n")
    assert main(["plot", "validation", pred, "--out", str(tmp_path / "v.png")]) == 2
    assert "predicted_step_time_s" in capsys.readouterr().err


def test_plot_validation_takes_the_runs_by_their_shipped_name(tmp_path, capsys):
    """`validate h100_single_gpu --out pred.csv` then `plot validation pred.csv
    h100_single_gpu`: the runs CSV by the name validate took (was 'cannot read')."""
    pred = _write(tmp_path / "pred.csv", "id,step_time_s,predicted_step_time_s\n"
                  "h100-s1234-000,1.0,1.1\nh100-s1234-001,2.0,2.0\n")
    fig = tmp_path / "val.png"
    out = _json(capsys, "plot", "validation", pred, "h100_single_gpu", "--out", str(fig),
                "--json")
    assert out["n"] == 2 and set(out["per_source"]) == {"torch-h100"}
    assert out["per_source"]["torch-h100"]["mape_pct"] == pytest.approx(5.0)


def test_plot_validation_refuses_a_column_given_twice(tmp_path, capsys):
    """A predictions CSV with two predicted_step_time_s columns was read from the last one
    without a word (the runs CSV reader refuses it since session 14; plot's did not)."""
    pred = _write(tmp_path / "p.csv", "id,step_time_s,predicted_step_time_s,"
                  "predicted_step_time_s\na,1,2,1.1\n")
    assert main(["plot", "validation", pred, "--out", str(tmp_path / "v.png")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {pred}: column 'predicted_step_time_s' appears 2 times in the header "
        f"(allowed: each column once)")
