"""Numerical precision of training: bytes per weight, gradient, optimizer state, activation."""

from __future__ import annotations

from typing import Any

from flax import struct


class Training(struct.PyTreeNode):
    """Bytes per element of each kind of state, and the run's checkpoint interval (all leaves).

    Mixed precision after Micikevicius et al. 2018 and Rajbhandari et al. 2020 (Section 3.1):
    16-bit weights and gradients, fp32 master weights and Adam moments, K = 12 bytes.
    """

    weight_bytes: Any = 2.0      # q_w: bytes of the weights the matmuls read
    grad_bytes: Any = 2.0        # q_g: bytes per gradient element (4 when accumulated in fp32)
    master_bytes: Any = 4.0      # fp32 master copy (0 when the weights are the master)
    cast_weight_bytes: Any = 0.0  # 16-bit copies of fp32 weights kept for fwd/bwd (autocast)
    grad_buffers_persist: Any = 1.0  # 1: gradient buffers live all step (Megatron contiguous
                                     # buffers); 0: allocated during the backward (set_to_none)
    optimizer_bytes: Any = 8.0   # Adam m and v in fp32
    activation_bytes: Any = 2.0  # q_a: bytes per activation element
    residual_bytes: Any = 2.0    # bytes of the residual stream (4 under autocast: fp32 params
                                 # and fp32 norms promote the residual sum to fp32)
    matmul_fp32: Any = 0.0       # 1: matmuls run at the fp32/TF32 peak instead of 16-bit
    flash_attention: Any = 1.0   # 1: fused attention, no s^2 score storage or traffic
    fused_softmax_max_seq: Any = 0.0  # unfused attention (flash_attention = 0) in Megatron:
                                 # its fused scale-mask-softmax kernel takes key lengths up to
                                 # this (Megatron-DeepSpeed 2023: 2048) and other shapes fall
                                 # back to PyTorch ops (flops.softmax_fallback); 0: no such
                                 # constraint, the softmax is one pass at any shape
    dropout: Any = 0.0           # 1: dropout after attention and MLP (1-byte masks kept)
    loss_bytes_per_logit: Any = 52.0  # HBM bytes per logit element of the fp32 cross-entropy,
                                 # forward + backward (Megatron's vocab-parallel CE: 52;
                                 # PyTorch's fused F.cross_entropy: ~40; see flops.head_ops)
    vocab_pad_to: Any = 128.0    # the framework pads the vocabulary to a multiple of this x t
                                 # (Megatron-LM --make-vocab-size-divisible-by, default 128);
                                 # 0: no padding, each rank takes floor(V / t) rows
    checkpoint_interval_s: Any = 0.0  # run choice: training seconds between checkpoints
                                 # (tau); 0: the optimum of Daly (2006), schedule.goodput
    xla_compiled: Any = 0.0      # 1: the whole step is one XLA program (JAX jit): memory is
                                 # what XLA keeps live (memory/xla.py), kernels are fused and
                                 # issued back to back; 0: an eager / Megatron framework
    name: str = struct.field(pytree_node=False, default="bf16")


PRECISIONS = {
    # Megatron-style mixed precision: 16-bit weights and grads, fp32 master + Adam (16 B/param).
    "bf16": dict(weight_bytes=2.0, grad_bytes=2.0, master_bytes=4.0, optimizer_bytes=8.0,
                 activation_bytes=2.0, matmul_fp32=0.0),
    "fp16": dict(weight_bytes=2.0, grad_bytes=2.0, master_bytes=4.0, optimizer_bytes=8.0,
                 activation_bytes=2.0, matmul_fp32=0.0),
    # PyTorch autocast / JAX fp32 params with bf16 matmuls: fp32 weights and grads (16 B/param).
    # The bf16 casts of the weights live from the forward until the backward has used them
    # (PyTorch autocast's weight cache; XLA's converted operands).
    "amp-bf16": dict(weight_bytes=4.0, grad_bytes=4.0, master_bytes=0.0, optimizer_bytes=8.0,
                     activation_bytes=2.0, matmul_fp32=0.0, cast_weight_bytes=2.0,
                     grad_buffers_persist=0.0, residual_bytes=4.0, loss_bytes_per_logit=40.0),
    # One XLA-compiled JAX step with fp32 params and AdamW states and bf16 matmul inputs
    # (data/README.md, H100 JAX section): memory by XLA's live sets (memory/xla.py),
    # where the bf16 casts of the weights are stacked scan residuals, not a separate copy;
    # bf16 residual stream (the carry that jax.checkpoint stacks is 2 B per element in the
    # measured peaks); the cross-entropy fused (14 B per logit, flops.head_ops).
    "xla-amp-bf16": dict(weight_bytes=4.0, grad_bytes=4.0, master_bytes=0.0,
                         optimizer_bytes=8.0, activation_bytes=2.0, matmul_fp32=0.0,
                         cast_weight_bytes=0.0, grad_buffers_persist=0.0, residual_bytes=2.0,
                         loss_bytes_per_logit=14.0, xla_compiled=1.0),
    # Pure bf16 (weights, grads and Adam states in bf16: 8 B/param).
    "bf16-pure": dict(weight_bytes=2.0, grad_bytes=2.0, master_bytes=0.0, optimizer_bytes=4.0,
                      activation_bytes=2.0, matmul_fp32=0.0),
    "fp32": dict(weight_bytes=4.0, grad_bytes=4.0, master_bytes=0.0, optimizer_bytes=8.0,
                 activation_bytes=4.0, matmul_fp32=1.0, grad_buffers_persist=0.0,
                 residual_bytes=4.0),
}
