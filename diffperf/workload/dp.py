"""Data parallelism and ZeRO: gradient reduction and parameter gathers.

Source: Rajbhandari et al. SC20 (ZeRO), Sections 3, 7.2; PAPERS.md section 5.5.
"""

from __future__ import annotations


def dp_volumes_bytes(params_local, layer_params_local, training):
    """Per-step DP volumes on one device (NCCL convention S):

        gradients  S_g = Psi_local q_g       (all-reduce; or reduce-scatter under ZeRO >= 1)
        parameters S_w = Psi_local q_w       (all-gather after the step under ZeRO 1-2)
        per layer  S_lw = Psi_layer q_w, S_lg = Psi_layer q_g   (ZeRO-3 gathers per layer)
    Ring cost is the same for AR as for RS + AG: 2 Psi elements moved (ZeRO table, section 5.5).
    """
    return (params_local * training.grad_bytes, params_local * training.weight_bytes,
            layer_params_local * training.weight_bytes, layer_params_local * training.grad_bytes)
