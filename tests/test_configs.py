"""Every shipped config loads, and every number in it cites its source (DEVELOPERS.md)."""

from pathlib import Path

import pytest
import yaml

import diffperf

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
FILES = sorted((CONFIGS / "models").glob("*.yaml")) + sorted((CONFIGS / "systems").glob("*.yaml"))


def _numeric_paths(d, prefix=""):
    for key, value in d.items():
        if key == "sources":
            continue
        path = f"{prefix}{key}"
        if isinstance(value, bool) or isinstance(value, (int, float)):
            yield path
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    yield from _numeric_paths(item, f"{path}[{i}].")
        elif isinstance(value, dict):
            yield from _numeric_paths(value, f"{path}.")


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.stem}" for p in FILES])
def test_every_number_cites_a_source(path):
    d = yaml.safe_load(path.read_text())
    sources = d.get("sources") or {}
    missing = [p for p in _numeric_paths(d) if not str(sources.get(p, "")).strip()]
    assert not missing, f"{path.name}: no source for {missing}"


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.stem}" for p in FILES])
def test_loads_by_name(path):
    load = diffperf.load_model if path.parent.name == "models" else diffperf.load_system
    spec = load(path.stem)
    assert spec.name == path.stem
