"""Parameter counts: of the model, of one layer, and of what one device holds.

Source: PAPERS.md section 5.1 (Narayanan et al. SC21 Section 5.1 for GPT:
N = 12 L h^2 (1 + 13/(12h) + (V + s)/(12 L h)); general dense decoder and MoE rows).
"""

from __future__ import annotations

import jax.numpy as jnp


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
    """Parameters of one layer on one device: matrices / (t G), routed experts / (t e),
    vectors (replicated)."""
    mats, experts = layer_matrix_params(model)
    return (mats / (parallel.tp * grid_shards(parallel))
            + experts / (parallel.tp * parallel.ep) + layer_vector_params(model))


def stage_expert_params_per_device(model, parallel, layers):
    """Routed-expert parameters of a stage of `layers` layers on one device:
    layers x E (2 + gated) h f_e / (t e).

    They are replicated over the expert-data-parallel ranks (`workload.ep.expert_dp_degree`),
    not over the whole data-parallel group. 0 for a dense model.
    """
    _, experts = layer_matrix_params(model)
    return layers * experts / (parallel.tp * parallel.ep)


def stage_params_per_device(model, parallel, layers):
    """Parameters on one device of the first, the largest middle and the last pipeline
    stage, for `layers` = their layer counts (`workload.pp.stage_layers`):

        n_i x layer params per device  +  embedding / (t G) (first stage)
                                       +  V h / (t G) (last stage; also when tied and p > 1,
                                          Megatron keeps a copy of the shared embedding)
    With p = 1 the one stage holds both. G = AxoNN grid size (1 without it).
    Returns an array [3] (first, middle, last).
    """
    first, mid, last = layers
    per_layer = layer_params_per_device(model, parallel)
    shards = parallel.tp * grid_shards(parallel)
    emb = embedding_params(model) / shards
    single = jnp.where(parallel.pp > 1, 0.0, 1.0)
    out = jnp.where((model.tied_embeddings > 0) & (parallel.pp == 1), 0.0,
                    model.vocab * model.hidden) / shards
    return jnp.stack(jnp.broadcast_arrays(first * per_layer + emb + single * out,
                                          mid * per_layer + single * (emb + out),
                                          last * per_layer + out + single * emb))
