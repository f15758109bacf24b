"""The files shipped inside the package, found through importlib.resources.

Three folders of package data, each a symlink in the source tree to a top-level folder of the
repository (kept there for the people who edit them), copied into wheels and followed by
editable installs and by a checkout on sys.path alike:

- `configs/`: models, systems and design cost models (configs/README.md cites every number);
- `calibrations/`: the fitted efficiency overlays (calibration/fitted/NAME.yaml), by name;
- `data/`: measured runs and kernel measurements with their provenance and licence
  (data/README.md), by name: the file's stem (`vtrain_a100`, `h100_gemm`, ...).

Installed from a wheel the package is a folder (pip never installs a zip), so the Traversable
that importlib.resources returns is a real file-system path: loaders open it as one.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from diffperf.errors import SpecError, closest

DATA_KINDS = {"": "runs", "kernels": "kernels"}  # data/ subfolder -> kind shown by `list`


def package_root():
    """The installed (or checked-out) `diffperf` package folder."""
    return files("diffperf")


def configs_dir():
    """The shipped configs/ folder (models/, systems/, design/)."""
    return package_root() / "configs"


def calibrations_dir():
    """The shipped calibration overlays (calibration/fitted/ in the repository)."""
    return package_root() / "calibrations"


def data_dir():
    """The shipped measured-run and kernel datasets (data/ in the repository)."""
    return package_root() / "data"


def _stems(folder, suffixes) -> dict:
    """{stem: file} of the files in `folder` with one of `suffixes`, sorted by stem."""
    if not folder.is_dir():
        return {}
    out = {}
    for entry in folder.iterdir():
        for suffix in suffixes:
            if entry.is_file() and entry.name.endswith(suffix):
                out[entry.name[: -len(suffix)]] = entry
    return dict(sorted(out.items()))


def config_files(kind: str) -> dict:
    """{name: file} of configs/KIND/*.yaml (kind: models, systems, design)."""
    return _stems(configs_dir() / kind, (".yaml",))


def calibration_files() -> dict:
    """{name: file} of the shipped overlays, e.g. 'vtrain-a100'."""
    return _stems(calibrations_dir(), (".yaml",))


def dataset_files() -> dict:
    """{name: (kind, file)} of the shipped CSVs: kind 'runs' (data/*.csv, the runs schema of
    data/README.md) or 'kernels' (data/kernels/*.csv)."""
    out = {}
    for sub, kind in DATA_KINDS.items():
        folder = data_dir() / sub if sub else data_dir()
        out.update({name: (kind, f) for name, f in _stems(folder, (".csv",)).items()})
    return dict(sorted(out.items()))


def _is_path(name_or_path, suffixes) -> bool:
    """A path (rather than a shipped name): an existing file, a path with a folder, or a
    name ending in one of `suffixes`."""
    text = str(name_or_path)
    try:
        if Path(text).is_file():
            return True
    except (OSError, ValueError):  # a name too long for the file system, or with a NUL
        return False
    return "/" in text or "\\" in text or text.endswith(suffixes)


def overlay_path(name_or_path):
    """A calibration overlay by shipped name (`vtrain-a100`; `diffperf list calibrations`)
    or by path (anything ending in .yaml / .yml, or an existing file)."""
    if _is_path(name_or_path, (".yaml", ".yml")):
        return Path(name_or_path)
    names = calibration_files()
    if name_or_path not in names:
        raise SpecError(f"unknown calibration '{name_or_path}'{closest(str(name_or_path), names)}"
                        f" (shipped: {', '.join(names)}; or give a path to a .yaml file)")
    return names[name_or_path]


def dataset_path(name_or_path):
    """A CSV by shipped dataset name (`vtrain_a100`, `h100_gemm`; `diffperf list datasets`)
    or by path (anything ending in .csv, with a folder, or an existing file)."""
    if _is_path(name_or_path, (".csv",)):
        return Path(name_or_path)
    names = dataset_files()
    if name_or_path not in names:
        raise SpecError(f"unknown dataset '{name_or_path}'{closest(str(name_or_path), names)}"
                        f" (shipped: {', '.join(names)}; or give a path to a .csv file)")
    return names[name_or_path][1]
