"""Imports point down the layer diagram of DESIGN.md; only cli/ and load.py read files.

Loading (load.py: files, units, validation) is the layer above the specs: no spec module
imports it, so the specs import nothing but each other and the errors (issue 14)."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "diffperf"

# Each layer may import only from itself and the layers listed for it.
ALLOWED = {
    "specs": {"specs", "errors"},
    "workload": {"workload", "specs"},
    "costs": {"costs", "specs", "workload"},
    "schedule": {"schedule", "costs", "specs"},
    "memory": {"memory", "workload", "specs", "result"},
}


def _imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("diffperf"):
            yield node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("diffperf"):
                    yield alias.name


def test_imports_point_down():
    bad = []
    for layer, allowed in ALLOWED.items():
        for path in (PKG / layer).glob("*.py"):
            for mod in _imports(path):
                target = mod.split(".")[1] if "." in mod else ""
                if target and target not in allowed:
                    bad.append(f"{path.relative_to(PKG)} imports {mod}")
    assert not bad, bad


def test_specs_do_not_import_the_loader():
    """The spec pytrees are below the loader: not even a lazy import inside a function."""
    bad = [f"{path.name} imports {mod}" for path in (PKG / "specs").glob("*.py")
           for mod in _imports(path) if mod == "diffperf.load" or mod.startswith("diffperf.load.")]
    assert not bad, bad


def test_only_cli_and_loader_touch_files():
    io_calls = ("open(", ".read_text(", ".write_text(", "csv.", "yaml.")
    offenders = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).as_posix()
        if rel.startswith("cli/") or rel == "load.py":
            continue
        text = path.read_text()
        offenders += [f"{rel}: {c}" for c in io_calls if c in text]
    assert not offenders, offenders
