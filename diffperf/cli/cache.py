"""Compiled code kept on disk between runs: JAX's persistent compilation cache, and the
serialized executables of the search and sweep kernels and of predict (diffperf.executables),
under ~/.cache/diffperf.

The executables live in a folder named by a hash of the package's source, JAX's version and
the host's CPU (XLA:CPU compiles for the instruction set it runs on: a home folder shared by
different machines must not hand one's program to the other), so an edit to any module,
another JAX or another CPU starts a fresh folder (old ones can be deleted).
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


def host_cpu() -> str:
    """The host's CPU as XLA:CPU compiles for it: machine, model name and feature flags
    (the first processor of /proc/cpuinfo where there is one; platform's names elsewhere)."""
    import platform

    text = ""
    try:
        with open("/proc/cpuinfo") as fh:
            text = fh.read().split("\n\n")[0]
    except OSError:
        pass
    lines = [ln for ln in text.splitlines()
             if ln.split(":")[0].strip() in ("model name", "flags", "Features", "CPU part")]
    return "\n".join([platform.machine(), platform.processor()] + lines)


def code_version() -> str:
    """sha256 of every module of the package (path and text), the JAX version and the host's
    CPU (host_cpu)."""
    import jax

    root = Path(diffperf.__file__).resolve().parent
    h = hashlib.sha256(jax.__version__.encode())
    h.update(host_cpu().encode())
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

    def __contains__(self, key):
        return self._path(key).exists()  # without reading the program (Mapping's default)

    def __iter__(self):
        return (p.stem for p in self.folder.glob("*.bin"))

    def __len__(self):
        return sum(1 for _ in self)


def kernel_store(args):
    """The on-disk store of compiled programs (KernelStore), or None with --no-cache: a
    later run loads a program instead of compiling it. Commands that use it leave JAX's
    persistent compilation cache off: a program that cache gives back cannot be serialized
    again on the CPU (diffperf.executables._loads_and_runs), so the store would stay empty."""
    return None if getattr(args, "no_cache", False) else KernelStore()
