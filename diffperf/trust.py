"""What a prediction may claim: the shipped default efficiency set of each GPU generation, the
envelope it was measured on, and the interval a prediction carries inside and outside it.

An efficiency set (configs/efficiency/GPU.yaml) holds
  efficiency   the fitted Efficiency fields (an overlay, as `diffperf calibrate` writes);
  regimes      measured regimes, each with the range its runs span (`envelope`: GPU,
               precisions, tp, pp, dp, cp, ep, GPUs and micro-batch as [low, high], ZeRO
               stages, recompute modes), its framework facts (text) and the held-out error
               of the set's predictions there: `q95_log`, the 95 % split-conformal quantile of
               |log(measured / predicted)| of runs the set never saw (intervals.
               conformal_quantile), the runs' MAPE and median signed error, and
               `validated`. The first regime is the fit's own (`fit`).
The set's envelope is the union of its VALIDATED regimes: the fit's own (`fit`, held-out rows
of the fitted data) and held-out regimes where its MAPE is at most VALIDATED_MAPE_PCT. A
prediction inside carries [T e^-q, T e^q], q = the q95_log of the regime that holds it.
Outside it carries q = max(q_fit, q_near), q_near = q95_log of the NEAREST extrapolation
regime (a measured regime that is not validated; `trust`): the interval widens to the error
measured where the set was extrapolated. Without such a regime, or with no regimes at all
(physics defaults), q = `UNMEASURED_Q` (x/÷ e^0.5 = 1.65; docs/trust.md).

Distance of a layout to a regime envelope (`envelope_distance`): the sum over the numeric
dimensions (tp, pp, dp, cp, ep, GPUs, micro-batch) of |log2| of how far the value lies outside
[low, high] (0 inside), plus 1 per categorical dimension (ZeRO stage, recompute, precision,
GPU generation) whose value is not in the regime's list, weighted CATEGORY_WEIGHT. Inside =
distance 0; the envelope score reported is 1 / (1 + distance to the nearest validated regime)
(1 inside, falling with each doubling outside).
Everything here is numpy over a whole layout table: one call scores every layout of a search.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from diffperf.errors import SpecError
from diffperf.specs.parallel import RECOMPUTE_MODULE_DEFAULTS, RECOMPUTE_MODULES

GPU_GENERATIONS = ("a100", "h100", "h200", "b200", "b300", "mi300x", "tpu-v5p")
NUMERIC_DIMS = ("tp", "pp", "dp", "cp", "ep", "gpus", "micro_batch")
CATEGORICAL_DIMS = ("zero_stage", "recompute", "precision", "gpu")
RECOMPUTE = ("none", "selective", "full")
NOT_A_MODE = -1.0  # layout_columns' recompute of a layout no RECOMPUTE mode describes
UNMEASURED_Q = 0.5  # log half-width where no held-out error is known (x/÷ 1.65)
VALIDATED_MAPE_PCT = 10.0  # a held-out regime joins the envelope when the set's MAPE there
                           # is at most this (issue 21's target for held-out runs)
CATEGORY_WEIGHT = 4.0  # distance of a different ZeRO stage / recompute / precision / GPU:
                       # as far as 4 doublings (16x) of a degree
PHYSICS = "physics-defaults"


def _efficiency_dir() -> Path:
    from diffperf.load import _configs_dir

    return _configs_dir() / "efficiency"


def default_set(gpu: str) -> dict:
    """The shipped efficiency set of a GPU generation (configs/efficiency/GPU.yaml), or, for a
    GPU with no measurements (or gpu ''), the physics defaults: {'name': 'physics-defaults',
    'gpu': gpu, 'measured': False, 'efficiency': {}} (no held-out error, no envelope)."""
    from diffperf.load import read_yaml

    path = _efficiency_dir() / f"{gpu}.yaml"
    if not gpu or not path.is_file():
        return dict(name=PHYSICS, gpu=gpu, measured=False, efficiency={}, regimes=[],
                    path=None,
                    note=(f"no measured runs of GPU '{gpu or '?'}': the physics defaults "
                          f"(specs.system.Efficiency), with no held-out error"))
    d = read_yaml(path)
    return _checked(d, str(path)) | dict(path=str(path), measured=True)


def overlay_set(path) -> dict:
    """The efficiency set of a user's overlay YAML: its envelope and regimes when it has them
    (a set under configs/efficiency), else measured=True with no envelope."""
    from diffperf import resources
    from diffperf.load import read_yaml

    path = resources.overlay_path(path)  # a shipped name ('vtrain-a100') or a path
    d = read_yaml(Path(path))
    if "regimes" in d:
        return _checked(d, str(path)) | dict(path=str(path), measured=True)
    held = (d.get("heldout") or {}).get("heldout") or {}
    return dict(name=Path(path).stem, gpu="", measured=True, efficiency=d.get("efficiency") or {},
                regimes=[], path=str(path),
                note="user overlay without an envelope: inside/outside unknown",
                heldout_mape_pct=held.get("mape_pct"))


def _checked(d: dict, where: str) -> dict:
    from diffperf.load import Yaml11Number, _number

    regimes = d.get("regimes") or []
    if not regimes or regimes[0].get("name") != "fit":
        raise SpecError(f"{where}: 'regimes' must start with the set's own regime 'fit'")
    for r in regimes:
        if not isinstance(r.get("q95_log"), (int, float)) or r["q95_log"] < 0:
            raise SpecError(f"{where}: regime {r.get('name')!r}.q95_log must be a number >= 0")
        if not isinstance(r.get("envelope"), dict):
            raise SpecError(f"{where}: regime {r.get('name')!r}.envelope must be a mapping")
        for k, bounds in r["envelope"].items():  # `envelope_distance` reads them with float()
            for x in bounds if isinstance(bounds, list) else [bounds]:
                if isinstance(x, Yaml11Number):  # '1_6', '0x10': refused as in every input
                    _number({k: x}, k, f"{where}: regime {r.get('name')!r}.envelope")
    return dict(d, regimes=regimes)


def resolve(system, calibration):
    """(system with the efficiency set applied, set record) for a prediction command.

    calibration None: the shipped default set of system.gpu (`default_set`); 'none' or
    'physics': the physics defaults whatever the GPU; a path: the user's overlay."""
    from diffperf.load import apply_overlay

    if calibration in ("none", "physics"):
        return system, dict(name=PHYSICS, gpu=system.gpu, measured=False, efficiency={},
                            regimes=[], path=None,
                            note="physics defaults asked for (--calibration none)")
    if calibration is not None:
        return apply_overlay(system, calibration), overlay_set(calibration)
    s = default_set(system.gpu)
    if not s["measured"]:
        return system, s
    return apply_overlay(system, s["path"]), s


def unnamed_recompute(recompute, recompute_policy=0.0, recompute_layer_frac=1.0,
                      modules=None):
    """The recompute column with NOT_A_MODE where the layout's recompute is no mode of
    RECOMPUTE: TorchTitan's per-op SAC (recompute_policy > 0 with 'selective'), a fraction
    of the layers checkpointed (recompute_layer_frac < 1 with 'full'), or Megatron-Core
    recompute_modules other than the default ["core_attn"] with 'selective' (`modules`: a
    mapping {module: value} of Parallel.recompute_<module>, workload.recompute). The regimes
    list a mode only where runs measured it as a layout names it (calibration/trust_sets.
    envelope_of), so such a layout lies inside none of them."""
    r = np.atleast_1d(np.asarray(recompute, float))
    op_sac = (np.asarray(recompute_policy, float) > 0) & (r == 1)
    partial = (np.asarray(recompute_layer_frac, float) < 1) & (r == 2)
    other = np.zeros_like(r, dtype=bool)
    for m, v in (modules or {}).items():
        other = other | (np.asarray(v, float) != RECOMPUTE_MODULE_DEFAULTS[m])
    return np.where(op_sac | partial | (other & (r == 1)), NOT_A_MODE, r)


def recompute_modules_of(source, default_of=getattr) -> dict:
    """{module: value} of the recompute_<module> fields a Parallel (or a --set mapping) has."""
    out = {}
    for m in RECOMPUTE_MODULES:
        v = default_of(source, f"recompute_{m}", None)
        if v is not None:
            out[m] = v
    return out


def layout_columns(parallel_or_table, columns=None, gpus=None) -> dict:
    """{dim: float array} of the numeric and ZeRO / recompute dims of a layout table (rows =
    layouts, `columns` = search.COLUMNS) or of one Parallel (a 1-row table)."""
    if columns is None:
        p = parallel_or_table
        out = {k: np.atleast_1d(np.asarray(getattr(p, k), float))
               for k in ("tp", "pp", "dp", "cp", "ep", "micro_batch", "zero_stage", "recompute",
                         "gx", "gy", "gz")}
        out["recompute"] = unnamed_recompute(out["recompute"],
                                             getattr(p, "recompute_policy", 0.0),
                                             getattr(p, "recompute_layer_frac", 1.0),
                                             recompute_modules_of(p))
    else:
        t = np.asarray(parallel_or_table, float)
        out = {k: t[:, columns.index(k)] for k in ("tp", "pp", "dp", "cp", "ep", "micro_batch",
                                                   "zero_stage", "recompute", "gx", "gy", "gz")}
    n = out["tp"] * out["pp"] * out["dp"] * out["cp"] * out["gx"] * out["gy"] * out["gz"]
    out["gpus"] = n if gpus is None else np.full_like(out["tp"], float(gpus))
    return out


def envelope_distance(cols: dict, envelope: dict, precision: str, gpu: str) -> np.ndarray:
    """Distance of every layout (`layout_columns`) to an envelope (module docstring): 0 inside.
    Example: envelope tp [1, 8], layout tp 16: 1 (one doubling outside); zero_stage [0, 1] and
    layout ZeRO-3: + CATEGORY_WEIGHT = 4."""
    n = len(cols["tp"])
    d = np.zeros(n)
    for k in NUMERIC_DIMS:
        if k not in envelope:
            continue
        lo, hi = (float(x) for x in envelope[k])
        v = np.maximum(cols[k], 1e-9)
        d += np.where(v < lo, np.log2(lo / v), 0.0) + np.where(v > hi, np.log2(v / hi), 0.0)
    w = CATEGORY_WEIGHT
    if "zero_stage" in envelope:
        d += w * ~np.isin(cols["zero_stage"], [float(z) for z in envelope["zero_stage"]])
    if "recompute" in envelope:
        allowed = [float(RECOMPUTE.index(r)) for r in envelope["recompute"]]
        d += w * ~np.isin(cols["recompute"], allowed)
    if "precision" in envelope:
        d += w * float(precision not in envelope["precision"])
    if "gpu" in envelope:
        d += w * float(gpu not in envelope["gpu"])
    d += w * (cols["gx"] * cols["gy"] * cols["gz"] > 1)  # the AxoNN grid: never measured
    return d if n else np.zeros(0)


def trust(cols: dict, tset: dict, precision: str, gpu: str) -> dict:
    """Per layout: inside (bool), score = 1 / (1 + distance to the nearest validated regime),
    q (log half-width of the 95 % interval) and the regime it came from.

    inside = inside some VALIDATED regime (the fit's own, or a held-out one where the set's
    error is within VALIDATED_MAPE_PCT); q = the smallest q95_log of those that hold it.
    Outside: q = max(q_fit, q_near), q_fit the set's own held-out q (regimes[0]) and q_near
    that of the nearest EXTRAPOLATION regime: the nearest (`envelope_distance`) of the
    measured regimes that are not validated, where the set's error was measured because it
    is large; UNMEASURED_Q when the set has none. A set without regimes (physics defaults,
    an overlay without an envelope): inside False, score 0, q = UNMEASURED_Q.
    """
    n = len(cols["tp"])
    regimes = tset.get("regimes") or []
    if not regimes:
        return dict(inside=np.zeros(n, bool), score=np.zeros(n), q=np.full(n, UNMEASURED_Q),
                    regime=np.array(["unmeasured"] * n, dtype=object))
    dist = np.stack([envelope_distance(cols, r["envelope"], precision, gpu) for r in regimes])
    q = np.array([float(r["q95_log"]) for r in regimes])
    names = np.array([r["name"] for r in regimes], dtype=object)
    valid = np.array([bool(r.get("validated")) for r in regimes])
    holds = (dist == 0) & valid[:, None]
    inside = holds.any(axis=0)
    q_inside = np.where(holds, q[:, None], np.inf).min(axis=0)
    in_name = names[np.argmin(np.where(holds, q[:, None], np.inf), axis=0)]
    d_valid = np.where(valid[:, None], dist, np.inf).min(axis=0) if valid.any() else \
        np.full(n, np.inf)
    if (~valid).any():
        # the nearest extrapolation regime: least distance, ties to the larger error
        key = np.where(~valid[:, None], dist - 1e-6 * q[:, None], np.inf)
        near = np.argmin(key, axis=0)
        q_out, out_name = np.maximum(q[0], q[near]), names[near]
    else:
        q_out = np.full(n, max(q[0], UNMEASURED_Q))
        out_name = np.array(["unmeasured"] * n, dtype=object)
    return dict(inside=inside, score=1.0 / (1.0 + d_valid),
                q=np.where(inside, q_inside, q_out),
                regime=np.where(inside, in_name, out_name))


def interval(step_s, q):
    """(low, high) seconds of the 95 % interval [T e^-q, T e^q]."""
    step_s, q = np.asarray(step_s, float), np.asarray(q, float)
    return step_s * np.exp(-q), step_s * np.exp(q)


def describe(tset: dict) -> dict:
    """The JSON record of a set: name, gpu, measured, path, held-out error inside, note."""
    out = dict(name=tset.get("name"), gpu=tset.get("gpu"), measured=bool(tset.get("measured")),
               path=tset.get("path"))
    if tset.get("regimes"):
        r = tset["regimes"][0]
        out |= dict(heldout_mape_pct=r.get("mape_pct"), heldout_q95_log=r.get("q95_log"),
                    heldout_n=r.get("n"), heldout_runs=r.get("runs"))
    elif tset.get("heldout_mape_pct") is not None:
        out["heldout_mape_pct"] = tset["heldout_mape_pct"]
    if tset.get("note"):
        out["note"] = tset["note"]
    return out


def describe_text(tset: dict) -> str:
    """One line for the text output of predict / search / validate."""
    d = describe(tset)
    if not d["measured"]:
        return f"efficiency set: {d['name']} ({d.get('note', '')})"
    if "heldout_q95_log" in d:
        return (f"efficiency set: {d['name']} ({d['path']}), held-out error inside its envelope:"
                f" MAPE {d['heldout_mape_pct']:.3g} % on {d['heldout_n']} runs "
                f"({d['heldout_runs']}), 95 % interval x/÷ {np.exp(d['heldout_q95_log']):.3g}")
    mape = d.get("heldout_mape_pct")
    return (f"efficiency set: {d['name']} ({d['path']})"
            + (f", held-out MAPE {mape:.3g} %" if mape is not None else "")
            + "; no envelope recorded")
