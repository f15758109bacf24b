"""Rendering and writing: rich tables, JSON, atomic file writes."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from diffperf.errors import SpecError

console = Console()
err_console = Console(stderr=True)


def fmt(x, digits=4) -> str:
    """A number with `digits` significant digits."""
    x = float(x)
    return f"{x:.{digits}g}"


def table(title, columns, rows) -> Table:
    """A rich table; numeric columns right-aligned (headers carry their units)."""
    t = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*[str(v) for v in r])
    return t


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=float) + "\n")


def write_atomic(path, text: str, force: bool) -> None:
    """Write `text` to `path` through a temporary file and a rename, so an interrupted run
    never leaves a truncated file; refuse to replace an existing file without force."""
    path = Path(path)
    if path.exists() and not force:
        raise SpecError(f"{path} exists; pass --force to overwrite it")
    if not path.parent.exists():
        raise SpecError(f"{path}: folder {path.parent} does not exist")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
