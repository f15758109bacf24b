"""Which communication hides behind which computation, and how much stays exposed.

Exposed = max(0, C - K) per overlap window (PAPERS.md section 1.1); hidden = C - exposed.
"""

from __future__ import annotations

import jax.numpy as jnp

from diffperf.costs.smooth import exposed


def split_exposed(comm_s, window_s, temperature=None):
    """(exposed, hidden) seconds of `comm_s` overlapped with a `window_s` compute window."""
    e = exposed(comm_s, window_s, temperature)
    return e, comm_s - e


def dp_exposed_s(reduce_s, gather_s, zero3_layer_s, zero3_first_s, bwd_window_s,
                 layer_window_s, n_layer_passes, parallel, temperature=None):
    """(exposed, hidden) DP communication of one step, by ZeRO stage:

        ZeRO 0:    AR(grads) overlapped with the last micro-batch's backward (bucketed DDP;
                   Li et al. VLDB 2020): exposed = max(0, T_AR - T_bwd)
        ZeRO 1-2:  RS(grads) overlapped likewise; AG(params) after the step, exposed
        ZeRO 3:    per layer pass, AG fwd + AG bwd + RS grads prefetched behind that layer's
                   compute: m (L/p) max(0, C_l - K_l), plus the first layer's gather
    Source: PAPERS.md sections 5.5 and 2.1 (FSDP) [D]. `dp_overlap` = 0 makes all exposed.
    """
    ov = parallel.dp_overlap
    z = parallel.zero_stage
    e_red, h_red = split_exposed(reduce_s, ov * bwd_window_s, temperature)
    e_l, h_l = split_exposed(zero3_layer_s, ov * layer_window_s, temperature)
    z3_exposed = n_layer_passes * e_l + zero3_first_s
    z3_hidden = n_layer_passes * h_l
    gather_exposed = jnp.where((z >= 1) & (z <= 2), gather_s, 0.0)
    exposed_s = jnp.where(z == 3, z3_exposed, e_red + gather_exposed)
    hidden_s = jnp.where(z == 3, z3_hidden, h_red)
    return exposed_s, hidden_s
