"""Compiled programs (the search and sweep kernels, predict's program) kept across processes.

An executable store is a mapping (key -> bytes) owned by the caller (the CLI keeps one on disk
per hash of the package's source: cli/cache.py `KernelStore`). What it holds is what JAX's own
persistent compilation cache holds: XLA's serialized executable and its compile time
(`jax._src.compilation_cache`: `executable.serialize()`, compressed), keyed by JAX's cache key
(a hash of the lowered module, the compile options, the devices and JAX's version). No pickle
is involved anywhere: the program's Python-side wrapper (argument and output trees, shardings)
is rebuilt by lowering the function again in the loading process, which costs ~0.3 s for
predict (trace 0.18 s + lower 0.16 s on 2 cores) against ~2.7 s for XLA's compilation
(measured 2026-11-26; first predict of a fresh process from the store: 0.65 s, from a store
that unpickled whole `Compiled` objects: 0.30 s, cold: 2.9 s).

JAX reads the store through its persistent-cache interface (`CacheInterface`), which this
module installs for the duration of one compilation (`_serving`): JAX's public API offers a
cache folder only, without the checks that cli.cache.KernelStore makes before a file is
read (content hash in its JSON metadata, owner, permissions). A program from the store that
fails to run is dropped from the store and compiled again (`_Program`); a store entry that
does not deserialize is compiled again by JAX itself (and overwritten).

Loading a program runs its code: a store must be as trusted as the code itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import warnings

import jax
import numpy as np

_LOADED_MAX = 8  # programs kept in the process (one per kernel shape)

_LOADED: dict = {}  # our key -> _Program: a warm process lowers and loads each once
_LOCK = threading.RLock()


def _leaf_key(x) -> str:
    sharding = getattr(x, "sharding", None)
    spec = getattr(sharding, "spec", None)
    # x.dtype where x has one: NumPy deprecates reading an array-like as a dtype
    dtype = x.dtype if hasattr(x, "dtype") else np.result_type(x)
    return f"{np.shape(x)}:{dtype}:{spec}"


def _devices_of(args) -> list:
    """The devices the arguments are placed on, by id (the default device when none is)."""
    found = {d for x in jax.tree.leaves(args) for d in getattr(
        getattr(x, "sharding", None), "device_set", ())}
    return sorted(found, key=lambda d: d.id) or jax.devices()[:1]


def executable_key(name, args, static) -> str:
    """A hash of everything the compiled program depends on besides the code: the kernel's
    name (which says its compiler options), JAX's version, the devices, the arguments'
    tree, shapes, dtypes and shardings, and the static arguments: the key of the programs
    kept in the process (`_LOADED`)."""
    parts = (name, jax.__version__, [(d.platform, d.device_kind, d.id) for d in _devices_of(
        args)], str(jax.tree.structure(args)), [_leaf_key(x) for x in jax.tree.leaves(args)],
        repr(sorted((k, sorted(v) if isinstance(v, frozenset) else v)
                    for k, v in static.items())))
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _cache_module():
    """jax._src.compilation_cache when it has the hooks `_serving` swaps (else None: the
    program is compiled without a store)."""
    try:
        from jax._src import compilation_cache as cc
        from jax._src.compilation_cache_interface import CacheInterface
    except ImportError:  # pragma: no cover - another JAX layout
        return None, None
    names = ("_cache", "_cache_initialized", "_cache_checked", "_cache_used")
    return (cc, CacheInterface) if all(hasattr(cc, n) for n in names) else (None, None)


def _adapter(store, read=True):
    """JAX's CacheInterface over a store: `get` / `put` of JAX's cache key; remembers what
    it handed out (`hits`) and what it was given (`puts`)."""
    _, CacheInterface = _cache_module()

    class StoreCache(CacheInterface):
        def __init__(self):
            self._path = None
            self.hits, self.puts = [], []

        def get(self, key):
            if not read:
                return None
            try:
                value = store.get(key)
            except Exception:  # noqa: BLE001 - an unreadable entry is a miss
                value = None
            if value is not None:
                self.hits.append((key, value))
            return value

        def put(self, key, value):
            self.puts.append((key, value))
            try:
                store[key] = value
            except Exception:  # noqa: BLE001 - a store that cannot keep it: compile later
                pass

    return StoreCache()


@contextlib.contextmanager
def _serving(adapter):
    """JAX's persistent compilation cache served by `adapter` for the block (every size and
    compile time kept), then restored as it was; warnings of a bad entry (JAX compiles it
    again) are not shown."""
    cc, _ = _cache_module()
    names = ("_cache", "_cache_initialized", "_cache_checked", "_cache_used")
    with _LOCK:
        saved = {n: getattr(cc, n) for n in names}
        min_s = jax.config.jax_persistent_cache_min_compile_time_secs
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        cc._cache, cc._cache_initialized, cc._cache_checked, cc._cache_used = (
            adapter, True, True, True)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield adapter
        finally:
            for n, v in saved.items():
                setattr(cc, n, v)
            jax.config.update("jax_persistent_cache_min_compile_time_secs", min_s)


def serve_globally(store) -> bool:
    """Every later compilation of the process reads and writes `store` (JAX's persistent
    compilation cache, with the store's checks; programs that take >= 1 s to compile, JAX's
    default); False when this JAX has no such hook."""
    cc, _ = _cache_module()
    if cc is None:
        return False
    with _LOCK:
        cc._cache, cc._cache_initialized, cc._cache_checked, cc._cache_used = (
            _adapter(store), True, True, True)
    return True


def _compile(fn, args, static, store, read=True):
    """(compiled, adapter): fn lowered for `args` and compiled, or loaded from `store`. A
    program from the store that JAX cannot wrap (another program's signature) is dropped
    from the store and compiled again, the store bypassed."""
    lowered = fn.lower(*args, **static)
    if _cache_module()[0] is None or store is None:
        return lowered.compile(), None
    adapter = _adapter(store, read)
    try:
        with _serving(adapter):
            compiled = lowered.compile()
            if not adapter.hits and not adapter.puts and _forget_in_memory_programs():
                # JAX handed back a program it compiled earlier in this process without a
                # store (its in-memory caches skip the persistent one: nothing read or put).
                # Compiled once more, so that the store gets it as `executable` promises;
                # compiler_options={} (no option added) keeps JAX from answering with the
                # program the lowering itself holds.
                compiled = lowered.compile(compiler_options={})
            return compiled, adapter
    except Exception:  # noqa: BLE001 - only a program read from the store is suspect
        if not adapter.hits:
            raise
        _drop(store, [k for k, _ in adapter.hits])
        return _compile(fn, args, static, store, read=False)


def _forget_in_memory_programs() -> bool:
    """Empty JAX's in-memory cache of compiled programs (the one `Lowered.compile` reads
    before the persistent cache; jitted functions keep the programs they dispatch to); False
    where this JAX has no such hook."""
    try:
        from jax._src.interpreters import pxla
    except ImportError:  # pragma: no cover - another JAX layout
        return False
    clear = getattr(pxla, "clear_in_memory_compilation_cache", None)
    if clear is None:  # pragma: no cover
        return False
    clear()
    return True


def _drop(store, keys) -> None:
    """Delete `keys` from the store and JAX's in-memory caches (which hold what it loaded)."""
    for key in keys:
        with contextlib.suppress(Exception):
            del store[key]
    jax.clear_caches()


class _Program:
    """A compiled program; one that came from a store is checked on its first call: if it
    fails to run (another program stored under this key, a broken entry), the entry is
    dropped from the store and the program compiled again, the store bypassed."""

    def __init__(self, fn, args, static, store):
        self.fn, self.static, self.store = fn, static, store
        self.compiled, adapter = _compile(fn, args, static, store)
        self.entry = None   # (JAX's key, bytes): put in a store that lacks it
        self.unproven = []  # JAX keys read from the store, not yet run
        if adapter is not None:
            self.unproven = [k for k, _ in adapter.hits]
            got = adapter.puts or adapter.hits
            self.entry = got[-1] if got else None

    def __call__(self, *args):
        if not self.unproven:
            return self.compiled(*args)
        try:
            out = self.compiled(*args)
            jax.block_until_ready(out)
        except Exception:  # noqa: BLE001 - a foreign or broken program: drop, compile again
            _drop(self.store, self.unproven)
            self.compiled, adapter = _compile(self.fn, args, self.static, self.store,
                                              read=False)
            self.entry = adapter.puts[-1] if adapter is not None and adapter.puts else None
            self.unproven = []
            return self.compiled(*args)
        self.unproven = []
        return out


def executable(fn, name, args, static, store):
    """fn (jitted) compiled for `args`, as a callable taking `*args`: from the process, else
    loaded from `store` (a mapping JAX cache key -> bytes) after lowering, else compiled
    and put in the store. A stored program that does not load (another jaxlib, a damaged
    entry) is compiled again; one that loads but fails to run is dropped and compiled again
    (`_Program`). A program already in the process is put in a `store` that lacks it."""
    key = executable_key(name, args, static)
    with _LOCK:
        program = _LOADED.get(key)
    if program is not None:
        if program.entry is not None and program.entry[0] not in store:
            with contextlib.suppress(Exception):
                store[program.entry[0]] = program.entry[1]
        return program
    program = _Program(fn, args, static, store)
    with _LOCK:
        if len(_LOADED) >= _LOADED_MAX:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = program
    return program
