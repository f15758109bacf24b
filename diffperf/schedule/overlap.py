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


def ring_exposed_s(step_s, n_steps, block_window_s, temperature=None):
    """(exposed, hidden) of a ring exchange whose every step hides behind one block's compute:

        exposed = (c - 1) max(0, T_step - K_block),   hidden = (c - 1) T_step - exposed
    Ring attention (PAPERS.md section 5.7 [D]; Liu et al. 2023): while rank r computes the
    attention of its queries against the K/V block it holds (K_block = attention / c), it
    passes that block on and receives the next; hidden iff the block is large enough,
    s/c >= a_kv q_a F / (2 kappa a BW). Example: c = 4, T_step = 30 us, K_block = 20 us:
    3 x 10 us exposed, 3 x 20 us hidden.
    """
    e, h = split_exposed(step_s, block_window_s, temperature)
    return n_steps * e, n_steps * h


def axonn_exposed_s(fwd_ar_s, z_gather_s, bwd_ar_s, z_scatter_s, dw_windows_s, fwd_window_s,
                    bwd_window_s, overlap, temperature=None):
    """(forward exposed, forward hidden, backward exposed, backward hidden) AxoNN collectives
    of one layer, one micro-batch (PAPERS.md section 4.3 [C for what overlaps, D for timing]):

        forward:  all-reduces of partial outputs (X or Y) on the critical path;
                  all-gather of W over Z prefetched behind the layer's forward compute:
                  max(0, T_AG - o K_f)
        backward: all-reduce of dX (Y or X) of linear l behind its dW GEMM (OVERLAP_ALL_REDUCE):
                  sum_l max(0, T_AR,l - o t_dW,l);
                  re-gather of W and reduce-scatter of dW over Z behind the rest of the
                  layer's backward (prefetch, OVERLAP_REDUCE_SCATTER):
                  max(0, T_AG + T_RS - (o K_b - hidden_AR))
    o = `overlap` (1 on, 0 off: then everything is exposed). Arrays [4] (one per linear) for
    the all-reduces and dW windows. Never slower with o = 1 than with o = 0.
    """
    e_ag, h_ag = split_exposed(z_gather_s, overlap * fwd_window_s, temperature)
    e_ar, h_ar = split_exposed(bwd_ar_s, overlap * dw_windows_s, temperature)
    rest = jnp.maximum(overlap * bwd_window_s - jnp.sum(h_ar), 0.0)
    e_z, h_z = split_exposed(z_gather_s + z_scatter_s, rest, temperature)
    return (jnp.sum(fwd_ar_s) + e_ag, h_ag, jnp.sum(e_ar) + e_z, jnp.sum(h_ar) + h_z)
