"""Work of a training step compiled as one XLA program (JAX `jit`) where it differs from an
eager framework's: what the layer scan stacks for its backward (and writes to HBM), the GEMMs
that `jax.checkpoint` does not re-run, the fused optimizer update and the gradient
accumulation of the micro-batch scan. Each applies only where training.xla_compiled = 1 and
gives the eager value (bit for bit) otherwise.

The program is the one data/README.md describes for the H100 JAX runs (layers as one
`lax.scan` over stacked fp32 weights, bf16 matmul inputs, cuDNN flash attention, AdamW,
accumulation as a `lax.scan`, `recompute=full` = `jax.checkpoint` around the layer); its
reference implementation is tests/jax_transformer.py `make_scan_step`.
"""

from __future__ import annotations

import jax.numpy as jnp

from diffperf.workload.flops import head_shards, tokens_per_device
from diffperf.workload.params import (active_ffn_width, layer_params_per_device,
                                      layer_vector_params, residual_shards)
from diffperf.workload.recompute import full_frac

FP32_BYTES = 4.0  # the fp32 values JAX saves for a norm's backward and for the softmax
# Tensors of b s f elements one MLP's backward reads, stacked by the scan: GELU(tanh) keeps the
# up projection's output, four intermediates of the tanh form and its output (the down
# projection's input); SwiGLU keeps the gate and up projections' outputs, three values of silu
# and the gated product. Counted in the jaxpr of `jax.nn.gelu(approximate=True)` and
# `jax.nn.silu` under `lax.scan` (JAX 0.10; tests/test_memory_xla.py checks the total).
_MLP_SAVED = 6.0


def layer_residual_bytes(model, parallel, training):
    """Bytes one scanned layer's backward needs, one micro-batch, one device, without remat:
    what `lax.scan` stacks per layer for the backward (JAX partial evaluation of the body):

        T [ 2 (2 x 4 + q) h_r + 16                     two norms: fp32 input and normalised
                                                       value, the q-byte output, 2 fp32 stats
            + q (a + 2 a_kv) d_h / t + 2 q a d_h / t   Q, K, V; attention output and the
                                                       out-projection's input (a reshape,
                                                       saved as its own buffer)
            + 4 a / t                                  cuDNN softmax statistics (fp32)
            + 6 q f' / t ]                             the MLP's saved tensors (_MLP_SAVED)
        + q N_mat                                      the bf16 casts of the layer's weights
        + 2 x 4 h_r                                    the two norms' scales, broadcast (fp32)
    T = b s / c tokens (`flops.tokens_per_device`), h_r = h / t_sp (the residual stream's
    shard, `params.residual_shards`: t with sequence parallelism, G_x in the AxoNN grid),
    q = training.activation_bytes (the matmul dtype), f' = `params.active_ffn_width` (f, or
    the routed width of an MoE layer), N_mat = the
    layer's matrices on this device. RMSNorm and LayerNorm save the same (x or x - mean, and
    the normalised value). Source: the scan's stacked outputs in the jaxpr of
    tests/jax_transformer.py `make_scan_step` [D; equality tested].
    Example (h 2048, a 16, a_kv 4, d_h 128, f 5376 SwiGLU, b 2, s 1024, q 2): per token
    norms 2 (8 + 2) 2048 + 16 = 40976, attention 2 x 24 x 128 + 2 x 2 x 2048 + 64 = 14400,
    MLP 6 x 2 x 5376 = 64512: 119888 B x 2048 tokens = 245.5 MB; casts 2 x 43.5 M = 87.0 MB;
    0.3326 GB a layer (+ 16 kB of broadcast scales).
    """
    t, q = head_shards(parallel), training.activation_bytes
    T, t_sp = tokens_per_device(model, parallel), residual_shards(parallel)
    a, akv, dh = model.n_heads, model.n_kv_heads, model.head_dim
    ffn = active_ffn_width(model)
    norms = 2.0 * (2.0 * FP32_BYTES + q) * model.hidden / t_sp + 4.0 * FP32_BYTES
    attention = (q * (a + 2.0 * akv) * dh + 2.0 * q * a * dh + FP32_BYTES * a) / t
    mlp = _MLP_SAVED * q * ffn / t
    casts = q * (layer_params_per_device(model, parallel) - layer_vector_params(model))
    scales = 2.0 * FP32_BYTES * model.hidden / t_sp
    return T * (norms + attention + mlp) + casts + scales


def stacked_pass_traffic_bytes(model, parallel, training):
    """HBM bytes one layer's stacked residuals move in each pass, forward and backward, one
    micro-batch (XLA without full recompute; else 0; x (1 - p) under full recompute of a
    fraction p of the layers, `workload.recompute.full_frac`):

        layer_residual_bytes          written by the forward scan (a dynamic-update-slice
                                      into the [L, ...] buffer), and again read back by the
                                      backward: twice this in all
    An eager framework's saved tensors are the outputs its kernels write anyway (in
    `flops.elementwise_bytes`); XLA's fusions would keep most of these values on chip (the
    fp32 norm values, the GELU / SiLU internals) and write the bf16 weight casts nowhere, but
    a scan's residuals are loop outputs, which live in HBM. With `jax.checkpoint` only the
    carry (1/30 or less of it) is stacked: left out. Source: XLA's while-loop lowering of
    `lax.scan` (residuals as stacked loop outputs, JAX partial evaluation) [D].
    Example (h 4096, a 32, f 16384, b 1, s 4096, q 2): 1.71 GB a layer and pass (0.6 ms at
    2.85 TB/s), 3.42 GB forward and backward.
    """
    kept = 1.0 - full_frac(parallel)  # the share of the layers not checkpointed
    return jnp.where(training.xla_compiled > 0,
                     kept * layer_residual_bytes(model, parallel, training), 0.0)


def optimizer_bytes_per_param(training):
    """HBM bytes per parameter of the AdamW update:

        eager: 2 q_g + 2 q_opt + q_w + q_master + (q_master or q_w)   (predict._optimizer_s)
        XLA:   q_g + 2 (q_w + q_master + q_opt)
    XLA fuses optax's update chain (moments, bias correction, weight decay, the parameter
    update, and the 1/m of the accumulated gradient) into elementwise fusions that read the
    gradient, the weights and the moments once and write the donated weights and moments in
    place; no separate pass reads the gradient again (no clipping in optax.adamw) [D].
    Example (fp32 weights, fp32 gradient, two fp32 moments, no master copy): 4 + 2 x 12 = 28 B
    (eager: 32 B).
    """
    q_master = training.master_bytes
    source = jnp.where(q_master > 0, q_master, training.weight_bytes)
    eager = (2.0 * training.grad_bytes + 2.0 * training.optimizer_bytes
             + training.weight_bytes + q_master + source)
    xla = training.grad_bytes + 2.0 * (training.weight_bytes + q_master
                                        + training.optimizer_bytes)
    return jnp.where(training.xla_compiled > 0, xla, eager)


def grad_accumulation_traffic_bytes(grads_bytes, parallel, training):
    """HBM bytes the gradient accumulation of one step moves, XLA (0 for eager frameworks):

        m > 1:  m x 3 G             (carry + gradients of the micro-batch: read both, write)
        m = 1:  0                   (the one-trip scan and its add of zeros are simplified away)
    The accumulation is a `lax.scan` over the m micro-batches whose fp32 carry adds each
    micro-batch's gradients after its backward (it cannot fuse into the backward's GEMMs, which
    write the layer gradients as the stacked outputs of the layer scan). G = grads_bytes, the
    gradient bytes of this rank's stage that it accumulates: q_g Psi, or its 1/d shard under
    ZeRO-2/3, as `memory.weights.gradient_bytes` holds them. Source: data/README.md
    (JAX section: accumulation as a lax.scan inside the jitted step) [D].
    Example: G = 4 x 2.02e9 B (fp32), m = 2: 2 x 3 x 8.08 GB = 48.5 GB (17 ms at 2.85 TB/s).
    """
    m = parallel.n_microbatches
    accumulating = jnp.where((training.xla_compiled > 0) & (m > 1), 1.0, 0.0)
    return accumulating * m * 3.0 * grads_bytes


# Rows of `flops.layer_ops(...).dense` that end a layer: the MLP down projection (dense,
# routed experts, shared experts). Their outputs feed only the residual add into the layer's
# output, which no backward op reads.
_LAYER_OUTPUT_GEMMS = (3, 6, 8)
_LAYER_GEMM_ROWS = 12  # rows of layer_ops(...).dense (tests/test_memory_xla.py checks both)


def remat_skipped_gemms(training):
    """Weight per row of the layer's dense GEMMs that full recompute does NOT re-run:

        XLA: 1 for the down projections (_LAYER_OUTPUT_GEMMS), else 0;  eager: all 0
    `jax.checkpoint` rebuilds in the backward only the primal values the backward reads (its
    partial evaluation keeps the residuals' producers and drops the rest as dead code).
    The down projection's output is only added into the layer's output, which no backward op
    reads (dW_down = a^T dy and dx = dy W_down^T need its input), so it is not recomputed;
    torch.utils.checkpoint re-runs the whole forward function. Source: the lowered program of
    tests/jax_transformer.py `make_scan_step` (and its compiled HLO on the CPU): 6 GEMMs in the
    forward, 5 of them again in the backward with `jax.checkpoint` (tests/test_memory_xla.py)
    [D].
    Example (MHA, f = 4h): the down projection is 8 of the 24 T h^2 GEMM FLOPs of a layer's
    forward, so XLA's recompute runs 2/3 of the dense forward.
    """
    rows = jnp.zeros(_LAYER_GEMM_ROWS).at[jnp.array(_LAYER_OUTPUT_GEMMS)].set(1.0)
    return jnp.where(training.xla_compiled > 0, rows, 0.0)
