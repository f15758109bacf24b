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
  and recomputes all the rest (`sac_recompute_fracs`; torchao's Float8 linears too: the
  policy sees their Float8Tensor mm as aten.mm); 2 the same policy when the linears are not
  seen as aten.mm (a linear that calls torch._scaled_mm itself, which is not in the save
  list): every linear is recomputed, the attention kernel is saved.

Under Megatron's selective recompute (recompute_policy 0) the modules re-run are Megatron-Core's
`recompute_modules`, one 0/1 field of Parallel each (`MODULES`; default ["core_attn"], as
Megatron-Core's TransformerConfig.__post_init__ sets it): `megatron_module_fracs`,
`megatron_recompute_rows` (their GEMMs), `megatron_recompute_bytes` (their element-wise
forward traffic), memory.activations.megatron_dropped_bytes (what they no longer keep).
"""

from __future__ import annotations

import jax.numpy as jnp

from diffperf.specs.parallel import RECOMPUTE_MODULES
from diffperf.workload.flops import (head_shards, is_mla, moe_layer_fraction,
                                     shared_expert_width, tokens_per_device,
                                     unfused_core_attention_bytes)

N_ROWS = 12  # rows of workload.flops.layer_ops' dense Gemms
MODULES = RECOMPUTE_MODULES  # Parallel.recompute_<module> (specs.parallel)


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
    recompute_policy 2 (linears whose GEMM the policy does not see as aten.mm, e.g. one that
    calls torch._scaled_mm itself: not counted, not saved): rho = 1 for rows 0-3. torchao's
    Float8Linear (eab345c, TorchTitan's 2024-12 benchmark) is policy 1, not 2: it calls
    torch.mm on Float8Tensor operands, and SAC's _CachingTorchDispatchMode, a dispatch mode,
    runs before the subclass's __torch_dispatch__ turns aten.mm into torch._scaled_mm, so it
    counts the call and saves (tags, under torch.compile) its bf16 output as for bf16
    (docs/accuracy-hopper.md "Session 14: low-precision activations in memory"; TorchTitan
    measures its Float8 rows at the memory of its compiled bf16 ones). The attention
    kernel (SDPA) is saved, every element-wise op (norms, rotary, SiLU, product, residual
    adds) is recomputed.
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


def megatron_module_fracs(parallel) -> dict:
    """{module: 1 where Megatron's selective recompute (recompute = 1, recompute_policy = 0)
    re-runs it, else 0} for each of `MODULES` (Parallel.recompute_<module>)."""
    sel = megatron_selective_frac(parallel)
    return {m: sel * getattr(parallel, f"recompute_{m}") for m in MODULES}


def separate_norms(model):
    """n_norm: the norms of the mean layer that are modules of their own, which "layernorm"
    recomputes (Megatron-Core TransformerLayer.__init__: recompute_input_layernorm /
    recompute_pre_mlp_layernorm only where the norm is not an IdentityOp):

        n_norm = mla + phi
    Megatron-Core's Transformer Engine layer spec (models/gpt/gpt_layer_specs.py,
    get_gpt_layer_with_transformer_engine_spec, core_v0.16.0) fuses the input norm into the
    QKV linear (TELayerNormColumnParallelLinear; input_layernorm = IdentityOp) except with
    multi-latent attention (input_layernorm = TENorm: the down-projections are plain
    TELinear), and the pre-MLP norm into fc1 except in MoE layers (pre_mlp_layernorm =
    TENorm when num_experts: the router reads the norm's output). phi = moe_layer_fraction.
    Example: DeepSeek-V3 (MLA, 58 of 61 MoE layers): 1 + 58/61 = 1.951; GPT-OSS: 1.
    """
    return is_mla(model) + moe_layer_fraction(model)


def megatron_recompute_rows(model, parallel):
    """rho_r: the share of each dense GEMM row of `workload.flops.layer_ops` that the
    selective recompute modules (`megatron_module_fracs`) re-run in the backward:

        rows 2, 3 (dense MLP up, down)      = mlp            (the counts carry 1 - phi)
        rows 7, 8 (shared expert up, down)  = shared_experts
        rows 0, 11 (MLA W^UQ;W^QR, W^UK;W^UV) = mla_up_proj x mla
        the rest 0 (core_attn: the attention core, `layer_ops(...).attention`, not a row;
                    moe_act and layernorm re-run element-wise ops only)
    Source (Megatron-Core core_v0.16.0): transformer/transformer_layer.py
    TransformerLayer._forward_mlp (`recompute_mlp`: tensor_parallel.checkpoint / te_checkpoint
    of self.mlp, set in __init__ only when the MLP is not a MoELayer);
    transformer/moe/shared_experts.py / moe_layer.py (`shared_experts_recompute`: the shared
    experts' forward under tensor_parallel.checkpoint); transformer/multi_latent_attention.py
    get_query_key_value_tensors (`recompute_up_proj`: qkv_up_proj_and_rope_apply, the q and kv
    up-projections with their fused latent norms and the RoPE, under CheckpointWithoutOutput,
    re-run when the attention output's gradient arrives).
    Example (DeepSeek-V3, mla_up_proj): rho = 1 on rows 0 and 11, 0 elsewhere.
    """
    f = megatron_module_fracs(parallel)
    mla = f["mla_up_proj"] * is_mla(model)
    zero = jnp.zeros_like(mla * f["mlp"] * f["shared_experts"])
    rows = [mla, zero, f["mlp"], f["mlp"], zero, zero, zero, f["shared_experts"],
            f["shared_experts"], zero, zero, mla]
    return jnp.stack(jnp.broadcast_arrays(*rows))


def megatron_recompute_bytes(model, parallel, training):
    """HBM bytes of the element-wise forward ops the selective recompute modules re-run, one
    layer, one micro-batch, on one device (the terms of `workload.flops.elementwise_bytes`
    that belong to each module, so that a module's recompute costs what its forward costs):

        mlp:            (1 - phi) q_a [ T f (2 + g) / t + 2 T_sp h ]
                        (activation of the dense MLP, and the pre-MLP norm fused into fc1:
                         read, write)
        moe_act:        phi q_a T k C_f f_e (2 + g) / t             (routed experts' activation)
        shared_experts: phi q_a T E_s f_s (2 + g) / t               (shared experts' activation)
        layernorm:      n_norm 2 q_a T_sp h                         (`separate_norms`: read, write)
        mla_up_proj:    mla 4 q_a T (r_q + r_kv)                     (the latent norms fused into
                                                                      the up-projections)
        core_attn:      B_core  (unfused attention's scores, softmax and attention-probs
                                 dropout: `workload.flops.unfused_core_attention_bytes`; 0 with
                                 flash attention, whose re-run is the attention time)
    T = b s / c, T_sp = T / t with sequence parallelism, g = gated_mlp, phi = moe_layer_fraction.
    Source: Megatron-Core core_v0.16.0 transformer/moe/experts.py TEGroupedMLP.forward
    (`activation_recompute`: bias_act_func under CheckpointWithoutOutput, discarded after fc2
    and re-run before fc2's backward), transformer/transformer_layer.py (input /
    pre-MLP norm under CheckpointWithoutOutput); the rest as `megatron_recompute_rows`.
    The dense layers' pre-MLP norm is part of the checkpointed MLP: the Transformer Engine
    layer spec (models/gpt/gpt_layer_specs.py, get_gpt_layer_with_transformer_engine_spec)
    sets pre_mlp_layernorm = IdentityOp when the layer has no experts and builds linear_fc1
    as TELayerNormColumnParallelLinear, so `recompute_mlp` re-runs the norm with fc1 (the
    norm output it rebuilds is what memory.activations.megatron_dropped_bytes drops).
    Example (GPT-OSS 120B, b 1, s 4096, t 1, bf16, moe_act + layernorm; k 4, f_e 2880, h 2880):
    moe_act 2 x 4096 x 4 x 2880 x 3 = 283.1e6 B, layernorm 1 x 2 x 2 x 4096 x 2880 = 47.2e6 B.
    """
    from diffperf.workload.params import residual_shards  # params imports ep, which imports us

    f = megatron_module_fracs(parallel)
    q, t = training.activation_bytes, head_shards(parallel)
    T = tokens_per_device(model, parallel)
    T_sp = T / residual_shards(parallel)
    phi = moe_layer_fraction(model)
    act = q * T * (2.0 + model.gated_mlp) / t
    return (f["mlp"] * (1.0 - phi) * (act * model.ffn_hidden + 2.0 * q * T_sp * model.hidden)
            + f["moe_act"] * phi * act * model.moe_topk * model.capacity_factor
            * model.moe_ffn_hidden
            + f["shared_experts"] * phi * act * model.n_shared_experts * shared_expert_width(model)
            + f["layernorm"] * separate_norms(model) * 2.0 * q * T_sp * model.hidden
            + f["mla_up_proj"] * is_mla(model) * 4.0 * q * T
            * (model.q_lora_rank + model.kv_lora_rank)
            + f["core_attn"] * unfused_core_attention_bytes(model, parallel, training))
