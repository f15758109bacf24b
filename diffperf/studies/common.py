"""Shared pieces of the studies: best layouts from a search, shares of the step time, scaled
hardware and elasticities. Pure functions of specs; the CLI loads files and draws figures.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from diffperf.api import _as_float
from diffperf.predict import predict_step
from diffperf.result import EXPOSED_PARTS, HIDDEN_PARTS
from diffperf.search import (_CPU_QUICK_OPTIONS, COLUMNS, PLACEMENTS, enumerate_layouts,
                             parallel_of, search)
from diffperf.specs.batch import anonymous
from diffperf.specs.training import Training
from diffperf.specs.validate import check_inputs

# Layouts per batched search call. With at least 512 distinct outer rows (true of every table
# the studies search) each call has the same shape, so one compilation (every placement is a
# leaf of the same program) serves every model, system and GPU count of every study.
STUDY_CHUNK = 24 * 512
QUICK_PLACEMENTS = PLACEMENTS[:1]  # Megatron-LM's rank order only: fewer layouts to evaluate
# Communication parts of the breakdown (every parallel dimension the model knows).
EXPOSED_COMM = tuple(k for k in EXPOSED_PARTS if k.endswith("_exposed_s"))
HIDDEN_COMM = HIDDEN_PARTS
LAYOUT_FIELDS = COLUMNS[:-1]
# Hardware parameters a study can scale (names of `scaled_system`'s factors).
FACTORS = ("flops", "hbm_bw", "hbm_capacity", "fast_bw", "fast_domain", "net_bw")


@dataclasses.dataclass(frozen=True)
class StudyResult:
    """What a study returns: the numbers behind its figure, and what they say.

    table: column name -> numpy array (one row per plotted point; the CSV the CLI writes).
    summary: headline numbers and verdicts (floats, ints, strings), printed by the CLI.
    notes: sentences for the reader (assumptions, projections, what is not modeled).
    """

    name: str
    title: str
    table: dict
    summary: dict
    notes: tuple = ()


def scaled_system(system, *, flops=1.0, hbm_bw=1.0, hbm_capacity=1.0, fast_bw=1.0,
                  fast_domain=1.0, net_bw=1.0, power=1.0, name=None):
    """The system with its leaves multiplied by factors (traced factors are fine: grad works).

    flops scales every peak rate (16-bit, fp32, FP8 and FP4 matrix, vector); fast_bw and fast_domain
    the innermost tier (NVLink) bandwidth and domain size; net_bw every outer tier's bandwidth.
    """
    inner, *outer = system.tiers
    tiers = (inner.replace(bandwidth_Bps=inner.bandwidth_Bps * fast_bw,
                           domain_size=inner.domain_size * fast_domain),
             *(t.replace(bandwidth_Bps=t.bandwidth_Bps * net_bw) for t in outer))
    out = system.replace(
        matmul_flops_per_s=system.matmul_flops_per_s * flops,
        matmul_fp32_flops_per_s=system.matmul_fp32_flops_per_s * flops,
        matmul_fp8_flops_per_s=system.matmul_fp8_flops_per_s * flops,
        matmul_fp4_flops_per_s=system.matmul_fp4_flops_per_s * flops,
        vector_flops_per_s=system.vector_flops_per_s * flops,
        hbm_bandwidth_Bps=system.hbm_bandwidth_Bps * hbm_bw,
        hbm_capacity_bytes=system.hbm_capacity_bytes * hbm_capacity,
        power_W=system.power_W * power, tiers=tiers)
    return out if name is None else out.replace(name=name)


def search_layouts(model, system, n_devices, global_batch, training=None, *,
                   placements=PLACEMENTS):
    """(layout table, Result of numpy arrays) of every valid layout (diffperf.search)."""
    layouts = enumerate_layouts(model, n_devices, global_batch, placements=placements)
    result = search(model, system, training, layouts, placements=placements,
                    chunk=STUDY_CHUNK, validate=False, optimize=True)
    return layouts, result


def best_index(result, mask=None):
    """Index of the fastest layout that fits (within `mask`), or None when none does."""
    step = np.where(np.asarray(result.fits), np.asarray(result.step_time_s), np.inf)
    if mask is not None:
        step = np.where(mask, step, np.inf)
    i = int(np.argmin(step))
    return i if np.isfinite(step[i]) else None


def column(layouts, name):
    """One column of a layout table by name."""
    return layouts[:, COLUMNS.index(name)]


def result_summary(result, i) -> dict:
    """Entry i of a batched Result as flat numbers: step time, throughput, memory, shares.

    Shares are fractions of the step time T: the exposed parts sum to 1; hidden communication
    ran concurrently with compute, so comm_hidden_frac is hidden seconds / T (it can exceed 1).
    """
    b = result.breakdown
    T = float(result.step_time_s[i])
    part = {k: float(getattr(b, k)[i]) for k in (*EXPOSED_PARTS, *HIDDEN_PARTS)}
    out = dict(step_time_s=T, tokens_per_s=float(result.tokens_per_s[i]),
               mfu=float(result.mfu[i]), memory_GiB=float(result.memory.total_bytes[i]) / 2**30,
               capacity_GiB=float(result.memory.capacity_bytes[i]) / 2**30,
               model_flops=float(result.model_flops[i]),
               hardware_flops=float(result.hardware_flops[i]),
               comm_exposed_frac=sum(part[k] for k in EXPOSED_COMM) / T,
               comm_hidden_frac=sum(part[k] for k in HIDDEN_COMM) / T)
    return out | {k[:-2] + "_frac": part[k] / T for k in (*EXPOSED_PARTS, *HIDDEN_PARTS)}


def row_summary(layouts, result, i, placements=PLACEMENTS) -> dict:
    """Layout i of a search (its degrees and placement) and `result_summary` of it."""
    out = {c: int(layouts[i, j]) for j, c in enumerate(LAYOUT_FIELDS)}
    out["placement"] = "-".join(placements[int(layouts[i, -1])])
    return out | result_summary(result, i)


def quick_jit(fn):
    """`jax.jit(fn)`, compiled with XLA:CPU's quick-compiling options on the CPU backend.

    The studies call these kernels a handful of times, so compilation dominates: at LLVM -O0
    the gradient of a prediction compiles ~5x faster than with XLA's defaults on 2 cores
    (diffperf.search, _CPU_QUICK_OPTIONS; results are unchanged). Other backends keep defaults.
    """
    cpu = jax.jit(fn, compiler_options=_CPU_QUICK_OPTIONS)
    other = jax.jit(fn)

    def call(*args):
        return (cpu if jax.default_backend() == "cpu" else other)(*args)

    return call


def _log_step_time(log_factors, model, parallel, system, training):
    f = jnp.exp(log_factors)
    scaled = scaled_system(system, **dict(zip(FACTORS, f)))
    return jnp.log(predict_step(model, parallel, scaled, training, None,
                                checked=True).step_time_s)


_elasticity = quick_jit(jax.grad(_log_step_time))


def elasticities(model, parallel, system, training=None) -> dict:
    """d ln T / d ln theta at a fixed layout, for each hardware factor in FACTORS (jax.grad).

    Dimensionless: -0.2 means +10% of theta gives about -2% step time. HBM capacity is 0 by
    construction at a fixed layout (capacity only decides which layouts fit; see
    `researched_elasticity`). One compilation for every model, layout and system of a
    given tier count.
    """
    training = Training() if training is None else training
    # validated here, so the program leaves out the in-program mask (predict_step `checked`;
    # the factors are 1 at the point where the gradient is taken)
    check_inputs(model, parallel, system, training)
    args = _as_float((anonymous(model), anonymous(parallel), anonymous(system),
                      anonymous(training)))
    g = _elasticity(jnp.zeros(len(FACTORS), jnp.result_type(float)), *args)
    return dict(zip(FACTORS, np.asarray(g, dtype=float).tolist()))


def researched_elasticity(t_base_s, t_scaled_s, factor) -> float:
    """ln(T_best(theta x k) / T_best(theta)) / ln k: the elasticity of the best step time when
    the layout is searched again at the new hardware (a finite difference over factor k)."""
    return float(np.log(t_scaled_s / t_base_s) / np.log(factor))


def best_parallel(layouts, i, placements=PLACEMENTS):
    """Row i of a layout table as a `Parallel`."""
    return parallel_of(layouts[i], placements)


def columns_of(rows) -> dict:
    """A list of flat dicts as a table: key -> numpy array, keys in order of first appearance.

    A row without a key gets "" in a text column and nan in a numeric one (long-format tables
    mix kinds of rows)."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    out = {}
    for k in keys:
        values = [r[k] for r in rows if k in r]
        blank = "" if isinstance(values[0], str) else np.nan
        out[k] = np.asarray([r.get(k, blank) for r in rows])
    return out
