"""The package as a user installs it: shipped configs, overlays and datasets are package data
read through importlib.resources (diffperf.resources), found by name from any folder, listed
by `diffperf list`; and nothing tracked in the repository reads outside it (../shared).

The wheel itself is built, installed into a fresh virtualenv and run from an empty folder by
.ci/run (it needs pip and a build backend; too slow for the suite)."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from diffperf import SpecError, load_runs, load_system, resources
from diffperf.cli.main import main

REPO = Path(__file__).resolve().parents[1]


def _files(folder: Path, pattern: str) -> list[str]:
    return sorted(p.name for p in folder.glob(pattern))


def _cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------------------------
# package data through importlib.resources
# --------------------------------------------------------------------------------------------

def test_package_data_is_the_repository_folders():
    """The three resource folders hold exactly the files of the top-level folders people edit
    (configs/, calibration/fitted/, data/): a file added there is package data at once."""
    pkg = Path(str(resources.package_root())).resolve()
    assert pkg == (REPO / "diffperf").resolve()
    for kind in ("models", "systems", "design"):
        assert sorted(f"{n}.yaml" for n in resources.config_files(kind)) == _files(
            REPO / "configs" / kind, "*.yaml")
    assert sorted(f"{n}.yaml" for n in resources.calibration_files()) == _files(
        REPO / "calibration" / "fitted", "*.yaml")
    shipped = resources.dataset_files()
    assert sorted(f"{n}.csv" for n, (k, _) in shipped.items() if k == "runs") == _files(
        REPO / "data", "*.csv")
    assert sorted(f"{n}.csv" for n, (k, _) in shipped.items() if k == "kernels") == _files(
        REPO / "data" / "kernels", "*.csv")
    # the data ships with its provenance and the vTrain licence
    assert (resources.data_dir() / "README.md").is_file()
    assert "MIT License" in (resources.data_dir() / "LICENSE-vTrain").read_text()


def test_package_data_globs_cover_every_shipped_file():
    """pyproject's package-data globs match every file of the three folders (a new kind of
    file, e.g. a .json under configs/, must not be left out of the wheel)."""
    import fnmatch
    import tomllib

    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["diffperf"]
    for link in ("configs", "calibrations", "data"):
        root = REPO / "diffperf" / link
        assert root.is_symlink(), f"diffperf/{link} must link to the repository folder"
        for path in root.resolve().rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                rel = f"{link}/{path.relative_to(root.resolve()).as_posix()}"
                # setuptools' '**' also matches no folder at all (configs/README.md)
                assert any(fnmatch.fnmatch(rel, g) or fnmatch.fnmatch(rel, g.replace("**/", ""))
                           for g in globs), f"{rel} is not package data (pyproject globs {globs})"


def test_shipped_files_load_by_name_from_another_folder(tmp_path):
    """From an empty folder, in a fresh interpreter with the package on sys.path (as an
    installed one is): a model, a system with an overlay by name and a dataset by name."""
    code = (
        "import os, diffperf\n"
        "from diffperf import load_model, load_runs, load_system, resources\n"
        "m = load_model('gpt3-175b'); s = load_system('a100-4nic', calibration='vtrain-a100')\n"
        "r = load_runs('h100_single_gpu')\n"
        "print(len(r), float(s.eff.mm_max), os.getcwd())\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    n, mm_max, cwd = proc.stdout.split()
    assert Path(cwd) == tmp_path and not (tmp_path / "configs").exists()
    with (REPO / "data" / "h100_single_gpu.csv").open(newline="") as fh:
        assert int(n) == sum(1 for _ in csv.DictReader(fh))
    overlay = yaml.safe_load((REPO / "calibration/fitted/vtrain-a100.yaml").read_text())
    assert float(mm_max) == pytest.approx(overlay["efficiency"]["mm_max"], rel=1e-6)


# --------------------------------------------------------------------------------------------
# overlays and datasets by name
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(resources.calibration_files()))
def test_overlay_by_name_equals_overlay_by_path(name):
    path = REPO / "calibration" / "fitted" / f"{name}.yaml"
    by_name = load_system("a100-sxm-80gb", calibration=name)
    by_path = load_system("a100-sxm-80gb", calibration=str(path))
    assert by_name.eff == by_path.eff
    assert by_name.eff != load_system("a100-sxm-80gb").eff  # the overlay changed something


def test_overlay_fitted_on_names_shipped_datasets():
    """Every shipped overlay records the runs (and kernel files) it was fitted on by shipped
    dataset name, so a user can validate it: no path outside the repository."""
    shipped = resources.dataset_files()
    for name, f in resources.calibration_files().items():
        fitted = yaml.safe_load(f.read_text())["fitted_on"]
        assert fitted["runs"] in shipped and shipped[fitted["runs"]][0] == "runs", name
        for k in fitted.get("microbench") or []:
            assert k in shipped and shipped[k][0] == "kernels", (name, k)


def test_unknown_names_list_what_ships():
    with pytest.raises(SpecError, match=r"unknown calibration 'vtrain-a10'; did you mean "
                       r"'vtrain-a100'\? \(shipped: .*vtrain-a100.*; or give a path"):
        load_system("a100-sxm-80gb", calibration="vtrain-a10")
    with pytest.raises(SpecError, match=r"unknown dataset 'vtrain'.*\(shipped: .*vtrain_a100"):
        load_runs("vtrain")


def test_paths_still_mean_paths(tmp_path):
    """A path is never taken for a name: a missing .csv / .yaml is reported as the file."""
    with pytest.raises(SpecError, match="cannot read"):
        load_runs(tmp_path / "h100_single_gpu.csv")
    with pytest.raises(SpecError, match="cannot read"):
        load_system("a100-sxm-80gb", calibration=tmp_path / "vtrain-a100.yaml")


def test_validate_a_dataset_by_name_from_another_folder(capsys, tmp_path, monkeypatch):
    """`diffperf validate h100_single_gpu --calibration torch-h100` from an empty folder gives
    what the same files give by path."""
    args = ("--precision", "amp-bf16", "--json")
    path = REPO / "data" / "h100_single_gpu.csv"
    code, out_path, err = _cli(capsys, "validate", str(path), "--calibration",
                               str(REPO / "calibration/fitted/torch-h100.yaml"), *args)
    assert code == 0, err
    monkeypatch.chdir(tmp_path)
    code, out_name, err = _cli(capsys, "validate", "h100_single_gpu", "--calibration",
                               "torch-h100", *args)
    assert code == 0, err
    assert json.loads(out_name)["summary"] == json.loads(out_path)["summary"]
    assert json.loads(out_name)["summary"]["all"]["n"] > 0


# --------------------------------------------------------------------------------------------
# diffperf list
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,folder", [("models", "configs/models"),
                                         ("systems", "configs/systems"),
                                         ("calibrations", "calibration/fitted")])
def test_list_json_names_every_shipped_yaml(capsys, tmp_path, monkeypatch, kind, folder):
    monkeypatch.chdir(tmp_path)
    code, out, err = _cli(capsys, "list", kind, "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["name"] for r in rows] == sorted(p.stem for p in (REPO / folder).glob("*.yaml"))
    for r in rows:
        text = (REPO / folder / f"{r['name']}.yaml").read_text()
        assert r["description"] == " ".join(str(yaml.safe_load(text).get("description",
                                                                           "")).split())


def test_list_calibrations_shows_what_they_were_fitted_on(capsys):
    code, out, err = _cli(capsys, "list", "calibrations", "--json")
    assert code == 0, err
    rows = {r["name"]: r for r in json.loads(out)}
    v = rows["vtrain-a100"]
    overlay = yaml.safe_load((REPO / "calibration/fitted/vtrain-a100.yaml").read_text())
    assert v["runs"] == "vtrain_a100" and v["set"] == overlay["fitted_on"]["set"]
    assert v["heldout_n"] == overlay["heldout"]["heldout"]["n"]
    code, out, err = _cli(capsys, "list", "calibrations")
    assert code == 0 and "vtrain-a100" in out and "dp_overlap=0" in out


def test_list_datasets_counts_rows(capsys):
    code, out, err = _cli(capsys, "list", "datasets", "--json")
    assert code == 0, err
    rows = {r["name"]: r for r in json.loads(out)}
    for sub, kind in (("", "runs"), ("kernels", "kernels")):
        for p in (REPO / "data" / sub).glob("*.csv"):
            with p.open(newline="") as fh:
                n = sum(1 for _ in csv.DictReader(fh))
            assert rows[p.stem]["kind"] == kind and rows[p.stem]["rows"] == n, p
    assert rows["vtrain_a100"]["rows"] == 1549  # data/README.md: 1549 measured iterations
    code, out, err = _cli(capsys, "list", "datasets")
    assert code == 0 and "data/README.md" in out


def test_list_refuses_an_unknown_kind(capsys):
    assert main(["list", "model"]) == 2  # argparse's refusal as one line (cli/args.py)
    err = capsys.readouterr().err
    assert "'model'" in err and "models" in err and len(err.strip().splitlines()) == 1, err


# --------------------------------------------------------------------------------------------
# nothing reads outside the repository
# --------------------------------------------------------------------------------------------

# '../shared', a path built as .. / "shared", a repository's parent folder, or an absolute
# path to a shared/data folder (a machine's layout)
_OUTSIDE = re.compile(r"\.\./shared|[\"']shared[\"']\s*/|parents\[2\]|REPO\.parent\b|"
                      r"(?<![\w.])/[\w.-]+/shared/data|\$\{?DATA:-\.\.")


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True, timeout=60).stdout.split()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an sdist)
        pytest.skip("not a git checkout")
    return [REPO / p for p in out]


def test_no_tracked_code_reads_outside_the_repository():
    """No tracked .py, .sh, CI script or shipped overlay points at ../shared: a fresh clone
    has nothing beside it."""
    me = Path(__file__).resolve()
    checked, hits = 0, []
    for path in _tracked_files():
        code = (path.suffix in (".py", ".sh") or ".ci" in path.parts
                or path.parent.name == "fitted")
        if not code or path.resolve() == me or not path.is_file():
            continue
        checked += 1
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if _OUTSIDE.search(line):
                hits.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert checked > 50
    assert not hits, "\n".join(hits)


# --------------------------------------------------------------------------------------------
# README: a quickstart whose commands are the ones CI runs and the CLI accepts
# --------------------------------------------------------------------------------------------

SETUP = ('pip install -e ".[test]" && diffperf predict', "python -m pytest -q")


def _readme() -> str:
    return (REPO / "README.md").read_text()


def test_readme_is_a_quickstart_with_the_two_setup_commands():
    text = _readme()
    assert len(text.splitlines()) < 150
    block = text.split("## Set-up: two commands", 1)[1].split("```bash", 1)[1].split("```")[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == list(SETUP)
    ci = (REPO / ".ci" / "run").read_text()
    for command in SETUP:  # CI runs exactly what the README says
        assert any(line.strip() == command for line in ci.splitlines()), command


def test_readme_and_docs_links_point_at_files():
    pages = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
    checked = 0
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name}: broken link {target}"
            checked += 1
    assert checked > 10


def test_readme_commands_parse():
    """Every `diffperf ...` line of the README's code blocks is accepted by the CLI's parser
    (arguments checked, nothing run); lines with a `...` placeholder are skipped."""
    import shlex

    from diffperf.cli.main import _parser

    blocks = re.findall(r"```bash\n(.*?)```", _readme(), flags=re.S)
    lines = " ".join(blocks).replace("\\\n", " ").splitlines()
    commands = []
    for line in lines:
        for part in line.split("#")[0].split("&&"):
            words = shlex.split(part)
            if words[:1] == ["diffperf"] and "..." not in words:
                commands.append(words[1:])
    assert len(commands) >= 6
    for argv in commands:
        args = _parser().parse_args(argv)
        assert callable(args.run), argv


def test_readme_explains_every_breakdown_row():
    """The quickstart's "What the rows mean" names every exposed part of the step (they sum to
    the step time) and the hidden ones by pattern."""
    from diffperf.result import EXPOSED_PARTS

    section = _readme().split("### What the rows mean", 1)[1].split("\n## ", 1)[0]
    assert [p for p in EXPOSED_PARTS if f"`{p}`" not in section] == []
    assert "`*_hidden_s`" in section
