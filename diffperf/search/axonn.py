"""Choosing AxoNN's 4D grid: rank every (G_x, G_y, G_z, G_data) by its modeled communication.

Source: Singh et al. SC24 (AxoNN), PAPERS.md section 4.4 [A; D]: enumerate the grids whose
product is the number of GPUs and that shard every weight evenly, rank them by the
communication model of section 4.2, and try the top few. The paper's exact ranking rule could
not be read; this ranks by the total (not only exposed) collective time of one step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from diffperf.api import _as_float
from diffperf.costs.axonn import axonn_times_s
from diffperf.costs.collectives import all_reduce_s
from diffperf.errors import SpecError
from diffperf.memory.device import device_memory
from diffperf.memory.xla import select_memory, xla_device_memory
from diffperf.specs.batch import anonymous
from diffperf.specs.parallel import Parallel
from diffperf.specs.training import Training
from diffperf.search.enumerate import _divisors
from diffperf.specs.validate import check_layout
from diffperf.workload.axonn import axonn_layer_volumes
from diffperf.workload.groups import stride

GRID_COLUMNS = ("gx", "gy", "gz", "dp")


def axonn_comm_s(model, parallel, system, training):
    """Modeled communication seconds of one step on the AxoNN grid (all collectives, hidden or
    not; PAPERS.md section 4.2):

        T = m L [ sum_l (2 T_Z,AG + T_X + T_Y + T_Z,RS) ] + T_data
    m micro-batches, L layers (pp = 1), the sum over a layer's four linears of the forward and
    backward all-gathers over Z, the all-reduces over X and Y, the reduce-scatter over Z; and
    once per step the data-parallel all-reduce of every layer's dW shard,
    T_data = AR(L sum_l n_out k_in q_g / (G_x G_y G_z), G_data).
    Placement: X stride 1, Y stride G_x, Z stride G_x G_y, data stride G (section 4.1).
    """
    placed = parallel.replace(tp=parallel.gx * parallel.gy * parallel.gz)
    vol = axonn_layer_volumes(model, parallel, training)
    t = axonn_times_s(vol, parallel, stride(placed, "tp"), system)
    layer = jnp.sum(2.0 * t["z_gather"] + t["x_forward"] + t["y_forward"] + t["x_backward"]
                    + t["y_backward"] + t["z_scatter"])
    data = all_reduce_s(model.n_layers * jnp.sum(vol.data), parallel.dp, stride(placed, "dp"),
                        system)
    return parallel.n_microbatches * model.n_layers * layer + data


def _comm_and_memory(model, parallel, system, training):
    # The memory predict reports: XLA's live sets for an XLA-compiled training (memory.xla).
    memory = select_memory(training, xla_device_memory(model, parallel, system, training),
                           device_memory(model, parallel, system, training))
    return axonn_comm_s(model, parallel, system, training), memory.total_bytes, (
        memory.total_bytes <= memory.capacity_bytes)


@jax.jit
def _comm_batch(model, parallel, system, training):
    return jax.vmap(_comm_and_memory, in_axes=(None, Parallel(
        **{f: (0 if f in GRID_COLUMNS else None)
           for f in Parallel.__dataclass_fields__}), None, None))(
        model, parallel, system, training)


def axonn_grids(model, n_gpus, global_batch, micro_batch=1) -> np.ndarray:
    """Every (gx, gy, gz, dp) with gx gy gz dp = n_gpus that `check_layout` accepts for the
    model (PAPERS.md section 4.4: n_out % G_y, k_in % G_x, (n_out k_in)/(G_x G_y) % G_z, and
    the batch split over dp x gz), as an int table [n, 4]."""
    n = int(n_gpus)
    d = _divisors(n)  # O(sqrt(n)) memory, not an arange to n
    rows = np.array([(x, y, z, n // (x * y * z)) for x in d for y in d for z in d
                     if n % (x * y * z) == 0], dtype=np.int64)
    ok = np.ones(len(rows), dtype=bool)
    for i, (x, y, z, g) in enumerate(rows):
        try:
            check_layout(model, Parallel(gx=x, gy=y, gz=z, dp=g, micro_batch=micro_batch,
                                         global_batch=global_batch))
        except SpecError:
            ok[i] = False
    if not ok.any():
        raise SpecError(f"no AxoNN grid of n_gpus={n} shards model '{model.name}' evenly with "
                        f"global_batch={global_batch}, micro_batch={micro_batch}")
    return rows[ok]


def best_axonn_grid(model, system, n_gpus, training=None, *, global_batch, micro_batch=1,
                    zero_stage=0, recompute=0, fits_only=True, top=None) -> list[dict]:
    """AxoNN grids of `n_gpus` ranked by modeled communication time per step, fastest first.

    Args:
        model, system, training: specs (training defaults to `Training()`).
        n_gpus: G_x G_y G_z G_data.
        global_batch, micro_batch: sequences per step, and per micro-batch of one (z, data)
            slice (m = B / (G_data G_z b)).
        zero_stage, recompute: the rest of the layout, for the memory check.
        fits_only: drop the grids whose memory per device (memory.device) exceeds the usable
            capacity (pure data parallelism always has the least communication; the grid is
            there to fit the model).
        top: keep only the first `top` grids (None: all).
    Returns:
        [{"gx", "gy", "gz", "dp", "comm_s", "memory_bytes", "fits"}] sorted by comm_s (ties
        keep enumeration order); empty when fits_only and no grid fits.
    Example: gpt-small on 8 GPUs of one node ranks the grids by their collective time; the
    group that carries the activations (X) lands on NVLink first (PAPERS.md 6, AxoNN (ii)).
    """
    training = Training() if training is None else training
    grids = axonn_grids(model, n_gpus, global_batch, micro_batch)
    dtype = jnp.result_type(float)
    cols = {c: np.asarray(grids[:, i], dtype=dtype) for i, c in enumerate(GRID_COLUMNS)}
    parallel = _as_float(Parallel(**cols, micro_batch=micro_batch, global_batch=global_batch,
                                  zero_stage=zero_stage, recompute=recompute))
    model_, system_, training_ = _as_float((anonymous(model), anonymous(system),
                                           anonymous(training)))
    comm, mem, fits = (np.asarray(x) for x in _comm_batch(model_, parallel, system_, training_))
    order = np.argsort(comm, kind="stable")
    order = order[fits[order]] if fits_only else order
    order = order if top is None else order[:top]
    return [dict(gx=int(grids[i, 0]), gy=int(grids[i, 1]), gz=int(grids[i, 2]),
                 dp=int(grids[i, 3]), comm_s=float(comm[i]), memory_bytes=float(mem[i]),
                 fits=bool(fits[i])) for i in order]
