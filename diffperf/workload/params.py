"""Parameter counts: of the model, of one layer, and of what one device holds.

Source: PAPERS.md section 5.1 (Narayanan et al. SC21 Section 5.1 for GPT:
N = 12 L h^2 (1 + 13/(12h) + (V + s)/(12 L h)); general dense decoder and MoE rows).
"""

from __future__ import annotations

import jax.numpy as jnp

from diffperf.workload.ep import expert_tp
from diffperf.workload.flops import hidden_shards
from diffperf.workload.stages import each


def layer_matrix_params(model):
    """Weights of one layer's matrices (sharded by TP):

        h (a + 2 a_kv) d_h + a d_h h                  attention
        (2 + gated) h f                               dense MLP   (or, for MoE:)
        h E + (E + E_shared)(2 + gated) h f_e         router, routed and shared experts
    Returns (attention + dense MLP + shared experts, routed experts): the routed experts are
    sharded over EP as well.
    """
    h, dh = model.hidden, model.head_dim
    attn = h * (model.n_heads + 2 * model.n_kv_heads) * dh + model.n_heads * dh * h
    is_moe = jnp.where(model.n_experts > 0, 1.0, 0.0)
    mlp_mats = 2.0 + model.gated_mlp
    dense_mlp = (1.0 - is_moe) * mlp_mats * h * model.ffn_hidden
    shared = is_moe * (model.n_shared_experts * mlp_mats * h * model.moe_ffn_hidden
                       + h * model.n_experts)
    experts = is_moe * model.n_experts * mlp_mats * h * model.moe_ffn_hidden
    return attn + dense_mlp + shared, experts


def layer_vector_params(model):
    """Norm weights and biases of one layer (replicated across TP):

        norms: 2 h (RMSNorm) or 4 h (LayerNorm: scale and shift), two per layer
        biases: (a + 2 a_kv) d_h + h + (1 + gated) f + h     (GPT: 9 h; with norms 13 h)
    """
    h = model.hidden
    norms = 2.0 * h * (2.0 - model.rms_norm)
    biases = model.biases * ((model.n_heads + 2 * model.n_kv_heads) * model.head_dim + 2 * h
                             + (1.0 + model.gated_mlp) * model.ffn_hidden)
    return norms + biases


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
        MoE:    (k C_f + E_shared) f_e     (k routed experts per token, capacity factor C_f,
                                             shared experts; Lepikhin et al. 2020 GShard
                                             capacity; PAPERS.md section 5.8)
    Example: Mixtral 8x7B (k 2, C_f 1, no shared expert, f_e 14336): 28672.
    """
    return jnp.where(model.n_experts > 0, (model.moe_topk * model.capacity_factor
                                           + model.n_shared_experts) * model.moe_ffn_hidden,
                     model.ffn_hidden)


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
