"""Parameter counts: of the model, of one layer, and of what one device holds.

Source: PAPERS.md section 5.1 (Narayanan et al. SC21 Section 5.1 for GPT:
N = 12 L h^2 (1 + 13/(12h) + (V + s)/(12 L h)); general dense decoder and MoE rows).
"""

from __future__ import annotations

import jax.numpy as jnp

from diffperf.workload.ep import expert_tp
from diffperf.workload.flops import (hidden_shards, is_mla, moe_layer_fraction,
                                     qk_norm_forms, shared_expert_width, v_dim)
from diffperf.workload.stages import each


def attention_matrix_params(model):
    """Attention weights of one layer sharded by TP (by heads):

        standard (GQA):  h (a + a_kv) d_qk + h a_kv d_v + a d_v h        (q, k, v, o)
        MLA:             r_q a d_qk + r_kv a (d_qk - d_R + d_v) + a d_v h
                         (W^UQ, W^QR of the query latent; W^UK, W^UV of the K/V latent; o)
    d_qk = head_dim (d_nope + d_R for MLA), d_v = `v_dim`, r_q = q_lora_rank (h when 0: the
    full-rank W^Q of DeepSeek-V2-Lite), r_kv = kv_lora_rank, d_R = qk_rope_head_dim.
    Source: DeepSeek-V2 (arXiv:2405.04434) Section 2.1.2-2.1.3, eqs. (9)-(13): c^KV = W^DKV h,
    k^C = W^UK c^KV, v^C = W^UV c^KV, c^Q = W^DQ h, q^C = W^UQ c^Q, q^R = RoPE(W^QR c^Q),
    k^R = RoPE(W^KR h) (one shared d_R key per token); Hugging Face modeling_deepseek_v3
    (q_b_proj: q_lora_rank -> a (d_nope + d_R), kv_b_proj: kv_lora_rank -> a (d_nope + d_v)).
    Example: DeepSeek-V3 (h 7168, a 128, d_qk 192, d_R 64, d_v 128, r_q 1536, r_kv 512):
    37.7e6 + 16.8e6 + 117.4e6 = 171.9e6 (+ 15.1e6 down projections, `mla_down_params`).
    """
    h, dqk, dv, a, akv = model.hidden, model.head_dim, v_dim(model), model.n_heads, \
        model.n_kv_heads
    standard = h * (a + akv) * dqk + h * akv * dv + a * dv * h
    r_q = jnp.where(model.q_lora_rank > 0, model.q_lora_rank, h)
    mla = (r_q * a * dqk + model.kv_lora_rank * a * (dqk - model.qk_rope_head_dim + dv)
           + a * dv * h)
    return jnp.where(model.kv_lora_rank > 0, mla, standard)


def mla_down_params(model):
    """MLA's down projections and latent norms (one layer; 0 without MLA), replicated over TP
    (Megatron-Core MLASelfAttention builds linear_q_down_proj / linear_kv_down_proj
    unsharded, "duplicated", on every TP rank [S]):

        h r_q + h (r_kv + d_R) + r_q + r_kv    (W^DQ, [W^DKV; W^KR], the two RMSNorms)
    DeepSeek-V2 Section 2.1.2 eqs. (9), (12), (14). Example: DeepSeek-V3: 11.01e6 + 4.13e6
    + 2048 = 15.14e6.
    """
    h = model.hidden
    q_down = jnp.where(model.q_lora_rank > 0, h * model.q_lora_rank + model.q_lora_rank, 0.0)
    kv_down = h * (model.kv_lora_rank + model.qk_rope_head_dim) + model.kv_lora_rank
    return is_mla(model) * (q_down + kv_down)


def layer_matrix_params(model):
    """Weights of one layer's matrices (sharded by TP), the mean layer (`moe_layer_fraction`):

        `attention_matrix_params`                              attention
        (1 - phi) (2 + gated) h f                              dense MLP
        phi [h E + E_s (2 + gated) h f_s]                      router, shared experts
        phi E (2 + gated) h f_e                                routed experts
    Returns (attention + dense MLP + router + shared experts, routed experts): the routed
    experts are sharded over EP as well.
    """
    h = model.hidden
    phi = moe_layer_fraction(model)
    mlp_mats = 2.0 + model.gated_mlp
    dense_mlp = (1.0 - phi) * mlp_mats * h * model.ffn_hidden
    shared = phi * (model.n_shared_experts * mlp_mats * h * shared_expert_width(model)
                    + h * model.n_experts)
    experts = phi * model.n_experts * mlp_mats * h * model.moe_ffn_hidden
    return attention_matrix_params(model) + dense_mlp + shared, experts


def qk_norm_params(model):
    """QK-norm weights of one layer (0 without, Model.qk_norm):

        per head:           2 d_h             (q_norm, k_norm over d_h, shared by the heads)
        whole projection:   (a + a_kv) d_h    (q_norm over a d_h, k_norm over a_kv d_h)
    Sources: transformers `Qwen3Attention` / `Qwen3MoeAttention` (q_norm, k_norm =
    Qwen3RMSNorm(head_dim), "unlike olmo, only on the head dim"), `Gemma3Attention`
    (Gemma3RMSNorm(dim=head_dim)), `Olmo2Attention` (Olmo2RMSNorm(num_attention_heads x
    head_dim), Olmo2RMSNorm(num_key_value_heads x head_dim)); Megatron-Core builds its
    q_layernorm / k_layernorm with hidden_size = hidden_size_per_attention_head, replicated
    over TP. Example: Qwen3 30B-A3B: 256 per layer, 12,288 over 48 layers; OLMo 2 13B
    (a = a_kv = 40, d_h 128): 10,240 per layer.
    """
    on, _, whole = qk_norm_forms(model)
    dh = model.head_dim
    return on * ((1.0 - whole) * 2.0 * dh + whole * (model.n_heads + model.n_kv_heads) * dh)


def layer_vector_params(model):
    """Norm weights, biases, attention sinks, QK-norm weights and MLA down projections of one
    layer (replicated across TP):

        norms: 2 h (RMSNorm) or 4 h (LayerNorm: scale and shift), two per layer
        biases, dense MLP:  (a + 2 a_kv) d_h + h + (1 + gated) f + h   (GPT: 9 h; with norms 13 h)
        biases, MoE MLP (GPT-OSS: attention, router and every expert's linears have biases):
                 (a d_qk + a_kv (d_qk + d_v)) + h + E + (E + E_s) ((1 + gated) f_e + h)
        sinks:   a                      (one learned logit per head, GPT-OSS)
        QK-norm: `qk_norm_params`
        MLA:     `mla_down_params`
    Routed-expert biases are counted here, replicated: at most 0.03 % of GPT-OSS-120B.
    """
    h, a, akv, dh = model.hidden, model.n_heads, model.n_kv_heads, model.head_dim
    phi = moe_layer_fraction(model)
    norms = 2.0 * h * (2.0 - model.rms_norm)
    attn_b = a * dh + akv * (dh + v_dim(model)) + h
    dense_b = (1.0 + model.gated_mlp) * model.ffn_hidden + h
    moe_b = model.n_experts + (model.n_experts + model.n_shared_experts) * (
        (1.0 + model.gated_mlp) * model.moe_ffn_hidden + h)
    biases = model.biases * (attn_b + (1.0 - phi) * dense_b + phi * moe_b)
    return (norms + biases + model.attention_sinks * a + qk_norm_params(model)
            + mla_down_params(model))


def layer_params(model):
    """All parameters of one layer."""
    mats, experts = layer_matrix_params(model)
    return mats + experts + layer_vector_params(model)


def embedding_params(model):
    """Input embedding V h, plus s h learned positions when the model has them."""
    return model.hidden * (model.vocab + model.learned_positions * model.seq_len)


def output_params(model):
    """Output layer V h, zero when tied to the input embedding."""
    return (1.0 - model.tied_embeddings) * model.vocab * model.hidden


def total_params(model):
    """N = L x layer params + embedding + output layer + final norm.

    Example (GPT, biases, LayerNorm, learned positions, tied): 12 L h^2 (1 + 13/(12 h)
    + (V + s)/(12 L h)) + 2 h (final LayerNorm), Narayanan et al. SC21 Section 5.1.
    """
    final_norm = model.hidden * (2.0 - model.rms_norm)
    return model.n_layers * layer_params(model) + embedding_params(model) + output_params(
        model) + final_norm


def inactive_expert_params(model):
    """Routed-expert parameters a token does not use, over the model:

        L phi (E - k) [(2 + gated) h f_e + biases ((1 + gated) f_e + h)]
    """
    per_expert = ((2.0 + model.gated_mlp) * model.hidden * model.moe_ffn_hidden
                  + model.biases * ((1.0 + model.gated_mlp) * model.moe_ffn_hidden
                                    + model.hidden))
    unused = jnp.maximum(model.n_experts - model.moe_topk, 0.0)
    return model.n_layers * moe_layer_fraction(model) * unused * per_expert


def active_params(model):
    """N_active = N - `inactive_expert_params`: the parameters one token's forward uses (the
    k routed experts of each MoE layer, shared experts, attention, dense layers, both
    embedding tables). Equal to N for a dense model.

    Conventions differ in what the published figures include: Mixtral (46.7B / 12.9B, Jiang
    et al. 2024) and DeepSeek-V3 (671B / 37B) count both embedding tables; OpenAI's GPT-OSS
    model card (5.13B of 116.83B) counts the output layer but not the input embedding
    (`active_params - embedding_params` there). MTP modules are not included (`mtp_params`).
    """
    return total_params(model) - inactive_expert_params(model)


def mtp_params(model):
    """Parameters of the D = model.mtp_layers multi-token prediction modules, reported apart
    from N as DeepSeek-V3 reports them (671B main model + MTP):

        D [N_layer + 2 h h + 2 h (RMSNorms of h_i and Emb(t_{i+k})) + h (final norm)]
    each module is one Transformer layer (an MoE layer in an MoE model) fed by the projection
    M_k (h x 2h) of the two normed inputs; the embedding and output head are shared with the
    main model (DeepSeek-V3, arXiv:2412.19437, Section 2.2, eq. (21)-(23)). The released
    checkpoint holds its own copies of the two tables: DeepSeek-V3 11.61e9 here + 2 V h =
    1.85e9 = 13.5e9, the "14B" of its 685B checkpoint (671B + 14B, DeepSeek-V3 README).
    """
    h = model.hidden
    moe_layer = layer_params(model.replace(moe_dense_layers=0.0 * model.moe_dense_layers))
    return model.mtp_layers * (moe_layer + 2.0 * h * h + 3.0 * h)


def grid_shards(parallel):
    """G = G_x G_y G_z: the AxoNN grid shards every weight matrix over all its ranks
    (block (n_out/G_y x k_in/G_x), split again over G_z; PAPERS.md section 4.2). 1 without it."""
    return parallel.gx * parallel.gy * parallel.gz


def layer_params_per_device(model, parallel):
    """Parameters of one layer on one device: matrices / (t G), routed experts / (t_e e)
    (t_e: `workload.ep.expert_tp`), vectors (replicated)."""
    mats, experts = layer_matrix_params(model)
    return (mats / (parallel.tp * grid_shards(parallel))
            + experts / (expert_tp(parallel) * parallel.ep) + layer_vector_params(model))


def active_ffn_width(model):
    """f' = the MLP width one token's activations span:

        dense:  f
        MoE:    k C_f f_e + E_s f_s        (k routed experts per token, capacity factor C_f,
                                             E_s shared experts of width f_s; Lepikhin et al.
                                             2020 GShard capacity; PAPERS.md section 5.8)
    mean over the dense and MoE layers of the model (`moe_layer_fraction` phi):
    (1 - phi) f + phi (k C_f f_e + E_s f_s).
    Example: Mixtral 8x7B (k 2, C_f 1, no shared expert, f_e 14336): 28672.
    """
    phi = moe_layer_fraction(model)
    moe = (model.moe_topk * model.capacity_factor * model.moe_ffn_hidden
           + model.n_shared_experts * shared_expert_width(model))
    return (1.0 - phi) * model.ffn_hidden + phi * moe


def residual_shards(parallel):
    """t_sp = ranks that split one micro-batch's residual stream (norms, residual adds):

        t_sp = t [sequence parallelism] x G_x
    Megatron's sequence parallelism splits the sequence of the norm and dropout regions over
    the t TP ranks (Korthikanti et al. 2022, Section 4.2.2); the AxoNN grid splits the width h
    over X (PAPERS.md section 4.2; `flops.hidden_shards`). 1 without either.
    Example: t = 8 with SP, no grid: 8; without SP: 1.
    """
    return jnp.where(parallel.sequence_parallel > 0, parallel.tp, 1.0) * hidden_shards(parallel)


def stage_expert_params_per_device(model, parallel, layers):
    """Routed-expert parameters of a stage of n = `layers` layers on one device:

        n E (2 + gated) h f_e / (t_e e)
    each of the E experts' 2 + gated matrices (h x f_e) split over the t_e expert-TP ranks
    (`workload.ep.expert_tp`: t unless etp says otherwise), the E
    experts over the e EP ranks (`layer_matrix_params`; Megatron-Core MoE: expert weights
    sharded by expert-tensor and expert parallelism; PAPERS.md section 5.8). They are
    replicated over the expert-data-parallel ranks (`workload.ep.expert_dp_degree`), not over
    the whole data-parallel group. 0 for a dense model.
    Example: Mixtral 8x7B (E 8, SwiGLU, h 4096, f_e 14336), 8 layers, t 2, e 8:
    8 x 8 x 3 x 4096 x 14336 / 16 = 704.6e6.
    """
    _, experts = layer_matrix_params(model)
    return layers * experts / (expert_tp(parallel) * parallel.ep)


def stage_params_per_device(model, parallel, stages):
    """Parameters on one device of each of the three candidate stages (`workload.stages`):

        n_i x layer params per device  +  [embedding_i] embedding / (t G)
                                       +  [output_i] V h / (t G)   (also when tied and p > 1:
                                          Megatron keeps a copy of the shared embedding)
    G = AxoNN grid size (1 without it); with p = 1 the one stage holds both (tied: one copy).
    Source: PAPERS.md section 5.1; Megatron-LM `setup_embeddings_and_output_layer` (the last
    stage's copy of a tied embedding, kept in sync by an all-reduce).
    Returns an array [3] (first, largest middle, last).
    Example: Llama 3 8B (V 128256, h 4096, untied), 32 layers on p = 4, t = 1: first
    8 N_l + V h, middle 8 N_l, last 8 N_l + V h (V h = 525.3e6).
    """
    per_layer = layer_params_per_device(model, parallel)
    shards = parallel.tp * grid_shards(parallel)
    emb = embedding_params(model) / shards
    out = jnp.where((model.tied_embeddings > 0) & (parallel.pp == 1), 0.0,
                    model.vocab * model.hidden) / shards
    return each(lambda n, e, o: n * per_layer + e * emb + o * out,
                stages.layers, stages.embedding, stages.output)


def lowp_weight_cache_params(model, parallel, training):
    """Quantized weight elements one layer keeps per device (the FP8 / FP4 weight cache):

        N_lin (f + d - primary) lambda c
    N_lin = the layer's quantized linear weights on one device, (matrices - router) / (t G)
    + routed experts / (t_e e) (t_e = `workload.ep.expert_tp`; `layer_params_per_device`
    without the router h E and the
    vectors: the router is not a TE linear); f, d = training.lowp_fprop, lowp_dgrad (a
    row-wise copy for fprop, a column-wise one for dgrad), lambda = lowp_layer_frac, c =
    lowp_weight_cache (held from the first micro-batch's forward to the step's last backward:
    Megatron passes is_first_microbatch to TE, which casts the weights once per step and keeps
    them). primary = 1 with FP8 primary weights (lowp_param_gather, Megatron
    --fp8-param-gather, under a sharded optimizer: zero_stage >= 1, as Megatron-LM
    validate_args requires): the parameter is the row-wise copy. Multiply by
    `flops.quantized_elem_bytes` for bytes. 0 for 16-bit presets.
    Example: Llama 3 70B at t 4: (8192 x 80 x 128 + 64 x 128 x 8192 + 3 x 8192 x 28672) / 4
    = 2.139e8 per layer, x 2 copies for FP8.
    """
    mats, experts = layer_matrix_params(model)
    router = jnp.where(model.n_experts > 0, model.hidden * model.n_experts, 0.0)
    linear = ((mats - router) / (parallel.tp * grid_shards(parallel))
              + experts / (expert_tp(parallel) * parallel.ep))
    f, d = training.lowp_fprop, training.lowp_dgrad
    primary = jnp.where((training.lowp_param_gather > 0) & (f > 0)
                        & (parallel.zero_stage >= 1), 1.0, 0.0)
    return training.lowp_weight_cache * training.lowp_layer_frac * (f + d - primary) * linear
