"""Fuzzing the boundary: thousands of generated bad inputs through the loaders and the CLI.

STYLE.md section 5: a bad input gives a `SpecError` naming the field, the value and what is
allowed, and the CLI turns it into one `error:` line and exit code 2, with no traceback.
Anything else is a crash. Each family of inputs below is generated deterministically
(`random.Random(seed)`) from the shipped files:

- model and system YAML: keys deleted, renamed (one-letter typos), added; values replaced by
  NaN, +-inf, negatives, zero, huge numbers, strings, lists, mappings, booleans, null;
  structure broken (tiers); texts truncated, spliced with junk bytes or YAML oddities, binary
  files, deep nesting;
- calibration overlays (`apply_overlay`, mappings and files);
- Hugging Face config.json dicts (Llama, Mixtral, GPT-2, Qwen2, DeepSeek-V2) and texts;
- runs CSVs from data/h100_single_gpu.csv: columns dropped or misspelt, blank or
  non-numeric cells, duplicate ids, bad enums, invalid layouts, truncated and binary files;
- CLI argument vectors (`diffperf.cli.main.main`, in process) that fail before prediction.

The oracle, per input: success, or SpecError with a one-line message that names the mutated
field. A successful load is then predicted (one jitted vmap for all of them) and every leaf
of the Result must be finite. Anything else is counted as a crash with a signature (the
exception and the diffperf frame that raised it) and a reproducer; each test prints its
counts (`pytest -s`) and asserts zero crashes, listing every distinct signature.

An input that uses more than 2 s of CPU (a CLI run: 20 s) is stopped (SIGPROF) and counted
as a hang; one that sits blocked (no CPU) is stopped by a wall-clock backstop WALL_FACTOR
times longer (SIGALRM). CPU time, not wall time, so that a machine slowed by other jobs does
not turn a slow input into a "hang"; each family reports its slowest input's CPU and wall.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import dataclasses
import io
import json
import math
import os
import random
import re
import signal
import time
import traceback
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml

import diffperf
import diffperf.load
from diffperf import (Parallel, SpecError, Training, apply_overlay, load_model, load_runs,
                      load_system)
from diffperf.cli.main import main
from diffperf.predict import predict_step
from diffperf.search.kernel import _CPU_QUICK_OPTIONS
from diffperf.specs.batch import stack
from diffperf.load import (_FRACTIONS, _HF_UNSUPPORTED, EFFICIENCY_KEYS, MODEL_KEYS,
                           RUN_REQUIRED, SYSTEM_KEYS, TIER_KEYS,
                           model_from_dict, system_from_dict)
from diffperf.specs.system import Efficiency

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
RUNS_CSV = REPO / "data" / "h100_single_gpu.csv"  # shipped in the repository (data/README.md)
TIME_LIMIT_S = 2.0  # CPU seconds per input (process time: every thread, user + system)
# The wall-clock backstop for an input that hangs without using CPU (blocked on a lock, a
# pipe, a sleep): WALL_FACTOR x the CPU limit. A busy loop is caught by the CPU limit at the
# same point as before on an idle machine (one thread: CPU = wall); the backstop only has to
# stay above the wall time of a slow input on a loaded machine. Measured on 2 shared cores
# (docs/reliability.md, Session 16): the slowest CLI input (the first predict, which compiles)
# used 9.5-12.3 s of CPU and 15-28 s of wall time, past the old 20 s wall limit; every loader
# input at most 0.3 s of CPU.
WALL_FACTOR = 30
PACKAGE = Path(diffperf.__file__).resolve().parent

MODEL_FILES = sorted((CONFIGS / "models").glob("*.yaml"))
SYSTEM_FILES = sorted((CONFIGS / "systems").glob("*.yaml"))

# Keys whose value must be a finite number > 0 (NaN, inf, 0 and negatives must be refused).
MODEL_POSITIVE = ("num_layers", "hidden", "ffn_hidden", "num_heads", "num_kv_heads",
                  "head_dim", "vocab", "seq_len", "moe_capacity_factor")
SYSTEM_POSITIVE = ("matmul_TFLOPs", "matmul_fp32_TFLOPs", "vector_TFLOPs",
                   "hbm_bandwidth_GBps", "hbm_capacity_GiB", "power_W")
TIER_POSITIVE = ("domain_size", "bandwidth_GBps")
EFF_POSITIVE = tuple(_FRACTIONS) + tuple(getattr(diffperf.load, "_POSITIVE", (
    "mm_half_dim", "mm_exponent", "floor_pnorm")))

NAN, INF = float("nan"), float("inf")
# Replacements for a number: each must be refused where a positive number belongs.
NON_POSITIVE = (NAN, INF, -INF, -1, -1e-9, 0, 0.0, "nan", "inf", "-5")
# Other bad or odd values: refused with the field named, or accepted (then predicted).
ODD = ("abc", "", " ", [1, 2], [], {"a": 1}, {}, True, False, None, "1e400", 10**400, 1e300,
       1e-300, 0.5, 1.5, "12", "0x10", "1_000", "１２", 2**53 + 1, -0.0, "true", "null")
NUMBER_SCALES = (1e-6, 1e-3, 0.5, 1.001, 3.0, 1e3, 1e6)


# ------------------------------------------------------------------------------------ oracle

class Hang(Exception):
    """Raised by the timers of `_time_limit`: an input used more than its CPU limit, or sat
    WALL_FACTOR times that long on the wall clock."""


@contextlib.contextmanager
def _time_limit(seconds, spent=None, label=""):
    """Stop the block with Hang after `seconds` of process CPU time (ITIMER_PROF: user and
    system time of every thread) or WALL_FACTOR x `seconds` of wall time (ITIMER_REAL), the
    backstop for a hang that uses no CPU. `spent`: a list that gets (cpu_s, wall_s, label)."""
    def on_cpu(signum, frame):
        raise Hang(f"used more than {seconds} s of CPU")

    def on_wall(signum, frame):
        raise Hang(f"still running after {WALL_FACTOR * seconds} s (wall)")

    before = signal.signal(signal.SIGPROF, on_cpu), signal.signal(signal.SIGALRM, on_wall)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    signal.setitimer(signal.ITIMER_PROF, seconds)
    signal.setitimer(signal.ITIMER_REAL, WALL_FACTOR * seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGPROF, before[0])
        signal.signal(signal.SIGALRM, before[1])
        if spent is not None:
            spent.append((time.process_time() - cpu0, time.perf_counter() - wall0, label))


def _where(err) -> str:
    """'file:line (function)' of the innermost diffperf frame of a traceback (else the last)."""
    frames = traceback.extract_tb(err.__traceback__)
    ours = [f for f in frames if Path(f.filename).resolve().is_relative_to(PACKAGE)]
    f = (ours or frames)[-1]
    path = Path(f.filename)
    name = path.relative_to(PACKAGE.parent) if path.resolve().is_relative_to(PACKAGE) else path.name
    return f"{name}:{f.lineno} ({f.name})"


@dataclasses.dataclass
class Tally:
    family: str
    tried: int = 0
    loaded: int = 0
    refused: int = 0
    predicted: int = 0
    crashes: list = dataclasses.field(default_factory=list)  # (signature, reproducer)
    spent: list = dataclasses.field(default_factory=list)  # (cpu_s, wall_s, input) each

    def crash(self, signature, reproducer):
        self.crashes.append((signature, _short(reproducer)))

    def attempt(self, fn, reproducer, names=()):
        """fn() -> result, or None after a SpecError; anything else is a crash. A SpecError
        must be one line and contain one of `names` (a tuple: the mutated field, or a rule's
        words), or every one of them (a list)."""
        self.tried += 1
        try:
            with _time_limit(TIME_LIMIT_S, self.spent, reproducer):
                result = fn()
        except SpecError as err:
            self.refused += 1
            message = str(err)
            if "\n" in message or "\r" in message or not message.strip():
                self.crash("SpecError message is not one line", f"{reproducer} -> {message!r}")
            elif names and isinstance(names, list):
                missing = [n for n in names if str(n) not in message]
                if missing:
                    self.crash(f"SpecError does not say {missing[0]!r}",
                               f"{reproducer} -> {message!r}")
            elif names and not any(str(n) in message for n in names):
                self.crash(f"SpecError does not name the field {names[0]!r}",
                           f"{reproducer} -> {message!r}")
            return None
        except Hang:
            self.crash(f"hang (> {TIME_LIMIT_S} s of CPU)", reproducer)
            return None
        except Exception as err:  # noqa: BLE001 - the point: anything else is a crash
            self.crash(f"{type(err).__name__} at {_where(err)}", f"{reproducer} -> {err!r}")
            return None
        self.loaded += 1
        return result

    def must_refuse(self, result, reproducer, why):
        if result is not None:
            self.crash(f"accepted: {why}", reproducer)

    def report(self) -> str:
        sigs = {}
        for sig, rep in self.crashes:
            sigs.setdefault(sig, []).append(rep)
        lines = [f"fuzz {self.family}: {self.tried} inputs, {self.refused} refused (SpecError), "
                 f"{self.loaded} loaded, {self.predicted} predicted, {len(self.crashes)} crashes"]
        if self.spent:
            cpu, wall, what = max(self.spent, key=lambda s: s[0])
            most = max(w for _, w, _ in self.spent)
            lines[0] += (f"; slowest input {cpu:.2f} s CPU, {wall:.2f} s wall "
                         f"({_short(str(what), 80)}); most wall {most:.2f} s")
        for sig, reps in sorted(sigs.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"  {len(reps):5d} x {sig}\n          e.g. {reps[0]}")
        return "\n".join(lines)


TOTALS: list[Tally] = []


@pytest.fixture(scope="module", autouse=True)
def _grand_total():
    yield
    tried = sum(t.tried for t in TOTALS)
    crashes = sum(len(t.crashes) for t in TOTALS)
    print(f"\nfuzz total: {tried} inputs tried, {crashes} crashes "
          f"({', '.join(f'{t.family} {t.tried}/{len(t.crashes)}' for t in TOTALS)})")


def _finish(tally: Tally, minimum: int):
    TOTALS.append(tally)
    print("\n" + tally.report())
    assert tally.tried >= minimum, tally.report()
    assert not tally.crashes, tally.report()


def _short(x, n=300) -> str:
    s = x if isinstance(x, str) else repr(x)
    return s if len(s) <= n else s[:n] + f"... ({len(s)} chars)"


# --------------------------------------------------------------- predicting what loaded

BATCH = 64
# Compiled with predict's quick XLA:CPU options (search.kernel._CPU_QUICK_OPTIONS, those of
# api._predict_jit_cpu and predict_batch): the flavour the library runs on CPU, and a quicker
# compile than XLA's defaults.
_PREDICT = jax.jit(jax.vmap(predict_step), **(
    dict(compiler_options=_CPU_QUICK_OPTIONS) if jax.default_backend() == "cpu" else {}))
_SMALL = dict(tp=2, pp=2, dp=4, micro_batch=1, global_batch=8, zero_stage=1)


def _floats(tree):
    dtype = np.dtype(jax.numpy.result_type(float))
    with np.errstate(over="ignore"):  # 1e300 -> inf in float32: the check below reports it
        return jax.tree.map(lambda x: np.asarray(x, dtype=dtype), tree)


def _predict_all(tally: Tally, configs):
    """Predict (model, parallel, system, training, reproducer) tuples, BATCH at a time with
    one compilation, those that pass `check_inputs` (predict's first step; the others are
    refusals); every leaf of every Result must be finite (an invalid entry's step is +inf).
    Systems whose number of tiers differs from the shipped two would need another
    compilation and are skipped."""
    from diffperf.specs.validate import check_inputs

    configs = [c for c in configs if len(c[2].tiers) == 2]
    kept = []
    for c in configs:  # what `predict` checks first (e.g. a job beyond the last tier)
        try:
            check_inputs(*c[:4])
        except SpecError:
            tally.refused += 1
            continue
        kept.append(c)
    configs = kept
    for start in range(0, len(configs), BATCH):
        chunk = configs[start:start + BATCH]
        padded = chunk + [chunk[-1]] * (BATCH - len(chunk))
        args = [stack([c[i] for c in padded]) for i in range(4)]
        result = _PREDICT(*_floats(args))
        leaves = jax.tree_util.tree_flatten_with_path(result)[0]
        for j, cfg in enumerate(chunk):
            tally.predicted += 1
            bad = [jax.tree_util.keystr(p) for p, v in leaves if not np.isfinite(np.asarray(v)[j])]
            if bad:
                step = float(np.asarray(result.step_time_s)[j])
                tally.crash(f"non-finite result after a successful load: {', '.join(bad[:3])}",
                            f"{cfg[4]} (step_time_s={step})")


_BASE_MODEL = None


def _base_model():
    global _BASE_MODEL
    if _BASE_MODEL is None:
        _BASE_MODEL = load_model("gpt-small")
    return _BASE_MODEL


def _model_config(model, reproducer):
    """Any valid model runs on one device; a second layout needs the model to divide."""
    return (model, Parallel(), load_system("h100-sxm-80gb"), Training(), reproducer)


def _system_config(system, reproducer):
    # gpt-small on 16 devices: TP pairs, 2 stages, DP 4 across the inner domain of 8.
    return (_base_model(), Parallel(**_SMALL), system, Training(), reproducer)


# ------------------------------------------------------------------------------ mutations

def _typos(key, rng, n=2):
    """One-edit misspellings of key (drop, swap, double, replace a letter)."""
    out = set()
    for _ in range(10 * n):
        i = rng.randrange(len(key))
        kind = rng.randrange(4)
        if kind == 0:
            t = key[:i] + key[i + 1:]
        elif kind == 1 and i < len(key) - 1:
            t = key[:i] + key[i + 1] + key[i] + key[i + 2:]
        elif kind == 2:
            t = key[:i] + key[i] + key[i:]
        else:
            t = key[:i] + rng.choice("abcdefghijklmnopqrstuvwxyz_") + key[i + 1:]
        if t != key:
            out.add(t)
        if len(out) >= n:
            break
    return sorted(out)


def _label(v) -> str:
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 10**30:
        return f"10**{len(str(abs(v))) - 1}"
    return repr(v)


def _value_mutations(value, rng):
    """(label, new value) for a field's value."""
    out = [(_label(v), v) for v in NON_POSITIVE + ODD]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        for s in NUMBER_SCALES:
            v = value * s
            v = int(v) if isinstance(value, int) and v == int(v) else v
            out.append((f"{value!r} x {s:g}", v))
        if isinstance(value, int):
            out += [(f"{value} + 1", value + 1), (f"{value} - 1", value - 1)]
    return out


def _dict_mutations(d, rng, allowed, positive, where=""):
    """(label, mutated dict, field names the error must mention, must_refuse) for a mapping."""
    out = []
    for key in list(d):
        if key == "sources":
            continue
        m = dict(d)
        del m[key]
        out.append((f"delete {where}{key}", m, (key,), False))
        for typo in _typos(key, rng):
            if typo in allowed:
                continue
            m = {(typo if k == key else k): v for k, v in d.items()}
            out.append((f"rename {where}{key} -> {typo}", m,
                        [f"unknown key '{typo}'", "did you mean '"], True))
        for label, v in _value_mutations(d[key], rng):
            m = dict(d)
            m[key] = v
            refuse = key in positive and label in {_label(x) for x in NON_POSITIVE}
            out.append((f"{where}{key} = {label}", m, (key,), refuse))
    for extra in ("unknown_field", rng.choice(list(allowed)).upper(), "efficency", "tier"):
        if extra not in allowed:
            m = dict(d)
            m[extra] = 1
            out.append((f"add {where}{extra}", m, (f"unknown key '{extra}'",), True))
    return out


def _lean(path) -> dict:
    d = yaml.safe_load(Path(path).read_text())
    d.pop("sources", None)
    return d


def _run_dict_family(tally, bases, mutate, load, predict_config, limit, rng):
    """Generate mutations of each base dict, load them, predict what loaded."""
    loaded = []
    cases = [(name, m) for name, base in bases for m in mutate(base, rng)]
    rng.shuffle(cases)
    for name, (label, d, names, refuse) in cases[:limit]:
        reproducer = f"{name}: {label}"
        result = tally.attempt(lambda d=d: load(d), reproducer, names)
        if refuse:
            tally.must_refuse(result, reproducer, "a value that must be refused")
        if result is not None:
            loaded.append(predict_config(result, reproducer))
    _predict_all(tally, loaded)


# ------------------------------------------------------------------------------ families

def test_fuzz_model_dicts():
    """Mutated model mappings of every shipped model through `model_from_dict` (what
    `load_model` calls after parsing the YAML)."""
    rng = random.Random(1)
    tally = Tally("model YAML mappings")
    bases = [(p.name, _lean(p)) for p in MODEL_FILES]
    _run_dict_family(
        tally, bases, lambda d, r: _dict_mutations(d, r, MODEL_KEYS, MODEL_POSITIVE),
        lambda d: model_from_dict(d, "model.yaml"), _model_config, 1400, rng)
    _finish(tally, 1000)


def _system_mutations(d, rng):
    out = _dict_mutations(d, rng, SYSTEM_KEYS, SYSTEM_POSITIVE)
    for i, tier in enumerate(d["tiers"]):
        for label, t, names, refuse in _dict_mutations(tier, rng, TIER_KEYS, TIER_POSITIVE,
                                                       f"tiers[{i}]."):
            tiers = list(d["tiers"])
            tiers[i] = t
            out.append((label, dict(d, tiers=tiers), names, refuse))
    eff = {k: float(getattr(Efficiency(), k)) for k in EFFICIENCY_KEYS}
    for label, e, names, refuse in _dict_mutations(eff, rng, EFFICIENCY_KEYS, EFF_POSITIVE,
                                                   "efficiency."):
        out.append((label, dict(d, efficiency=e), names, refuse))
    tiers = d["tiers"]
    for label, value, refuse in (
            ("tiers reversed", tiers[::-1], True), ("tiers = []", [], True),
            ("tiers = {}", {}, True), ("tiers = 'nvlink'", "nvlink", True),
            ("tiers = [1, 2]", [1, 2], True), ("tiers = [None]", [None], True),
            ("tiers doubled", tiers + tiers, True),  # domain sizes no longer nested
            ("tiers[0] only", tiers[:1], False), ("tiers[1] only", tiers[1:], False)):
        out.append((label, dict(d, tiers=value), ("tiers",), refuse))
    out.append(("efficiency = [1]", dict(d, efficiency=[1]), ("efficiency",), True))
    return out


def test_fuzz_system_dicts():
    """Mutated system mappings (top level, every tier, an efficiency mapping) of every
    shipped system through `system_from_dict` (what `load_system` calls)."""
    rng = random.Random(2)
    tally = Tally("system YAML mappings")
    bases = [(p.name, _lean(p)) for p in SYSTEM_FILES]
    _run_dict_family(tally, bases, _system_mutations,
                     lambda d: system_from_dict(d, "system.yaml"), _system_config, 1100, rng)
    _finish(tally, 800)


def test_fuzz_overlays(tmp_path):
    """Calibration overlays through `apply_overlay`: mutated mappings and files."""
    rng = random.Random(3)
    tally = Tally("calibration overlays")
    system = load_system("a100-sxm-80gb")
    eff = {k: float(getattr(Efficiency(), k)) for k in EFFICIENCY_KEYS}
    base = dict(efficiency=eff, description="fuzz", created_by="test_fuzz")
    cases = []
    for label, e, names, refuse in _dict_mutations(eff, rng, EFFICIENCY_KEYS, EFF_POSITIVE,
                                                   "efficiency."):
        cases.append((label, dict(base, efficiency=e), names, refuse))
    cases += [(label, d, names, refuse) for label, d, names, refuse in _dict_mutations(
        base, rng, ("efficiency", "fitted_on", "heldout", "description", "created_by"), ())]
    rng.shuffle(cases)
    loaded = []
    for label, d, names, refuse in cases[:450]:
        result = tally.attempt(lambda d=d: apply_overlay(system, d), f"overlay: {label}", names)
        if refuse:
            tally.must_refuse(result, label, "a value that must be refused")
        if result is not None:
            loaded.append(_system_config(result, f"overlay: {label}"))
    # The same as files (read_yaml + the checks), a sample.
    for i, (label, d, names, _) in enumerate(cases[:80]):
        p = tmp_path / f"overlay{i}.yaml"
        try:
            p.write_text(yaml.safe_dump(d))
        except (yaml.YAMLError, ValueError, OverflowError):
            continue
        tally.attempt(lambda p=p: apply_overlay(system, p), f"overlay file: {label}", names)
    _predict_all(tally, loaded)
    _finish(tally, 450)


# YAML texts ---------------------------------------------------------------------------------

YAML_ODDITIES = (".nan", ".inf", "-.inf", "1e400", "1" + "0" * 400, "0x1F", "0o17", "1_000",
                 "!!binary aGVsbG8=", "!!python/object:os.system", "&a [*a]", "{", "[", "'a",
                 "~", "yes", "no", "on", "2001-12-14", "!!float '1'", "- 1", "|\n  7",
                 "\t7", "8 # comment", "\"\\x00\"", "!!set {a, b}", "<<: {a: 1}")


def _text_mutations(text, rng, n):
    """(label, bytes) mutations of a YAML text."""
    out = []
    raw = text.encode()
    lines = text.splitlines(keepends=True)
    value_lines = [i for i, line in enumerate(lines) if re.match(r"^\s*-?\s*\w+:\s*\S", line)
                   and not line.lstrip().startswith("#")]
    for _ in range(n):
        kind = rng.randrange(8)
        if kind == 0:
            k = rng.randrange(len(raw))
            out.append((f"truncated at byte {k}", raw[:k]))
        elif kind == 1:
            i = rng.choice(value_lines)
            key = lines[i].split(":")[0]
            odd = rng.choice(YAML_ODDITIES)
            new = lines[:i] + [f"{key}: {odd}\n"] + lines[i + 1:]
            out.append((f"line {i + 1}: {key.strip()}: {odd!r}", "".join(new).encode()))
        elif kind == 2:
            k = rng.randrange(len(raw))
            junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
            out.append((f"junk {junk!r} at byte {k}", raw[:k] + junk + raw[k:]))
        elif kind == 3:
            i = rng.choice(value_lines)
            out.append((f"line {i + 1} duplicated", "".join(lines[:i + 1] + lines[i:]).encode()))
        elif kind == 4:
            i = rng.choice(value_lines)
            out.append((f"line {i + 1} indented", "".join(
                lines[:i] + ["   " + lines[i]] + lines[i + 1:]).encode()))
        elif kind == 5:
            i = rng.choice(value_lines)
            out.append((f"line {i + 1} deleted", "".join(lines[:i] + lines[i + 1:]).encode()))
        elif kind == 6:
            k = rng.randrange(len(raw))
            flipped = bytes([raw[k] ^ (1 << rng.randrange(8))])
            out.append((f"bit flip at byte {k}", raw[:k] + flipped + raw[k + 1:]))
        else:
            out.append(("random bytes", bytes(rng.randrange(256) for _ in range(
                rng.randrange(1, 200)))))
    return out


FIXED_TEXTS = (("empty file", b""), ("only a comment", b"# nothing\n"),
               ("a list", b"- 1\n- 2\n"), ("a scalar", b"42\n"), ("null", b"~\n"),
               ("two documents", b"a: 1\n---\nb: 2\n"), ("tab indentation", b"a:\n\tb: 1\n"),
               ("UTF-16 with BOM", "name: x\n".encode("utf-16")),
               ("latin-1 text", "name: caf\xe9\n".encode("latin-1")),
               ("NUL bytes", b"name: a\x00b\n"), ("deep nesting", b"a: " + b"[" * 600 +
                                                  b"]" * 600 + b"\n"),
               ("unbalanced nesting", b"[" * 600), ("key with a line break",
                                                     b'"hid\\nden": 3\n'),
               ("huge integer", b"hidden: " + b"9" * 500 + b"\n"))


@pytest.mark.parametrize("kind", ["model", "system"])
def test_fuzz_yaml_texts(tmp_path, kind):
    """Mutated YAML texts of the shipped files through `load_model` / `load_system`."""
    rng = random.Random(4 if kind == "model" else 5)
    tally = Tally(f"{kind} YAML texts")
    files = MODEL_FILES if kind == "model" else SYSTEM_FILES
    load = load_model if kind == "model" else load_system
    make = _model_config if kind == "model" else _system_config
    cases = [(label, data) for label, data in FIXED_TEXTS]
    for f in files:
        cases += [(f"{f.name}: {label}", data)
                  for label, data in _text_mutations(f.read_text(), rng, 14 if kind == "model"
                                                     else 24)]
    loaded = []
    for i, (label, data) in enumerate(cases):
        p = tmp_path / f"{kind}{i}.yaml"
        p.write_bytes(data)
        result = tally.attempt(lambda p=p: load(p), f"{label} (bytes {_short(data, 120)})")
        if result is not None:
            loaded.append(make(result, label))
    _predict_all(tally, loaded)
    _finish(tally, 150)


def test_duplicate_yaml_key_is_refused(tmp_path):
    """A key given twice in a YAML mapping: PyYAML keeps the last value silently. STYLE.md
    section 5 ('never silently fix a user's value') asks for an error naming the key."""
    text = (CONFIGS / "models" / "gpt-small.yaml").read_text() + "\nnum_layers: 7\n"
    p = tmp_path / "dup.yaml"
    p.write_text(text)
    with pytest.raises(SpecError, match="num_layers"):
        load_model(p)


# Hugging Face config.json --------------------------------------------------------------------

HF_CONFIGS = {
    "llama3-8b": dict(model_type="llama", num_hidden_layers=32, hidden_size=4096,
                      intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                      vocab_size=128256, max_position_embeddings=8192, hidden_act="silu",
                      rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False,
                      rope_theta=500000.0, torch_dtype="bfloat16"),
    "mixtral-8x7b": dict(model_type="mixtral", num_hidden_layers=32, hidden_size=4096,
                         intermediate_size=14336, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=32000,
                         max_position_embeddings=32768, hidden_act="silu", rms_norm_eps=1e-5,
                         num_local_experts=8, num_experts_per_tok=2, sliding_window=None),
    "gpt2": dict(model_type="gpt2", n_layer=12, n_embd=768, n_head=12, n_positions=1024,
                 vocab_size=50257, activation_function="gelu_new", n_inner=None),
    "qwen2-7b": dict(model_type="qwen2", num_hidden_layers=28, hidden_size=3584,
                     intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4,
                     vocab_size=152064, max_position_embeddings=32768, hidden_act="silu",
                     rms_norm_eps=1e-6, tie_word_embeddings=False),
    "deepseek-v2-lite": dict(model_type="deepseek_v2", num_hidden_layers=27, hidden_size=2048,
                             intermediate_size=10944, num_attention_heads=16,
                             num_key_value_heads=16, vocab_size=102400,
                             max_position_embeddings=163840, hidden_act="silu",
                             rms_norm_eps=1e-6, kv_lora_rank=512, q_lora_rank=None,
                             qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                             moe_intermediate_size=1408, n_routed_experts=64,
                             n_shared_experts=2, num_experts_per_tok=6,
                             first_k_dense_replace=1),
}
HF_REQUIRED = {"num_hidden_layers", "hidden_size", "num_attention_heads", "n_layer", "n_embd",
               "n_head"}


def _hf_mutations(cfg, rng):
    out = []
    for key in cfg:
        m = dict(cfg)
        del m[key]
        out.append((f"delete {key}", m, (), False))
        for label, v in _value_mutations(cfg[key], rng):
            m = dict(cfg)
            m[key] = v
            out.append((f"{key} = {label}", m, (), False))
    for key in _HF_UNSUPPORTED:
        for v in (1, 512, [1], "yes", True):
            out.append((f"add unsupported {key} = {v!r}", dict(cfg, **{key: v}), (key,), True))
    if "qk_rope_head_dim" not in cfg:  # MLA needs its head dims: refused, named
        out.append(("add MLA without head dims", dict(cfg, kv_lora_rank=512),
                    ["kv_lora_rank"], True))
    return out


def test_fuzz_hf_configs(tmp_path):
    """Mutated Hugging Face config.json files through `load_model`; fields that change the
    architecture beyond the model (`_HF_UNSUPPORTED`) must be refused by name."""
    rng = random.Random(6)
    tally = Tally("Hugging Face config.json")
    cases = [(name, m) for name, cfg in HF_CONFIGS.items() for m in _hf_mutations(cfg, rng)]
    rng.shuffle(cases)
    loaded = []
    for i, (name, (label, cfg, names, refuse)) in enumerate(cases[:650]):
        p = tmp_path / f"config{i}.json"
        p.write_text(json.dumps(cfg))  # NaN / Infinity are written as JSON extensions
        reproducer = f"{name} config.json: {label}"
        result = tally.attempt(lambda p=p: load_model(p), reproducer, names)
        if refuse:
            tally.must_refuse(result, reproducer, "an unsupported Hugging Face field")
        if result is not None:
            loaded.append(_model_config(result, reproducer))
    # Texts: truncated, junk, not an object.
    text = json.dumps(HF_CONFIGS["llama3-8b"]).encode()
    texts = [(f"truncated at {k}", text[:k]) for k in rng.sample(range(len(text)), 40)]
    texts += [("list", b"[1, 2]"), ("string", b'"a"'), ("empty", b""), ("binary", b"\xff\xfe\x00"),
              ("latin-1", '{"model_type": "caf\xe9"}'.encode("latin-1")),
              ("deep", b"[" * 100000), ("NaN", b'{"num_hidden_layers": NaN}')]
    for i, (label, data) in enumerate(texts):
        p = tmp_path / f"text{i}.json"
        p.write_bytes(data)
        result = tally.attempt(lambda p=p: load_model(p), f"config.json text: {label}")
        if result is not None:
            loaded.append(_model_config(result, label))
    _predict_all(tally, loaded)
    _finish(tally, 600)


# Runs CSV ------------------------------------------------------------------------------------

def _read_rows(path):
    with Path(path).open(newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames), list(reader)


def _csv_text(header, rows) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=header, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: r.get(k, "") for k in header})
    return buf.getvalue()


CELL_VALUES = ("", " ", "abc", "nan", "NaN", "inf", "-inf", "-1", "0", "1.5", "1e400",
               "1" + "0" * 400, "2.0", "１", "0x10", "True", "none", "=1+1", "1,5", "\x00")


def _csv_mutations(header, rows, rng):
    """(label, text, names the error must mention, must_refuse)."""
    out = []
    for col in header:
        h = [c for c in header if c != col]
        out.append((f"drop column {col}", _csv_text(h, rows),
                    (col,) if col in RUN_REQUIRED else (), col in RUN_REQUIRED))
        for typo in _typos(col, rng, 1):
            h = [typo if c == col else c for c in header]
            rs = [{(typo if k == col else k): v for k, v in r.items()} for r in rows]
            out.append((f"rename column {col} -> {typo}", _csv_text(h, rs), (), False))
    for col in header:
        for value in CELL_VALUES:
            i = rng.randrange(len(rows))
            rs = copy.deepcopy(rows)
            rs[i][col] = value
            blank_ok = col == "step_time_s" and rows[i].get("status") == "oom"
            refuse = (value.strip() == "" and col in RUN_REQUIRED and not blank_ok) or (
                col in ("tp", "pp", "dp", "num_layers", "hidden", "num_heads", "vocab",
                        "seq_len", "global_batch", "micro_batch", "num_gpus", "step_time_s")
                and value in ("abc", "nan", "NaN", "inf", "-inf", "-1", "0", "1.5", "1e400"))
            out.append((f"row {i + 2} {col} = {value!r}", _csv_text(header, rs), (col,), refuse))
    for label, col, values in (
            ("status", "status", ("OK", "failed", "oom ", "1")),
            ("recompute", "recompute", ("partial", "Full", "2", "true")),
            ("precision", "precision", ("bf61", "int8", "BF16", "fp8")),
            ("gated_mlp", "gated_mlp", ("2", "true", "-1", "yes")),
            ("zero_stage", "zero_stage", ("4", "-1", "1.5")),
            ("sequence_parallel", "sequence_parallel", ("2", "-1")),
            ("system", "system", ("h100", "nonexistent-gpu", "a100-sxm-80gb"))):
        for v in values:
            rs = copy.deepcopy(rows)
            rs[rng.randrange(len(rs))][col] = v
            out.append((f"{label} = {v!r}", _csv_text(header, rs), (), False))
    # Layouts that do not divide.
    for label, change, fragment in (
            ("tp does not divide heads", dict(tp="3", num_gpus="3"), "must divide"),
            ("pp beyond the layers", dict(pp="1000", num_gpus="1000"),
             "every middle pipeline stage must hold at least vp layers"),
            ("global batch not divisible", dict(global_batch="3", micro_batch="2"),
             "must be a multiple of micro_batch x dp"),
            ("devices do not add up", dict(num_gpus="3"), "must equal num_gpus="),
            ("ep on a dense model", dict(ep="2", dp="2", num_gpus="2", global_batch="2"),
             "needs an MoE model"),
            ("cp does not divide seq_len", dict(cp="3", num_gpus="3"), "must divide"),
            ("ep does not divide the experts", dict(
                moe_experts="8", moe_topk="2", ep="3", dp="3", num_gpus="3", global_batch="3"),
             "must divide model.moe_experts"),
            ("ep does not divide dp", dict(
                moe_experts="8", moe_topk="2", ep="4", dp="2", num_gpus="2", global_batch="2"),
             "must divide dp")):
        rs = copy.deepcopy(rows)
        rs[0].update(change)
        out.append((label, _csv_text(header, rs), (fragment,), True))
    rs = copy.deepcopy(rows)
    rs[1]["id"] = rs[0]["id"]
    out.append(("duplicate id", _csv_text(header, rs), ("duplicate id",), True))
    text = _csv_text(header, rows)
    for _ in range(40):
        k = rng.randrange(len(text))
        out.append((f"truncated at {k}", text[:k], (), False))
    out += [("header only", _csv_text(header, []), ("no runs",), True),
            ("empty file", "", ("empty file",), True),
            ("short row", text + "x1,2\n", (), True), ("long row", text.rstrip("\n") + ",a,b\n",
                                                      (), False),
            ("unbalanced quote", text + '"x,1\n', (), True),
            ("huge field", text + "y" * 200000 + "\n", (), True)]
    return out


def test_fuzz_runs_csv(tmp_path):
    """Mutated runs CSVs through `load_runs`, then the CLI's system lookup; what loads is
    predicted row by row."""
    rng = random.Random(7)
    tally = Tally("runs CSV")
    header, rows = _read_rows(RUNS_CSV)
    base = rows[:3]  # three rows keep each load fast; every column and rule is exercised
    cases = _csv_mutations(header, base, rng)
    loaded, systems = [], {}
    for i, (label, text, names, refuse) in enumerate(cases):
        p = tmp_path / f"runs{i}.csv"
        p.write_text(text)
        reproducer = f"{RUNS_CSV.name}[:3]: {label}"
        runs = tally.attempt(lambda p=p: load_runs(p), reproducer, names)
        if refuse:
            tally.must_refuse(runs, reproducer, "an invalid runs CSV")
        if runs is None:
            continue
        for j in range(len(runs)):
            name = runs.systems[j] or "h100-sxm-80gb"
            if name not in systems:  # the CLI's lookup (validate_cmd.load_systems), once a name
                systems[name] = tally.attempt(lambda: load_system(name), f"{reproducer}: system")
            system = systems[name]
            if system is not None:
                loaded.append((runs.models[j], runs.parallels[j], system, runs.trainings[j],
                               f"{reproducer}, row {j}"))
    # Binary and foreign-encoding files.
    for i, (label, data) in enumerate((
            ("binary", bytes(range(256)) * 4), ("UTF-16", _csv_text(header, base).encode(
                "utf-16")), ("latin-1 cell", _csv_text(header, base).replace(
                    "ok", "\xe9", 1).encode("latin-1")), ("NUL", b"id\x00,x\n1,2\n"))):
        p = tmp_path / f"bin{i}.csv"
        p.write_bytes(data)
        tally.attempt(lambda p=p: load_runs(p), f"runs CSV: {label}")
    _predict_all(tally, loaded)
    _finish(tally, 500)


# CLI -----------------------------------------------------------------------------------------

_ARGPARSE_ERROR = re.compile(r"^diffperf(?: \w+)*: error: ")
_ONE_LINE_ERROR = re.compile(r"^(?:diffperf(?: \w+)*: )?error: ")


def _cli(tally, capsys, argv, refuse=False):
    """One CLI run: exit 0, or 2 with one `error:` line (argparse's: `diffperf ...: error:`);
    never an exception or a traceback. `refuse`: the input is invalid, exit 0 is a crash
    ('bad value accepted'). Output of an exit 0 must hold no NaN or Infinity."""
    tally.tried += 1
    reproducer = "diffperf " + " ".join(argv)
    try:
        with _time_limit(10 * TIME_LIMIT_S, tally.spent, reproducer):
            code = main(list(argv))
    except SystemExit as exit_:  # argparse
        code = exit_.code
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        if code == 0:
            tally.loaded += 1
        elif code != 2 or not lines or not _ARGPARSE_ERROR.match(lines[-1]) or "Traceback" in err:
            tally.crash(f"argparse exit {code} without an error line", f"{reproducer} -> {err!r}")
        else:
            tally.refused += 1
        return
    except Hang:
        capsys.readouterr()
        tally.crash("hang", reproducer)
        return
    except Exception as err:  # noqa: BLE001
        capsys.readouterr()
        tally.crash(f"{type(err).__name__} at {_where(err)} (traceback, exit 1)",
                    f"{reproducer} -> {err!r}")
        return
    out, err = capsys.readouterr()
    if code == 0:
        tally.loaded += 1
        if refuse:
            tally.crash("bad value accepted (exit 0)", reproducer)
        if re.search(r"\b(nan|NaN|-?Infinity|inf)\b", out):
            tally.crash("non-finite number in the output", f"{reproducer} -> {_short(out)}")
        return
    lines = err.strip().splitlines()
    if code == 2 and len(lines) == 1 and _ONE_LINE_ERROR.match(lines[0]) and "Traceback" not in err:
        tally.refused += 1
    else:
        tally.crash(f"exit {code} with {len(lines)} stderr lines", f"{reproducer} -> {err!r}")


def _write_failing_files(tmp_path, rng):
    """Files the loaders refuse (or crash on): models, systems, overlays, CSVs, kernels."""
    files = {"model": [], "system": [], "overlay": [], "runs": [], "kernel": []}
    model = (CONFIGS / "models" / "gpt-small.yaml").read_text()
    system = (CONFIGS / "systems" / "a100-sxm-80gb.yaml").read_text()
    for kind, text in (("model", model), ("system", system)):
        for i, (label, data) in enumerate(_text_mutations(text, rng, 25) + list(FIXED_TEXTS)):
            p = tmp_path / f"cli-{kind}{i}.yaml"
            p.write_bytes(data)
            files[kind].append(p)
    for i, (label, value) in enumerate((("mm_max", 2.0), ("mm_maxx", 0.5), ("floor_pnorm", -1),
                                        ("kernel_s", "abc"), ("mem_eff", NAN))):
        p = tmp_path / f"cli-overlay{i}.yaml"
        p.write_text(yaml.safe_dump({"efficiency": {label: value}}))
        files["overlay"].append(p)
    header, rows = _read_rows(RUNS_CSV)
    cases = [c for c in _csv_mutations(header, rows[:2], rng) if c[3]]
    for i, (label, text, _, _) in enumerate(rng.sample(cases, min(40, len(cases)))):
        p = tmp_path / f"cli-runs{i}.csv"
        p.write_text(text)
        files["runs"].append(p)
    for i, data in enumerate((b"m,n\n1,2\n", b"\xff\xfe\x00", b"", b"m,n,k,time_s\n1,2,3,x\n")):
        p = tmp_path / f"cli-kernel{i}.csv"
        p.write_bytes(data)
        files["kernel"].append(p)
    return files


def test_fuzz_cli(tmp_path, capsys):
    """Argument vectors that fail before any prediction (parsing, loading, layout checks,
    calibrate's options), in process; plus `--help`."""
    rng = random.Random(8)
    tally = Tally("CLI argument vectors")
    files = _write_failing_files(tmp_path, rng)
    # Lean copies (no `sources:`) of a small model and a system: fast to load.
    lean_model, lean_system = tmp_path / "m.yaml", tmp_path / "s.yaml"
    lean_model.write_text(yaml.safe_dump(_lean(CONFIGS / "models" / "gpt-small.yaml")))
    lean_system.write_text(yaml.safe_dump(_lean(CONFIGS / "systems" / "a100-sxm-80gb.yaml")))
    base = ["predict", "--model", str(lean_model), "--system", str(lean_system)]
    runs = str(RUNS_CSV)
    vectors = [[], ["--help"], ["predict", "--help"], ["frobnicate"], ["predict", "--nope"],
               ["validate"], ["calibrate"], ["predict", "--json", "extra"]]
    for opt in ("--tp", "--pp", "--cp", "--ep", "--vp", "--gpus", "--dp", "--micro-batch",
                "--global-batch", "--zero-stage", "--seq-len"):
        for v in ("x", "1.5", "", "1e3", "nan"):
            vectors.append(base + [opt, v])                      # argparse: not an int
    for opt, values in (("--recompute", ("partial", "FULL", "")),
                        ("--sequence-parallel", ("2", "-1")), ("--dp-overlap", ("2",))):
        for v in values:
            vectors.append(base + [opt, v])
    # gpt-small: 12 heads, 12 layers, ffn 3072, seq 1024; 8 devices by default below.
    layout_failures = (
        ["--gpus", "8", "--tp", "0"], ["--gpus", "8", "--tp", "-2", "--pp", "-4"],
        ["--gpus", "8", "--tp", "8", "--pp", "1"], ["--gpus", "40", "--tp", "5", "--pp", "1"],
        ["--gpus", "7", "--tp", "7", "--pp", "1"], ["--gpus", "8", "--tp", "1", "--pp", "8"],
        ["--gpus", "5", "--tp", "1", "--pp", "5"], ["--gpus", "8", "--tp", "1", "--pp", "1",
                                                    "--cp", "3"],
        ["--gpus", "8", "--tp", "1", "--pp", "1", "--ep", "2"],
        ["--gpus", "8", "--tp", "1", "--pp", "1", "--global-batch", "7"],
        ["--gpus", "8", "--tp", "1", "--pp", "1", "--micro-batch", "0"],
        ["--gpus", "8", "--tp", "1", "--pp", "1", "--micro-batch", "3", "--global-batch", "8"],
        ["--gpus", "8", "--tp", "1", "--pp", "2", "--vp", "2", "--global-batch", "4"],
        ["--gpus", "8", "--tp", "1", "--pp", "1", "--vp", "2"],
        ["--gpus", "8", "--tp", "1", "--pp", "1", "--zero-stage", "4"],
        ["--gpus", "8", "--tp", "1", "--pp", "1", "--zero-stage", "-1"],
        ["--gpus", "0", "--tp", "1", "--pp", "1"], ["--gpus", "-8", "--tp", "1", "--pp", "1"],
        ["--gpus", "8", "--tp", "1", "--pp", "1", "--dp", "3"],
        ["--gpus", "8", "--tp", "1", "--pp", "1", "--seq-len", "0"],
        ["--gpus", "8", "--tp", "1", "--pp", "1", "--seq-len", "-1024"],
        ["--gpus", "8", "--tp", "1", "--pp", "1", "--cp", "2", "--seq-len", "1023"],
        ["--gpus", "8", "--tp", "1", "--pp", "1", "--precision", "bf61"],
        ["--gpus", "8", "--tp", "1", "--pp", "1", "--precision", ""],
        ["--gpus", "8", "--tp", "1", "--pp", "1", "--calibration", str(tmp_path / "none.yaml")])
    vectors += [base + v for v in layout_failures]
    # Mixtral (8 experts): ep must divide the experts and dp.
    for gpus, ep in (("24", "3"), ("8", "16"), ("12", "6"), ("8", "0")):
        vectors.append(["predict", "--model", "mixtral-8x7b", "--gpus", gpus, "--tp", "1",
                        "--pp", "1", "--ep", ep])
    for name in ("gpt3-175", "llama3", "", "../models/gpt-small", "GPT-SMALL", "x.json",
                 str(tmp_path / "missing.yaml"), str(tmp_path)):
        vectors.append(["predict", "--model", name])
        vectors.append(["predict", "--model", str(lean_model), "--system", name])
    vectors += [["predict", "--model", str(p), "--system", str(lean_system)]
                for p in files["model"]]
    vectors += [["predict", "--model", str(lean_model), "--system", str(p)]
                for p in files["system"]]
    vectors += [base + ["--calibration", str(p)] for p in files["overlay"]]
    for p in files["runs"]:
        vectors += [["validate", str(p)], ["calibrate", str(p), "--steps", "1"]]
    vectors += [["validate", str(tmp_path / "missing.csv")], ["validate", str(tmp_path)],
                ["validate", runs, "--system", "h100"], ["validate", runs, "--precision", "x"],
                ["validate", runs, "--calibration", str(files["overlay"][0])],
                ["calibrate", runs, "--holdout-frac", "1"],
                ["calibrate", runs, "--holdout-frac", "-0.1"],
                ["calibrate", runs, "--holdout-frac", "nan"], ["calibrate", runs, "--folds", "1"],
                ["calibrate", runs, "--folds", "-3"], ["calibrate", runs, "--folds", "10000"],
                ["calibrate", runs, "--fit-only", "nocolumn"],
                ["calibrate", runs, "--fit-only", "nocolumn=1"],
                ["calibrate", runs, "--fit-only", "status=none"],
                ["calibrate", runs, "--system", "nonexistent"],
                ["calibrate", runs, "--precision", "bf61"],
                ["calibrate", runs, "--steps", "0"], ["calibrate", runs, "--steps", "-1"]]
    for k in files["kernel"]:
        vectors.append(["calibrate", runs, "--microbench", str(k), str(k), str(k)])
    vectors.append(["calibrate", runs, "--microbench", "a.csv", "b.csv", "c.csv"])
    for argv in vectors:
        _cli(tally, capsys, argv)
    _finish(tally, 200)


def test_fuzz_sanity():
    """The oracle itself: a crash is counted, a SpecError is not, a multi-line one is."""
    t = Tally("oracle")
    assert t.attempt(lambda: 1, "ok") == 1
    t.attempt(lambda: (_ for _ in ()).throw(SpecError("x=1 must be > 2")), "refused", ("x",))
    assert not t.crashes and t.refused == 1
    t.attempt(lambda: 1 / 0, "crash")
    t.attempt(lambda: (_ for _ in ()).throw(SpecError("a\nb")), "two lines")
    t.attempt(lambda: (_ for _ in ()).throw(SpecError("y=1 bad")), "wrong field", ("x",))
    assert [c[0].split(" at ")[0] for c in t.crashes] == [
        "ZeroDivisionError", "SpecError message is not one line",
        "SpecError does not name the field 'x'"]
    assert math.isfinite(TIME_LIMIT_S)
    # the limit is CPU time: a busy loop is stopped at its CPU limit, a blocked input (no
    # CPU) by the wall backstop, and the time spent is recorded either way
    spent = []
    with pytest.raises(Hang, match="of CPU"), _time_limit(0.05, spent):
        while True:
            pass
    with pytest.raises(Hang, match="wall"), _time_limit(0.02, spent):
        time.sleep(60)
    # ITIMER_PROF counts the process's CPU in scheduler ticks while process_time reads the
    # CPU clock: the two agree to one tick (CI saw 0.0474 s at a 0.05 s timer), not exactly
    tick = 1.0 / os.sysconf("SC_CLK_TCK")
    assert spent[0][0] >= 0.05 - tick and 0.6 <= spent[1][1] < 30 and spent[1][0] < 0.05


# ------------------------------------------------------------------------- issue 20 classes
# The classes of issue 20 (nonsense accepted, tracebacks, YAML expansion, the program store,
# errors that do not help), driven in bulk: >= 5,000 CLI argument vectors and >= 500 bad
# files, every one of which must be refused (exit 2, one line) before anything is traced:
# predict's and search's computations are replaced by a sentinel that counts as a crash
# ('reached the prediction'), so the whole family runs in seconds.

class Reached(Exception):
    """An input that should have been refused reached the prediction."""


@pytest.fixture
def no_prediction(monkeypatch):
    import diffperf.api
    import diffperf.search.evaluate

    def reached(*args, **kwargs):
        raise Reached("an invalid input reached the prediction")

    monkeypatch.setattr(diffperf.api, "_predict_concrete", reached)
    monkeypatch.setattr(diffperf.search.evaluate, "_evaluate", reached)


INT_OPTIONS = {
    "predict": ("--gpus", "--dp", "--tp", "--pp", "--cp", "--ep", "--vp", "--micro-batch",
                "--global-batch", "--zero-stage", "--cp-ring", "--gx", "--gy", "--gz",
                "--pp-first-layers", "--pp-last-layers", "--seq-len"),
    "search": ("--gpus", "--global-batch", "--top", "--chunk", "--seq-len"),
    "sensitivity": ("--gpus", "--tp", "--pp", "--max-candidates", "--top"),
    "design": ("--steps", "--max-candidates", "--top"),
}
FLOAT_OPTIONS = {"sensitivity": ("--smooth", "--temperature"),
                 "design": ("--budget", "--tokens", "--learning-rate", "--temperature")}
# Values no integer option may take: beyond int32 in magnitude, or not a whole number.
BAD_INTS = ("2147483648", "-2147483648", "99999999999999999999", "1" + "0" * 400,
            "-" + "9" * 60, "1.5", "1e3", "x", "", " ", "nan", "inf", "-inf", "0x10", "--",
            "1 2", "+", "٫", "1e400", "0.0")
BAD_FLOATS = ("nan", "inf", "-inf", "1e400", "-1e400", "x", "", "--", "1e31", "0x1p3")
SWITCH_VALUES = ("2", "3", "5", "-1", "128", "1e18", "0.5", "nan", "inf", "1e400", "x", "")
PARALLEL_BAD = (("zero_shard", "-1"), ("zero_shard", "3"), ("zero3_calls_per_layer", "0"),
                ("zero3_calls_per_layer", "1.5"), ("tp_overlap", "2"), ("ep_overlap", "1.5"),
                ("zero3_prefetch_params", "inf"), ("axonn_overlap", "2"),
                ("zero3_regather", "7"), ("nonexistent", "1"), ("", "1"), ("dropout", ""))


def _mass_vectors(rng, lean_model, lean_system):
    """(argv, must_refuse) for the issue 20 classes; deterministic."""
    from diffperf.specs.validate import TRAINING_SWITCHES

    small = ["--model", lean_model, "--system", lean_system, "--gpus", "8", "--tp", "2",
             "--pp", "2", "--global-batch", "8"]
    out = []
    for cmd, opts in INT_OPTIONS.items():
        for opt in opts:
            drawn = [str(rng.randrange(2**31, 2**rng.randrange(32, 1400))) for _ in range(8)]
            drawn += [f"-{rng.randrange(2**31, 2**200)}" for _ in range(4)]
            drawn += ["".join(rng.choice("0123456789.e-+x ,_") for _ in range(rng.randrange(
                2, 12))) + "z" for _ in range(8)]
            for v in BAD_INTS + tuple(drawn):
                out.append(([cmd, opt, v], True))
                out.append(([cmd, f"{opt}={v}"], True))
                out.append(([cmd, *small, f"{opt}={v}"], True))
                out.append(([cmd, f"{opt}={v}", *small], True))
    for cmd, opts in FLOAT_OPTIONS.items():
        for opt in opts:
            for v in BAD_FLOATS:
                out.append(([cmd, f"{opt}={v}"], True))
    for field in TRAINING_SWITCHES:
        for v in SWITCH_VALUES:
            out.append((["predict", *small, "--set", f"{field}={v}"], True))
            out.append((["sensitivity", *small, "--set", f"{field}={v}"], True))
    for field, v in PARALLEL_BAD:
        out.append((["predict", *small, "--set", f"{field}={v}"], True))
    for opt, values in (("--recompute", ("partial", "FULL", "", "2")),
                        ("--sequence-parallel", ("2", "-1", "x")), ("--dp-overlap", ("3",)),
                        ("--precision", ("bf61", "", "\x1b[31m", "x" * 5000))):
        for v in values:
            out.append((["predict", *small, opt, v], True))
    # Layouts that do not fit gpt-small (12 heads, 12 layers) or the devices.
    layouts = []
    for tp in (0, 5, 7, 24, -2):
        layouts.append(["--gpus", str(max(tp, 1) * 2), "--tp", str(tp), "--pp", "1"])
    for pp in (13, 100):
        layouts.append(["--gpus", str(pp), "--tp", "1", "--pp", str(pp)])
    layouts += [["--gpus", "8", "--tp", "1", "--pp", "1", "--dp", "3"],
                # an explicit batch: a default one is rounded up to dp x micro-batch (steer)
                ["--gpus", "8", "--tp", "2", "--pp", "1", "--micro-batch", "5",
                 "--global-batch", "8"],
                ["--gpus", "8", "--tp", "1", "--pp", "1", "--cp", "3"],
                ["--gpus", "2097152", "--tp", "1", "--pp", "1", "--global-batch", "2097152"]]
    for lay in layouts:
        out.append((["predict", "--model", lean_model, "--system", lean_system, *lay], True))
    # Names: control characters, markup, huge (did-you-mean must stay cheap).
    for name in ("\x1b[2Jgpt", "[red]x[/red]", "gpt-smal", "x" * 100000, "\x00", "a\nb",
                 "../../etc/passwd", "\u202egpt"):
        out.append((["predict", "--model", name], True))
        out.append((["predict", "--model", lean_model, "--system", name], True))
        out.append((["search", "--model", name], True))
    rng.shuffle(out)
    return out


def test_fuzz_issue20_cli(tmp_path, capsys, no_prediction):
    """>= 5,000 argument vectors of the issue 20 classes, each refused in one line (exit
    2), none reaching a prediction; counted."""
    rng = random.Random(20)
    tally = Tally("issue 20 CLI vectors")
    lean_model, lean_system = tmp_path / "m.yaml", tmp_path / "s.yaml"
    lean_model.write_text(yaml.safe_dump(_lean(CONFIGS / "models" / "gpt-small.yaml")))
    lean_system.write_text(yaml.safe_dump(_lean(CONFIGS / "systems" / "a100-sxm-80gb.yaml")))
    vectors = _mass_vectors(rng, str(lean_model), str(lean_system))
    for argv, refuse in vectors:
        _cli(tally, capsys, argv, refuse=refuse)
    _finish(tally, 5000)


# Bad files --------------------------------------------------------------------------------

def _alias_bomb(levels, width, where):
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return f"{where}:\n  " + "\n  ".join(lines) + f"\nname: *a{levels - 1}\n"


def _bad_files(tmp_path, rng):
    """(label, path, loader, fragment the refusal must contain) of >= 500 bad files."""
    import diffperf.cli.plot_cmd  # noqa: F401

    model = (CONFIGS / "models" / "gpt-small.yaml").read_text()
    system = _lean(CONFIGS / "systems" / "a100-sxm-80gb.yaml")
    out = []

    def put(label, data, suffix, loader, fragment):
        p = tmp_path / f"bad{len(out)}{suffix}"
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
        out.append((label, p, loader, fragment))

    for levels in range(2, 12):
        for width in (2, 5, 10):
            for where in ("sources", "attention", "description", "tiers"):
                put(f"alias bomb {levels}x{width} under {where}",
                    _alias_bomb(levels, width, where), ".yaml", load_model, "aliases")
                put(f"alias bomb {levels}x{width} under {where} (system)",
                    _alias_bomb(levels, width, where), ".yaml", load_system, "aliases")
    for key in ("num_layers", "hidden", "num_heads", "vocab", "seq_len", "ffn_hidden"):
        for v in (2**31 + 1, 10**30, "1e400", ".nan", "-.inf", -5):
            put(f"model {key}: {v}", re.sub(rf"(?m)^{key}:.*$", f"{key}: {v}", model), ".yaml",
                load_model, key)
    for flag in ("gated_mlp", "tied_embeddings", "biases"):
        for v in (2, -1, 128, "maybe", 0.5):
            put(f"model {flag}: {v}", model + f"\n{flag}: {v}\n", ".yaml", load_model, flag)
    for key, values in (("matmul_TFLOPs", (0, -1, ".nan", "1e400")),
                        ("hbm_bandwidth_GBps", (0, -25, ".inf")),
                        ("hbm_capacity_GiB", (0, ".nan"))):
        for v in values:
            d = dict(system)
            d[key] = v if not isinstance(v, str) else {"1e400": 1e400, ".nan": NAN,
                                                        ".inf": INF}[v]
            put(f"system {key}: {v}", yaml.safe_dump(d).replace("1e+400", "1e400"),
                ".yaml", load_system, key)
    for n in (9, 12, 16, 40, 100):
        d = dict(system, tiers=[dict(name=f"t{i}", domain_size=8 * (i + 1), bandwidth_GBps=100,
                                     latency_us=1) for i in range(n)])
        put(f"system with {n} tiers", yaml.safe_dump(d), ".yaml",
            lambda p: _checked_system(p), "network tiers (allowed: 1 to 8)")
    for i in range(40):
        tiers = [dict(t) for t in system["tiers"]]
        j = rng.randrange(len(tiers))
        key = rng.choice(("bandwidth_GBps", "domain_size", "oversubscription", "latency_us"))
        tiers[j][key] = rng.choice((0, -1, -25, 0.5 if key == "oversubscription" else -1e-9))
        put(f"tiers[{j}].{key} = {tiers[j][key]}", yaml.safe_dump(dict(system, tiers=tiers)),
            ".yaml", load_system, key)
    # Plot validation CSVs: short rows, long rows, huge cells, junk.
    head = "id,step_time_s,predicted_step_time_s\n"
    for i in range(60):
        k = rng.randrange(3)
        if k == 0:
            body = f"r{i},1.0\n"
        elif k == 1:
            body = f"r{i},1.0,2.0,{'x' * rng.randrange(1, 9)}\n"
        else:
            body = f"r{i},1.0," + "9" * (131073 + rng.randrange(100000)) + "\n"
        put(f"plot csv {('short row', 'long row', 'huge cell')[k]}", head + body, ".csv",
            _plot_validation, ("no predicted_step_time_s", "more cells", "malformed CSV")[k])
    for v in ("nan", "inf", "-1", "0", "x", "1e400"):
        put(f"plot csv predicted = {v}", head + f"r1,1.0,{v}\n", ".csv", _plot_validation,
            "predicted_step_time_s")
    # Runs CSVs whose cells break a bound (int32, switches) or that are binary.
    runs_head = ("id,system,num_gpus,num_layers,hidden,num_heads,vocab,seq_len,tp,pp,dp,"
                 "global_batch,micro_batch,step_time_s")
    good = ["r1", "a100-sxm-80gb", "1", "12", "768", "12", "50257", "1024", "1", "1", "1", "8",
            "1", "0.5"]
    cols = runs_head.split(",")
    for col in cols[2:]:
        for v in ("2147483649", "1e400", "nan", "-3", "x"):
            if col == "step_time_s" and v == "2147483649":
                continue  # a time, not a count: 68 years is not out of range
            row = list(good)
            row[cols.index(col)] = v
            put(f"runs {col} = {v}", "\ufeff" + runs_head + "\n" + ",".join(row) + "\n",
                ".csv", load_runs, col)
    # Hugging Face config.json that is not a model.
    for i in range(50):
        cfg = dict(HF_CONFIGS["llama3-8b"])
        key = rng.choice(["num_hidden_layers", "hidden_size", "num_attention_heads",
                          "vocab_size"])
        cfg[key] = rng.choice([2**31 + 7, -1, 0, 1e300, "abc", None, [1]])
        put(f"config.json {key} = {cfg[key]!r}", json.dumps(cfg), ".json", load_model, ())
    return out


def _checked_system(path):
    from diffperf.specs.validate import check_system

    system = load_system(path)
    check_system(system)
    return system


def _plot_validation(path):
    """Marker loader: `test_fuzz_issue20_files` runs `diffperf plot validation PATH`."""
    raise AssertionError(f"{path}: run through the CLI by the test")


def test_fuzz_issue20_files(tmp_path, capsys):
    """>= 500 bad files of the issue 20 classes (alias bombs, bounds, switches, tiers,
    physics, plot and runs CSVs), each refused with a one-line SpecError that says why;
    counted."""
    rng = random.Random(21)
    tally = Tally("issue 20 bad files")
    for label, path, loader, fragment in _bad_files(tmp_path, rng):
        def load(path=path, loader=loader):
            if loader is _plot_validation:
                code = main(["plot", "validation", str(path), "--out",
                             str(path.with_suffix(".png"))])
                err = capsys.readouterr().err.strip()
                if code == 2 and len(err.splitlines()) == 1:
                    raise SpecError(err.removeprefix("error: "))
                return code
            return loader(path)
        names = (fragment,) if isinstance(fragment, str) else fragment
        result = tally.attempt(load, f"{label} ({path.name})", names)
        tally.must_refuse(result, label, "a bad file")
    _finish(tally, 500)


# Inputs the suite has not seen ------------------------------------------------------------

def test_fuzz_issue20_unseen(tmp_path, capsys):
    """hypothesis (derandomized: the same examples each run) draws option values the lists
    above never name, for predict with --json: every run exits 0 with strict JSON whose
    numbers are finite and which says valid, or 2 with one line. One compilation serves all
    (one program shape); at least 50 of them predict (74 do)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from diffperf import executables

    tally = Tally("issue 20 unseen (hypothesis)")
    lean_model, lean_system = tmp_path / "m.yaml", tmp_path / "s.yaml"
    lean_model.write_text(yaml.safe_dump(_lean(CONFIGS / "models" / "gpt-small.yaml")))
    lean_system.write_text(yaml.safe_dump(_lean(CONFIGS / "systems" / "a100-sxm-80gb.yaml")))
    ints = st.one_of(st.integers(-2**40, 2**40), st.integers(0, 64))
    text = st.one_of(ints.map(str), st.text(max_size=12), st.floats().map(repr))
    option = st.sampled_from(["--tp", "--pp", "--gpus", "--dp", "--micro-batch",
                              "--global-batch", "--seq-len", "--vp", "--cp", "--zero-stage"])
    switch = st.sampled_from(["dropout", "matmul_fp32", "flash_attention", "tp_overlap",
                              "grad_buffers_persist", "checkpoint_interval_s", "zero_shard",
                              "xla_compiled", "ep_overlap"])
    # gpt-small: 12 heads and layers; a layout drawn near the valid ones, then 0-2 raw
    # options and switches the lists above never name.
    layout = st.tuples(st.sampled_from([1, 2, 3, 4, 5, 6, 12]), st.sampled_from([1, 2, 3, 4, 7]),
                       st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]),
                       st.sampled_from([1, 2, 3, 8]), st.sampled_from([64, 128, 1000, 1024,
                                                                       4096]))
    values = st.one_of(st.sampled_from(["0", "1", "0.5", "3600"]), text)

    @settings(max_examples=400, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(layout, st.lists(st.tuples(option, text), max_size=2),
           st.lists(st.tuples(switch, values), max_size=2))
    def run(lay, opts, sets):
        tp, pp, dp, mb, steps, seq = lay
        argv = ["predict", "--model", str(lean_model), "--system", str(lean_system), "--json",
                "--no-cache", "--tp", str(tp), "--pp", str(pp), "--gpus", str(tp * pp * dp),
                "--micro-batch", str(mb), "--global-batch", str(mb * dp * steps),
                "--seq-len", str(seq)]
        for o, v in opts:
            argv.append(f"{o}={v}")
        for f, v in sets:
            argv += ["--set", f"{f}={v}"]
        before = tally.loaded
        _cli(tally, capsys, argv)
        if tally.loaded > before:
            tally.predicted += 1

    executables._LOADED.clear()
    run()
    _finish(tally, 400)
    assert tally.predicted >= 50, tally.report()
