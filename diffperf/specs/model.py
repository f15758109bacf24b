"""The Transformer being trained, as a frozen pytree of numbers.

Every dimension is an array leaf (not static), so that a batch of different models (the rows
of a runs CSV) is one pytree with a leading axis and one `vmap`. Switches that only change
numbers (gated MLP, causal mask, RMSNorm, tied embeddings) are 0/1 leaves used arithmetically.
"""

from __future__ import annotations

from typing import Any

from flax import struct

# Model.qk_norm's forms, by leaf value (the YAML key `qk_norm` names them): no QK-norm; an
# RMSNorm over each head's d_h (Qwen3, Gemma 3; Megatron-Core qk_layernorm); an RMSNorm over
# the whole q and k projections (OLMo 2).
QK_NORM_FORMS = ("none", "head", "projection")


class Model(struct.PyTreeNode):
    """A decoder (causal) or encoder (full attention) Transformer, optionally MoE.

    Build it with `diffperf.load_model` (a name, a YAML or Hugging Face config.json path, or a
    mapping of the YAML keys), which validates; the bare constructor does not (JAX rebuilds
    pytrees with placeholders).
    """

    n_layers: Any          # transformer blocks L
    hidden: Any            # model width h
    ffn_hidden: Any        # dense MLP inner width f
    n_heads: Any           # query heads a
    n_kv_heads: Any        # key/value heads a_kv (GQA: < a, MQA: 1)
    head_dim: Any          # d_h (usually h / a)
    vocab: Any             # vocabulary V (input embedding and output layer width)
    seq_len: Any           # tokens per sequence s
    gated_mlp: Any = 0.0   # 1: SwiGLU-style MLP with three h x f matrices; 0: two
    causal: Any = 1.0      # 1: decoder (causal mask); 0: encoder (full attention)
    rms_norm: Any = 0.0    # 1: RMSNorm; 0: LayerNorm (only changes vector work)
    tied_embeddings: Any = 0.0  # 1: the output layer reuses the input embedding
    biases: Any = 0.0      # 1: linear layers have biases (GPT-2/3, Megatron GPT)
    learned_positions: Any = 0.0  # 1: learned position embedding of s x h (GPT); 0: rotary
    n_experts: Any = 0.0   # MoE routed experts E (0: dense)
    moe_topk: Any = 0.0    # experts per token k
    moe_ffn_hidden: Any = 0.0  # expert MLP width f_e
    n_shared_experts: Any = 0.0  # always-active experts (DeepSeek-MoE)
    capacity_factor: Any = 1.0   # C_f: tokens per expert padded to C_f x the mean
    # Architecture features of current models (docs/models.md); every default is the
    # architecture above (no MLA, every layer MoE when n_experts > 0, no sliding window).
    v_head_dim: Any = 0.0        # d_v: value / attention-output head width (0: = head_dim)
    kv_lora_rank: Any = 0.0      # MLA (DeepSeek-V2/V3): K/V latent width d_c (0: no MLA)
    q_lora_rank: Any = 0.0       # MLA: query latent width d_c' (0: full-rank query projection)
    qk_rope_head_dim: Any = 0.0  # MLA: decoupled RoPE dims d_R of each head (part of head_dim)
    moe_dense_layers: Any = 0.0  # layers of an MoE model with a dense MLP of ffn_hidden
    shared_expert_ffn_hidden: Any = 0.0  # width of each shared expert (0: = moe_ffn_hidden)
    sliding_window: Any = 0.0    # w: keys a sliding-window layer attends to (0: none)
    sliding_layers: Any = 0.0    # layers with sliding-window attention (the rest: full)
    attention_sinks: Any = 0.0   # 1: a learned logit per head in the softmax (GPT-OSS)
    mtp_layers: Any = 0.0        # multi-token prediction modules (DeepSeek-V3), trained too
    qk_norm: Any = 0.0           # RMSNorm on queries and keys: 0 none, 1 per head (Qwen3,
    #                              Gemma 3: weights of d_h), 2 over the whole q / k projection
    #                              (OLMo 2: weights of a d_h and a_kv d_h); QK_NORM_FORMS
    name: str = struct.field(pytree_node=False, default="model")

    # The YAML / runs-CSV / Hugging Face spellings of the fields above, read-only: one
    # vocabulary for a reader of either (issue 19). The fields keep the paper's symbols.
    @property
    def num_layers(self):
        """`n_layers` by its YAML and runs-CSV name."""
        return self.n_layers

    @property
    def num_heads(self):
        """`n_heads` by its YAML and runs-CSV name."""
        return self.n_heads

    @property
    def num_kv_heads(self):
        """`n_kv_heads` by its YAML and runs-CSV name."""
        return self.n_kv_heads

    @property
    def moe_experts(self):
        """`n_experts` by its YAML and runs-CSV name."""
        return self.n_experts
