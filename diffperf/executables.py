"""Compiled programs (the search and sweep kernels, predict's program) kept across
processes: an executable store is a mapping (key ->
bytes) from a hash of everything a program depends on to its serialized executable
(`jax.experimental.serialize_executable`). The caller owns the store and keys it by the version
of the code (the CLI keeps one on disk per hash of the package's source, cli/cache.py); a
later process with the same shapes loads the program instead of tracing, lowering and
compiling it.
"""

from __future__ import annotations

import hashlib
import pickle

import jax
import numpy as np
from jax.experimental import serialize_executable

_LOADED_MAX = 8  # executables kept deserialized in the process (one per kernel shape)

_LOADED: dict = {}  # key -> (deserialized executable, its bytes or None): a warm process
                   # loads each once


def _leaf_key(x) -> str:
    sharding = getattr(x, "sharding", None)
    spec = getattr(sharding, "spec", None)
    return f"{np.shape(x)}:{np.result_type(x)}:{spec}"


def _devices_of(args) -> list:
    """The devices the arguments are placed on, by id (the default device when none is)."""
    found = {d for x in jax.tree.leaves(args) for d in getattr(
        getattr(x, "sharding", None), "device_set", ())}
    return sorted(found, key=lambda d: d.id) or jax.devices()[:1]


def executable_key(name, args, static) -> str:
    """A hash of everything the compiled program depends on besides the code: the kernel's
    name (which says its compiler options), JAX's version, the devices, the arguments'
    tree, shapes, dtypes and shardings, and the static arguments. The code's version is the
    store owner's (the CLI keeps one store per hash of the package's source)."""
    parts = (name, jax.__version__, [(d.platform, d.device_kind, d.id) for d in _devices_of(
        args)], str(jax.tree.structure(args)), [_leaf_key(x) for x in jax.tree.leaves(args)],
        repr(sorted((k, sorted(v) if isinstance(v, frozenset) else v)
                    for k, v in static.items())))
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _persistent_cache_on() -> bool:
    """Whether JAX's persistent compilation cache is on (a cache folder set, the cache
    enabled): only then can `compile()` hand back a program from it (`_loads_and_runs`)."""
    return bool(jax.config.jax_compilation_cache_dir) and bool(
        jax.config.jax_enable_compilation_cache)


def _loads_and_runs(blob, args) -> bool:
    """Whether a serialized executable loads and runs on `args`. XLA:CPU cannot serialize
    again a program that JAX's persistent compilation cache gave back (its kernels are
    missing: 'Function ... not found' when it runs), so such a program is not stored. It
    runs the program once more on `args` (a whole chunk), so `executable` asks it only when
    that cache is on (`_persistent_cache_on`); a program compiled here serializes whole."""
    try:
        loaded = serialize_executable.deserialize_and_load(*pickle.loads(blob),
                                                           execution_devices=_devices_of(args))
        jax.block_until_ready(loaded(*args))
        return True
    except Exception:  # noqa: BLE001 - any failure: do not keep it
        return False


def executable(fn, name, args, static, store):
    """fn (jitted) compiled for `args` (a `jax.stages.Compiled`, called with `*args`): from
    the process, else from `store` (a mapping key -> bytes), else lowered, compiled and put
    in the store. A stored program that no longer loads (another jaxlib) is compiled again.
    Loading a program runs its code: a store must be as trusted as the code itself (the
    CLI's lives in the user's own cache folder, beside JAX's compilation cache). A program
    is stored once compiled; with JAX's persistent compilation cache on, only once it has
    loaded and run from its bytes (`_loads_and_runs`: that cache may have given it back). A
    program already loaded in the process is put in a `store` that lacks it."""
    key = executable_key(name, args, static)
    if key in _LOADED:
        compiled, blob = _LOADED[key]
        if blob is not None and key not in store:
            store[key] = blob
        return compiled
    compiled = None
    blob = store.get(key)
    if blob is not None:
        try:
            compiled = serialize_executable.deserialize_and_load(
                *pickle.loads(blob), execution_devices=_devices_of(args))
        except Exception:  # noqa: BLE001 - a stale or foreign entry: compile it again
            compiled = None
    if compiled is None:
        compiled = fn.lower(*args, **static).compile()
        blob = pickle.dumps(serialize_executable.serialize(compiled))
        if not _persistent_cache_on() or _loads_and_runs(blob, args):
            store[key] = blob
        else:
            blob = None
    if len(_LOADED) >= _LOADED_MAX:
        _LOADED.pop(next(iter(_LOADED)))
    _LOADED[key] = (compiled, blob)
    return compiled
