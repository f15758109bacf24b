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
import json
import os
import re
import stat
from collections.abc import MutableMapping
from pathlib import Path

import diffperf


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "diffperf"


def enable_compilation_cache() -> None:
    """Keep XLA's compiled programs on disk: a later run skips XLA compilation. JAX's
    persistent compilation cache, served by a KernelStore (checked before a program is
    loaded; JAX's own cache folder makes no such checks) in cache_dir()/kernels/CODE_VERSION;
    a process-wide setting, so in-process callers such as tests pass --no-cache."""
    from diffperf.executables import serve_globally

    serve_globally(KernelStore())


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


_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}$")  # JAX's cache keys: jit_NAME-HASH
_META_MAX = 4096  # bytes of a metadata file
FORMAT = "diffperf-executable-1"


def _owned_private(st) -> bool:
    """A path's stat: owned by this user (where there are users) and writable by no one else."""
    uid = getattr(os, "getuid", None)
    return (uid is None or st.st_uid == uid()) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


class KernelStore(MutableMapping):
    """Serialized executables (XLA's bytes, as JAX's persistent compilation cache keeps them:
    diffperf.executables) as files KEY.bin in cache_dir()/kernels/CODE_VERSION, each with
    KEY.json: plain metadata {"format", "key", "bytes", "sha256", "jax"}. Nothing is
    unpickled. Before a program is handed out:

    - the folder and every folder from cache_dir() down to it are directories (not links)
      owned by this user and writable by no one else (else the store is not used at all:
      every read misses, nothing is written);
    - KEY.json and KEY.bin are regular files (not links) owned by this user, writable by no
      one else; the metadata names this key, this format, the file's size and its sha256,
      which the bytes must match (else the entry is a miss and is deleted).

    A write goes through a temporary file and a rename (the program first, its metadata
    last), so a reader never sees half an entry, and a write that fails (read-only home,
    full disk) only costs the next run a compilation.
    """

    def __init__(self, folder=None, top=None):
        self.folder = Path(folder) if folder else cache_dir() / "kernels" / code_version()
        self.top = Path(top) if top else (cache_dir() if folder is None else self.folder)

    def _path(self, key, ext=".bin") -> Path:
        if not isinstance(key, str) or not _KEY.match(key):
            raise KeyError(key)
        return self.folder / f"{key}{ext}"

    def trusted(self) -> bool:
        """The folder and its parents up to `top` exist, are ours and private (see class)."""
        try:
            chain = [self.folder] + [p for p in self.folder.parents
                                     if self.top == p or self.top in p.parents]
            for p in chain:
                st = os.lstat(p)
                if not stat.S_ISDIR(st.st_mode) or not _owned_private(st):
                    return False
        except (OSError, ValueError):
            return False
        return True

    @staticmethod
    def _read(path: Path, limit=None) -> bytes:
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(path, flags)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not _owned_private(st):
                raise PermissionError(path)  # not a private file of this user
            if limit is not None and st.st_size > limit:
                raise ValueError(path)  # too large to be metadata
            with os.fdopen(fd, "rb") as fh:
                fd = None
                return fh.read()
        finally:
            if fd is not None:
                os.close(fd)

    def __getitem__(self, key):
        meta_path, bin_path = self._path(key, ".json"), self._path(key)
        if not self.trusted():
            raise KeyError(key)
        try:
            meta = json.loads(self._read(meta_path, _META_MAX))
            blob = self._read(bin_path)
        except FileNotFoundError:
            raise KeyError(key) from None
        except (OSError, ValueError):
            self._drop(key)
            raise KeyError(key) from None
        ok = (isinstance(meta, dict) and meta.get("format") == FORMAT and meta.get("key") == key
              and meta.get("bytes") == len(blob)
              and meta.get("sha256") == hashlib.sha256(blob).hexdigest())
        if not ok:
            self._drop(key)
            raise KeyError(key)
        return blob

    def __setitem__(self, key, value):
        from diffperf.cli.output import atomic_path
        from diffperf.errors import SpecError

        import jax

        meta = json.dumps({"format": FORMAT, "key": key, "bytes": len(value),
                           "sha256": hashlib.sha256(value).hexdigest(), "jax": jax.__version__})
        try:
            bin_path, meta_path = self._path(key), self._path(key, ".json")
            self.top.mkdir(mode=0o700, parents=True, exist_ok=True)
            for p in reversed([self.folder, *self.folder.parents]):
                if self.top in p.parents:
                    p.mkdir(mode=0o700, exist_ok=True)
            if not self.trusted():
                return
            for path, data in ((bin_path, value), (meta_path, meta.encode())):
                with atomic_path(path, mode=0o600) as tmp, open(tmp, "wb") as fh:
                    fh.write(data)
        except (OSError, SpecError, KeyError):
            pass

    def _drop(self, key):
        for ext in (".json", ".bin"):
            try:
                self._path(key, ext).unlink(missing_ok=True)
            except (OSError, KeyError):
                pass

    def __delitem__(self, key):
        self._drop(key)

    def __contains__(self, key):
        try:  # without reading the program (Mapping's default)
            return self.trusted() and self._path(key, ".json").exists()
        except KeyError:
            return False

    def __iter__(self):
        return (p.stem for p in self.folder.glob("*.json"))

    def __len__(self):
        return sum(1 for _ in self)


def kernel_store(args):
    """The on-disk store of compiled programs (KernelStore), or None with --no-cache: a
    later run loads a program instead of compiling it (diffperf.executables)."""
    return None if getattr(args, "no_cache", False) else KernelStore()
