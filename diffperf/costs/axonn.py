"""Collective times of AxoNN's 3D tensor grid (PAPERS.md section 4.2, ring costs of 5.9)."""

from __future__ import annotations

import jax.numpy as jnp

from diffperf.costs.collectives import all_gather_s, all_reduce_s, reduce_scatter_s
from diffperf.workload.axonn import axonn_strides


def _issued(time_s, S):
    """A collective of zero bytes is not issued: no latency, no call overhead."""
    return jnp.where(S > 0, time_s, 0.0)


def axonn_times_s(volumes, parallel, base_stride, system):
    """Seconds of each collective of `workload.axonn.AxonnVolumes` (arrays, one per linear):

        T_Z,AG = AG(S_z, G_z), T_X = AR(S_x, G_x), T_Y = AR(S_y, G_y), T_Z,RS = RS(S_rs, G_z)
    on the tiers each group spans, with strides X = base, Y = base G_x, Z = base G_x G_y
    (PAPERS.md section 4.1: X innermost). Ring form per tier (Thakur et al. 2005; section 4.2:
    T_X = 2 (G_x - 1)/G_x S_x / BW_x + 2 (G_x - 1) alpha, and so on; section 5.9).
    Returns a dict with the fields of AxonnVolumes except `data` (run by the DP reduction).
    Example: S_x = 16.8 MB, G_x = 2 inside an NVLink node (450 GB/s x 0.8, 2.5 us):
    t0 + 5 us + 16.8e6 / 360e9 = t0 + 51.7 us.
    """
    sx, sy, sz = axonn_strides(base_stride, parallel)
    v = volumes
    return dict(
        z_gather=_issued(all_gather_s(v.z_gather, parallel.gz, sz, system), v.z_gather),
        x_forward=_issued(all_reduce_s(v.x_forward, parallel.gx, sx, system), v.x_forward),
        y_forward=_issued(all_reduce_s(v.y_forward, parallel.gy, sy, system), v.y_forward),
        x_backward=_issued(all_reduce_s(v.x_backward, parallel.gx, sx, system), v.x_backward),
        y_backward=_issued(all_reduce_s(v.y_backward, parallel.gy, sy, system), v.y_backward),
        z_scatter=_issued(reduce_scatter_s(v.z_scatter, parallel.gz, sz, system), v.z_scatter),
    )
