"""AxoNN's 4D hybrid algorithm: the 3D tensor grid G_x x G_y x G_z (x G_data = dp).

Source: Singh et al. SC24 (arXiv 2305.13525); PAPERS.md section 4 [C `axonn/communication.py`,
`axonn/intra_layer/fully_connected.py` for the sequence of collectives; D for the costs].

Placement (PAPERS.md section 4.1): X innermost (stride 1 within the grid), then Y (stride
G_x), then Z (stride G_x G_y), then data parallelism. The grid takes Megatron TP's place in the
rank order, so its base stride is TP's (`workload.groups.stride(parallel, "tp")`).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import struct
from typing import Any

from diffperf.workload.flops import tokens_per_device


class AxonnVolumes(struct.PyTreeNode):
    """NCCL-convention S (bytes) of the collectives of a layer's linears, one entry per linear
    (QKV, attention output, MLP up, MLP down), for one micro-batch; 0 where the group has one
    rank (no collective is issued)."""

    z_gather: Any    # all-gather W over Z (forward; again in backward)
    x_forward: Any   # all-reduce of the partial output over X (non-transposed linears)
    y_forward: Any   # all-reduce of the partial output over Y (transposed linears)
    x_backward: Any  # all-reduce of dX over X (transposed linears)
    y_backward: Any  # all-reduce of dX over Y (non-transposed linears)
    z_scatter: Any   # reduce-scatter of dW over Z (backward)
    data: Any        # all-reduce of the dW shard over the data-parallel ranks (once per step)


def axonn_linears(model):
    """(n_out, k_in, transposed) of the four linears of a layer (AxoNN's GPT block pairs a
    normal with a transposed layer, as Megatron pairs column- with row-parallel):

        QKV        ((a + 2 a_kv) d_h, h)      normal
        attn out   (h, a d_h)                 transposed
        MLP up     ((1 + gated) f, h)         normal
        MLP down   (h, f)                     transposed
    """
    h, dh, f = model.hidden, model.head_dim, model.ffn_hidden
    n_out = jnp.stack([(model.n_heads + 2 * model.n_kv_heads) * dh, h,
                       (1.0 + model.gated_mlp) * f, h])
    k_in = jnp.stack([h, model.n_heads * dh, h, f])
    transposed = jnp.asarray([0.0, 1.0, 0.0, 1.0])
    return n_out, k_in, transposed


def axonn_linear_volumes(n_out, k_in, transposed, M_loc, parallel, training) -> AxonnVolumes:
    """S of each collective of one linear layer Y = X W^T (PAPERS.md section 4.2 table):

        Z    all-gather W           n_out k_in q_w / (G_x G_y)        (forward, backward)
        X    all-reduce partial Y   M_loc n_out q_a / G_y             (forward; normal layer)
        Y    all-reduce dX          M_loc k_in q_a / G_x              (backward; normal layer)
        Z    reduce-scatter dW      n_out k_in q_g / (G_x G_y)        (backward)
        data all-reduce dW shard    n_out k_in q_g / (G_x G_y G_z)    (once per step)
    A transposed layer swaps X and Y: forward all-reduce over Y of M_loc n_out q_a / G_x,
    backward all-reduce over X of M_loc k_in q_a / G_y. Each S is 0 when its group has one rank.
    M_loc = tokens of one micro-batch on one (z, data) slice.
    Special cases (PAPERS.md section 6, AxoNN (i)): G_y = G_z = G_data = 1 leaves one forward
    all-reduce of M_loc n_out q_a over G_x: Megatron's row-parallel layer; G_x = G_y = 1
    leaves an all-gather of n_out k_in q_w and a reduce-scatter of n_out k_in q_g over G_z: FSDP.
    Example: n_out = k_in = 4096, M_loc = 4096, G = (2, 2, 2), bf16: Z gather 16.8 MB/(4) =
    8.39 MB; X forward 4096 x 4096 x 2 / 2 = 16.8 MB.
    """
    gx, gy, gz, gd = parallel.gx, parallel.gy, parallel.gz, parallel.dp
    on = lambda g: jnp.where(g > 1, 1.0, 0.0)  # noqa: E731
    qa, tr = training.activation_bytes, transposed
    w = n_out * k_in / (gx * gy)
    return AxonnVolumes(
        z_gather=on(gz) * w * training.weight_bytes,
        x_forward=on(gx) * (1.0 - tr) * M_loc * n_out * qa / gy,
        y_forward=on(gy) * tr * M_loc * n_out * qa / gx,
        x_backward=on(gx) * tr * M_loc * k_in * qa / gy,
        y_backward=on(gy) * (1.0 - tr) * M_loc * k_in * qa / gx,
        z_scatter=on(gz) * w * training.grad_bytes,
        data=on(gd) * w / gz * training.grad_bytes,
    )


def axonn_layer_volumes(model, parallel, training) -> AxonnVolumes:
    """`axonn_linear_volumes` of the four linears of one layer, one micro-batch (arrays [4]).

    M_loc = b s: the micro-batch of one (z, data) slice (the batch is split over G_z G_data;
    `Parallel.n_microbatches`)."""
    n_out, k_in, tr = axonn_linears(model)
    return axonn_linear_volumes(n_out, k_in, tr, tokens_per_device(model, parallel), parallel,
                                training)


def axonn_strides(base_stride, parallel):
    """(X, Y, Z) rank strides: X innermost, then Y, then Z (PAPERS.md section 4.1), from the
    stride of the slot the grid occupies (TP's)."""
    return base_stride, base_stride * parallel.gx, base_stride * parallel.gx * parallel.gy
