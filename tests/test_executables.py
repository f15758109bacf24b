"""The program store (diffperf.executables, cli.cache.KernelStore) runs no foreign code.

Issue 20, point 4: the store used to `pickle.loads` what it found (a planted entry ran
`os.system`), and a valid program stored under another program's key made every later
`predict` fail until the cache was deleted by hand. Now: no pickle anywhere in the package;
an entry is XLA's bytes with JSON metadata checked before it is read (key, size, sha256,
owner, permissions of the files and of the folders); a program that loads but fails to run
is dropped and compiled again.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
from pathlib import Path

import jax
import numpy as np
import pytest

import diffperf
from diffperf import executables
from diffperf.cli.cache import FORMAT, KernelStore
from diffperf.cli.main import main

PACKAGE = Path(diffperf.__file__).resolve().parent
X = np.arange(3.0, dtype=np.float32)
PLUS = jax.jit(lambda v: v + 1.0)
PAIR = jax.jit(lambda v, w: v * w - 2.0)  # another signature: another program


def _fresh():
    """What a new process starts with: no program in the process or in JAX's memory."""
    executables._LOADED.clear()
    jax.clear_caches()


def _entry(store, key, blob):
    """Write KEY.bin and consistent KEY.json (as a store that trusts them would)."""
    store.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    (store.folder / f"{key}.bin").write_bytes(blob)
    (store.folder / f"{key}.json").write_text(json.dumps(dict(
        format=FORMAT, key=key, bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest(),
        jax=jax.__version__)))
    for ext in (".bin", ".json"):
        os.chmod(store.folder / f"{key}{ext}", 0o600)


def test_no_pickle_in_the_package():
    hits = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
            if re.search(r"import (c?pickle|marshal|dill|shelve)\b|\bc?pickle\.\w"
                         r"|from (c?pickle|marshal) |serialize_executable|deserialize_and_load",
                         p.read_text())]
    assert hits == []


def test_store_round_trip_and_metadata(tmp_path):
    store = KernelStore(tmp_path / "k" / "v1", top=tmp_path / "k")
    _fresh()
    assert executables.executable(PLUS, "plus", (X,), {}, store)(X).tolist() == [1, 2, 3]
    (key,) = list(store)
    meta = json.loads((store.folder / f"{key}.json").read_text())
    blob = (store.folder / f"{key}.bin").read_bytes()
    assert meta == dict(format=FORMAT, key=key, bytes=len(blob),
                        sha256=hashlib.sha256(blob).hexdigest(), jax=jax.__version__)
    assert oct(os.stat(store.folder).st_mode & 0o777) == "0o700"
    assert oct(os.stat(store.folder / f"{key}.bin").st_mode & 0o777) == "0o600"
    assert store[key] == blob


def test_a_valid_program_under_another_key_is_dropped_and_rebuilt(tmp_path):
    """PAIR's program stored, with consistent metadata, under PLUS's key (what a search
    kernel over the predict kernel looked like): it loads, fails to run, is deleted, and
    PLUS is compiled again, run and stored; the next process loads the right one."""
    store = KernelStore(tmp_path / "k" / "v1", top=tmp_path / "k")
    _fresh()
    executables.executable(PLUS, "plus", (X,), {}, store)(X)
    (plus_key,) = list(store)
    executables.executable(PAIR, "pair", (X, X), {}, store)(X, X)
    (pair_key,) = [k for k in store if k != plus_key]
    _entry(store, plus_key, store[pair_key])  # the foreign program, checks all pass
    _fresh()
    out = executables.executable(PLUS, "plus", (X,), {}, store)(X)
    assert out.tolist() == [1, 2, 3]
    assert store[plus_key] != store[pair_key]
    _fresh()
    program = executables.executable(PLUS, "plus", (X,), {}, store)
    assert program.unproven == [plus_key]  # loaded from the store this time
    assert program(X).tolist() == [1, 2, 3] and program.unproven == []


def test_the_cli_recovers_from_a_foreign_program(tmp_path, monkeypatch, capsys):
    """The issue's case end to end: the search kernel's bytes under predict's key."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    argv = ["predict", "--model", "gpt-small", "--gpus", "8", "--tp", "2", "--pp", "2",
            "--global-batch", "8", "--json"]
    _fresh()
    assert main(argv) == 0
    want = json.loads(capsys.readouterr().out)["result"]["step_time_s"]
    store = KernelStore()
    (key,) = list(store)
    _fresh()
    executables.executable(PAIR, "pair", (X, X), {}, store)(X, X)
    (other,) = [k for k in store if k != key]
    _entry(store, key, store[other])
    _fresh()
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["result"]["step_time_s"] == want
    assert store[key] != store[other]


def test_a_planted_pickle_is_never_executed(tmp_path):
    """A pickle that would create a file when unpickled, planted with valid metadata under
    the program's key (and under a key of its own): nothing runs it; the program is
    compiled again and stored in its place."""
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    store = KernelStore(tmp_path / "k" / "v1", top=tmp_path / "k")
    _fresh()
    executables.executable(PLUS, "plus", (X,), {}, store)(X)
    (key,) = list(store)
    evil = pickle.dumps(Payload())
    _entry(store, key, evil)
    _entry(store, "jit_other-0", evil)
    _fresh()
    assert executables.executable(PLUS, "plus", (X,), {}, store)(X).tolist() == [1, 2, 3]
    assert not marker.exists()
    assert store[key] != evil
    assert not marker.exists()


@pytest.mark.parametrize("fault", ["hash", "key", "size", "format", "group-writable",
                                   "world-writable-folder", "link", "not-json", "huge-meta"])
def test_entries_failing_a_check_are_not_read(tmp_path, fault):
    """Each check of KernelStore refuses the entry before a byte reaches JAX."""
    store = KernelStore(tmp_path / "k" / "v1", top=tmp_path / "k")
    _fresh()
    executables.executable(PLUS, "plus", (X,), {}, store)(X)
    (key,) = list(store)
    meta_path, bin_path = store.folder / f"{key}.json", store.folder / f"{key}.bin"
    meta = json.loads(meta_path.read_text())
    if fault == "hash":
        bin_path.write_bytes(bin_path.read_bytes()[:-1] + b"\0")
    elif fault in ("key", "size", "format"):
        meta[{"key": "key", "size": "bytes", "format": "format"}[fault]] = (
            meta["bytes"] + 1 if fault == "size" else "x")
        meta_path.write_text(json.dumps(meta))
    elif fault == "group-writable":
        os.chmod(bin_path, 0o620)
    elif fault == "world-writable-folder":
        os.chmod(store.folder, 0o777)
    elif fault == "link":
        real = tmp_path / "elsewhere.bin"
        real.write_bytes(bin_path.read_bytes())
        os.chmod(real, 0o600)
        bin_path.unlink()
        bin_path.symlink_to(real)
    elif fault == "not-json":
        meta_path.write_text("{not json")
    elif fault == "huge-meta":
        meta_path.write_text(json.dumps(dict(meta, pad="x" * 10000)))
    with pytest.raises(KeyError):
        store[key]
    assert store.get(key) is None
    if fault == "world-writable-folder":
        assert not store.trusted()
        store["jit_new-1"] = b"abc"  # nothing written into a folder others can write
        assert not (store.folder / "jit_new-1.bin").exists()
    else:
        assert not meta_path.exists()  # the bad entry is dropped
    _fresh()
    assert executables.executable(PLUS, "plus", (X,), {}, store)(X).tolist() == [1, 2, 3]


def test_keys_are_file_names_only(tmp_path):
    store = KernelStore(tmp_path / "k" / "v1", top=tmp_path / "k")
    for key in ("../escape", "/abs", ".hidden", "a/b", "", "x" * 300):
        store[key] = b"abc"
        assert store.get(key) is None
    assert not list(tmp_path.rglob("*.bin"))


def test_a_program_compiled_without_a_store_is_stored():
    """A program JAX compiled earlier in the process without a store (held in its in-memory
    caches, which skip the persistent cache) still reaches a store asked for later, and a
    new process loads it from there without compiling."""
    _fresh()
    np.testing.assert_array_equal(PLUS(X), X + 1.0)  # compiled, no store
    store = {}
    out = executables.executable(PLUS, "plus", (X,), {}, store)(X)
    np.testing.assert_array_equal(out, X + 1.0)
    assert len(store) == 1
    _fresh()
    program = executables.executable(PLUS, "plus", (X,), {}, store)
    assert program.unproven  # read from the store, not compiled
    np.testing.assert_array_equal(program(X), X + 1.0)
