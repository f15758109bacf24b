"""The Ops pytree: FLOPs, bytes and message volumes of one training step, per device."""

from __future__ import annotations

from typing import Any

from flax import struct


class Gemms(struct.PyTreeNode):
    """A fixed list of matrix products (m x k)(k x n), each done `count` times.

    Arrays of one length per op kind (static), so every layout has the same shapes.
    """

    m: Any
    n: Any
    k: Any
    count: Any

    @property
    def flops(self):
        """2 m n k per product (one multiply-add = 2 FLOP), times count."""
        return 2.0 * self.m * self.n * self.k * self.count


class LayerOps(struct.PyTreeNode):
    """One transformer layer, one micro-batch, forward pass, on one device."""

    dense: Gemms            # projections and MLP (backward = 2 x these)
    attention: Gemms        # attention core QK^T and AV (flash backward = 2.5 x forward)
    elementwise_bytes: Any  # HBM traffic of norms, residuals, activations (backward ~ 2x)
    n_kernels: Any          # kernels launched in the forward pass
    vector_flops: Any       # softmax, norms, activations (at vector speed)
    extra_launches: Any = 0.0  # host launches beyond n_kernels: the per-expert GEMMs that
                               # TE's streams run side by side (moe_expert_loop_kernels)


class HeadOps(struct.PyTreeNode):
    """Embedding (first stage) and output layer + loss (last stage), one micro-batch, forward."""

    logits: Gemms
    embedding_bytes: Any
    loss_bytes: Any


class CommOps(struct.PyTreeNode):
    """Message volumes S (bytes, NCCL convention) with their group sizes and strides."""

    tp_bytes: Any           # S of one TP collective (per layer there are n_tp_* of them)
    tp_n: Any
    tp_stride: Any
    cp_kv_bytes: Any        # S of the K/V all-gather (and dK/dV reduce-scatter) per layer
    cp_n: Any
    cp_stride: Any
    pp_bytes: Any           # S of one stage-boundary send (activation or its gradient)
    pp_stride: Any
    dp_grad_bytes: Any      # gradient bytes this rank reduces per step (its stage, its TP shard)
    dp_param_bytes: Any     # weight bytes this rank gathers (ZeRO) per step
    dp_layer_param_bytes: Any  # weight bytes of one layer (ZeRO-3 per-layer gathers)
    dp_layer_grad_bytes: Any
    dp_n: Any
    dp_stride: Any
