"""Compiled code kept on disk between runs: JAX's persistent compilation cache, and the search
kernels' serialized executables (search.kernel.executable), under ~/.cache/diffperf.

The executables live in a folder named by a hash of the package's source and JAX's version, so
an edit to any module, or another JAX, starts a fresh folder (old ones can be deleted).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import MutableMapping
from pathlib import Path

import diffperf


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "diffperf"


def enable_compilation_cache() -> None:
    """Keep XLA's compiled programs on disk: a later run skips XLA compilation (JAX's
    persistent compilation cache; a process-wide setting, so in-process callers such as
    tests pass --no-cache)."""
    import jax

    jax.config.update("jax_compilation_cache_dir", str(cache_dir() / "jax"))


def code_version() -> str:
    """sha256 of every module of the package (path and text) and the JAX version."""
    import jax

    root = Path(diffperf.__file__).resolve().parent
    h = hashlib.sha256(jax.__version__.encode())
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


class KernelStore(MutableMapping):
    """Serialized executables as files KEY.bin in cache_dir()/kernels/CODE_VERSION; a write
    goes through a temporary file and a rename, so a reader never sees half a file, and a
    write that fails (read-only home, full disk) only costs the next run a compilation."""

    def __init__(self, folder=None):
        self.folder = Path(folder) if folder else cache_dir() / "kernels" / code_version()

    def _path(self, key) -> Path:
        return self.folder / f"{key}.bin"

    def __getitem__(self, key):
        try:
            return self._path(key).read_bytes()
        except OSError:
            raise KeyError(key) from None

    def __setitem__(self, key, value):
        from diffperf.cli.output import atomic_path
        from diffperf.errors import SpecError

        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with atomic_path(self._path(key)) as tmp, open(tmp, "wb") as fh:
                fh.write(value)
        except (OSError, SpecError):
            pass

    def __delitem__(self, key):
        self._path(key).unlink(missing_ok=True)

    def __iter__(self):
        return (p.stem for p in self.folder.glob("*.bin"))

    def __len__(self):
        return sum(1 for _ in self)
