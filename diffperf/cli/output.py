"""Rendering and writing: rich tables, JSON, atomic file writes."""

from __future__ import annotations

import json
import math
import os
import stat
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.table import Table

from diffperf.errors import SpecError

console = Console(markup=False)  # names from files are text, never markup ('[red]')
err_console = Console(stderr=True)  # its one markup: main's '[red]error:[/red]'; the
                                    # message is escaped


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


def _non_finite(obj, path="") -> str | None:
    """The path of the first NaN or infinite number in a JSON-ready object, or None."""
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        try:
            bad = isinstance(obj, (int, float)) or hasattr(obj, "__float__")
            return path or "value" if bad and not math.isfinite(float(obj)) else None
        except (TypeError, ValueError, OverflowError):
            return None
    for k, v in items:
        found = _non_finite(v, f"{path}.{k}" if path else str(k))
        if found:
            return found
    return None


def print_json(obj) -> None:
    """Strict JSON (RFC 8259: no NaN or Infinity): a non-finite number is a SpecError naming
    its path, never printed (a command replaces an undefined value by null with a note)."""
    bad = _non_finite(obj)
    if bad:
        raise SpecError(f"--json: {bad} is not a finite number; nothing was printed")
    sys.stdout.write(json.dumps(obj, indent=2, default=float, allow_nan=False) + "\n")


def check_writable(path, force: bool) -> None:
    """Refuse, before any work, an output path that exists (without force), is a folder, or
    lies in a folder that does not exist."""
    path = Path(path)
    if path.is_dir():
        raise SpecError(f"{path} is a folder; give a file name")
    if path.is_symlink() and not path.exists() and not force:
        raise SpecError(f"{path} is a link to a missing file ({os.readlink(path)}); pass "
                        f"--force to write that file")
    if path.exists() and not force:
        raise SpecError(f"{path} exists; pass --force to overwrite it")
    target = _through_links(path)
    if not target.parent.is_dir():
        raise SpecError(f"{path}: folder {target.parent} does not exist")


def _through_links(path: Path) -> Path:
    """The file a path names: a symbolic link is written through (its target replaced, the
    link kept), never replaced by a file of its own."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _read_umask() -> int:
    """The process's umask (read once, at import: setting it to read it is not thread-safe)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


@contextmanager
def atomic_path(path, suffix=".tmp", mode=None):
    """A temporary file beside `path` for the block to write; on success it replaces `path`
    (a rename: an interrupted run never leaves a truncated file) with the permissions of the
    file it replaces, or those a new file gets under the process's umask (mkstemp alone
    makes it private), or `mode` when given; on failure it is removed, and an OSError
    becomes a SpecError naming the path. A symbolic link is written through (`_through_links`)."""
    path = _through_links(Path(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    except OSError as err:
        raise SpecError(f"{path}: cannot write ({err.strerror or err})") from None
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, mode if mode is not None else stat.S_IMODE(path.stat().st_mode)
                 if path.exists() else 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise SpecError(f"{path}: cannot write ({err.strerror or err})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path, text: str, force: bool) -> None:
    """Write `text` to `path` atomically (`atomic_path`); refuse to replace an existing file
    without force."""
    check_writable(path, force)
    with atomic_path(path) as tmp, open(tmp, "w") as fh:
        fh.write(text)
