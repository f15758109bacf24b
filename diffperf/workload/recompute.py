"""Which layers and which ops of a layer are recomputed in the backward (activation
checkpointing), as weights of the mean layer.

Parallel.recompute picks the mode (0 none, 1 selective, 2 full); two framework facts refine it:

- `recompute_layer_frac` (full only): the fraction p of the layers that are checkpointed, the
  others keeping all their activations. fms-fsdp's "selective AC" checkpoints p of the blocks
  (`fms_fsdp/policies/ac_handler.py`, apply_fsdp_checkpointing); TorchTitan's "selective
  layer" AC checkpoints every k-th block (p = 1/k; `parallelize_llama.py`,
  `_apply_ac_to_transformer_block`). p = 1 (default): every layer.
- `recompute_policy` (selective only): 0 Megatron-LM's selective recompute of the attention
  core (Korthikanti et al. 2022, Section 5); 1 TorchTitan's per-op SAC, which saves the
  outputs of every aten.mm but every second one in each block, and of the attention kernel,
  and recomputes all the rest (`sac_recompute_fracs`); 2 the same policy when the linears are
  not aten.mm (Float8 linears run torch._scaled_mm, which is not in the save list): every
  linear is recomputed, the attention kernel is saved.
"""

from __future__ import annotations

import jax.numpy as jnp

from diffperf.workload.flops import is_mla

N_ROWS = 12  # rows of workload.flops.layer_ops' dense Gemms


def full_frac(parallel):
    """phi_full = p under recompute = full (p = recompute_layer_frac), else 0: the share of
    the layers that re-run their whole forward in the backward."""
    return jnp.where(parallel.recompute == 2, parallel.recompute_layer_frac, 0.0)


def megatron_selective_frac(parallel):
    """1 under Megatron's selective recompute (recompute = 1, recompute_policy = 0), else 0."""
    return jnp.where((parallel.recompute == 1) & (parallel.recompute_policy == 0), 1.0, 0.0)


def op_sac_frac(parallel):
    """1 under TorchTitan's per-op SAC (recompute = 1, recompute_policy 1 or 2), else 0."""
    return jnp.where((parallel.recompute == 1) & (parallel.recompute_policy > 0), 1.0, 0.0)


def none_frac(parallel):
    """The share of the layers that keep every activation: 1 under recompute = none,
    1 - p under full recompute of a fraction p of the layers, 0 under selective."""
    return jnp.where(parallel.recompute == 0, 1.0,
                     jnp.where(parallel.recompute == 2, 1.0 - parallel.recompute_layer_frac,
                               0.0))


def sac_recompute_fracs(model, parallel):
    """rho_r: the share of each dense GEMM row of `workload.flops.layer_ops` (forward FLOPs)
    that TorchTitan's per-op SAC recomputes in the backward.

    The policy counts the aten.mm calls of one block's forward and saves the output of the
    odd ones (`_custom_policy`: MUST_SAVE when func is in _save_list and not (func is mm and
    mm_count % 2 == 0)); Llama's block calls wq, wk, wv, wo, then w1, w3, w2 (gated MLP:
    w2(silu(w1 x) * w3 x)) or w1, w2, so the even ones, recomputed, are wk, wo, w3 (gated)
    or wk, wo, w2 (not gated):

        rho_QKV  = a_kv d_qk / (a d_qk + a_kv (d_qk + d_v))   (wk's share of the fused row)
        rho_out  = 1
        rho_up   = 1 / 2 gated (w3 of [w1; w3]), 0 otherwise
        rho_down = 0 gated, 1 otherwise
        rows 4-11 (router, experts, shared experts, MLA) = 0: the policy's call order was
        written for the dense Llama block; MoE and MLA layers are not modelled (taken as saved)
    recompute_policy 2 (Float8 linears run _scaled_mm, not counted or saved): rho = 1 for
    rows 0-3. The attention kernel (SDPA) is saved, every element-wise op (norms, rotary,
    SiLU, product, residual adds) is recomputed.
    Source: pytorch/torchtitan torchtitan/parallelisms/parallelize_llama.py, `_save_list` and
    `_apply_ac_to_transformer_block` at 9dec370 (2024-12-26; `no_recompute_list` at
    1ea476e9f, 2024-04-24, the same policy), model.py Attention.forward, FeedForward.forward.
    Example (Llama 3 8B: a 32, a_kv 8, d 128, gated): rho = (1/6, 1, 1/2, 0): of the dense
    forward's 436.2 MFLOP per token, wk 8.4 + wo 33.6 + w3 117.4 = 159.4 (36.5 %).
    """
    a, akv, dqk = model.n_heads, model.n_kv_heads, model.head_dim
    dv = jnp.where(model.v_head_dim > 0, model.v_head_dim, dqk)
    gated = model.gated_mlp
    not_mla = 1.0 - is_mla(model)
    wk = not_mla * akv * dqk / (a * dqk + akv * (dqk + dv))
    # rows first, then the batch shape of a layout / model table (scalars under vmap)
    policy = parallel.recompute_policy
    batch = jnp.broadcast_shapes(jnp.shape(wk), jnp.shape(gated), jnp.shape(policy))
    one = jnp.ones(batch, jnp.result_type(wk))

    def rows_of(xs):
        return jnp.stack([jnp.broadcast_to(x, batch) for x in xs])

    by_policy = rows_of([wk, one, 0.5 * gated, 1.0 - gated])
    all_linears = rows_of([not_mla, one, one, one])
    rows = jnp.where(jnp.broadcast_to(policy, batch) >= 2, all_linears, by_policy)
    return jnp.concatenate([rows, jnp.zeros((N_ROWS - 4,) + batch, dtype=rows.dtype)])
