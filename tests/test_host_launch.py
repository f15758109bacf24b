"""The physics default of the host time per eager launch (`Efficiency.host_kernel_s`,
`specs.system.eager_launch_host_s`): this project's H100-host measurement of one GEMM call and
one pointwise call, weighted by a dense layer's launches. Expected values worked by hand.
The gradient contract of the field is tests/test_gradients.py's (COST_LEAVES: finite, float64
check_grads on log-parameters, d step / d host_kernel_s >= 0)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

import diffperf
from diffperf import Parallel
from diffperf.specs.system import (HOST_GEMM_CALL_S, HOST_POINTWISE_CALL_S, Efficiency,
                                   eager_launch_host_s)
from diffperf.workload.flops import layer_ops
from layer_spy import layer_gpu_host_s
from shipped import model as _model, system as _system

CSV = Path(diffperf.__file__).resolve().parent / "data" / "kernels" / "h100_host_launch.csv"


def test_constants_are_the_measurement():
    """The two per-call constants are the shipped measurement's rows (mean of the BF16 and FP8
    GEMM calls; the add), to 1e-6."""
    rows = {r["op"]: float(r["host_s_per_call"]) for r in csv.DictReader(CSV.open())}
    gemm = (rows["mm_bf16"] + rows["scaled_mm_fp8"]) / 2.0
    assert HOST_GEMM_CALL_S == pytest.approx(gemm, rel=1e-6)
    assert HOST_POINTWISE_CALL_S == pytest.approx(rows["add_bf16"], rel=1e-6)


def test_default_by_hand():
    """t_k = (5 x 20.0972565 + 6 x 6.9071567) / 11 = 141.9292227 / 11 = 12.9026566 us, the
    Efficiency default; all GEMM calls give the GEMM time, all pointwise the add's."""
    assert float(Efficiency().host_kernel_s) == pytest.approx(12.9026566e-6, rel=1e-7)
    assert eager_launch_host_s() == Efficiency().host_kernel_s
    assert eager_launch_host_s(n_pointwise=0.0) == pytest.approx(20.0972565e-6, rel=1e-7)
    assert eager_launch_host_s(n_library=0.0) == pytest.approx(6.9071567e-6, rel=1e-7)


def test_layer_host_time_by_hand(monkeypatch):
    """Llama 3 8B, BF16, one H100 (physics defaults), TP 1, micro-batch 1: the layer's forward
    counts 11 launches (4 GEMMs, attention, 5 elementwise + the gate), so its host floor is
    11 t_k + host_layer_s = 11 x 12.9027 + 50 = 191.93 us; the backward launches twice as many:
    22 x 12.9027 + 50 = 333.86 us (predict._layer_parts' host_f / host_b)."""
    model, system, tr = _model("llama3-8b"), _system("h100-sxm-80gb"), diffperf.training("bf16")
    par = Parallel(micro_batch=1.0, dp=8.0)
    assert float(layer_ops(model, par, tr).n_kernels) == 11.0
    (_, host_f), (_, host_b) = layer_gpu_host_s(monkeypatch, model, par, system, (tr,))[0]
    assert host_f == pytest.approx(191.93e-6, rel=1e-4)
    assert host_b == pytest.approx(333.86e-6, rel=1e-4)


def test_eager_launch_host_s_gradient_contract(x64):
    """eager_launch_host_s (public; x64, log-parameter check_grads): finite gradients; a dearer
    GEMM or pointwise call makes the launch dearer, by its launch share (by hand: d t_k / d t_gemm
    = 5 / 11, d t_k / d t_pw = 6 / 11); a larger share of GEMM calls makes it dearer (d t_k /
    d n_lib = (t_gemm - t_k) / 11 = (20.0972565 - 12.9026566) / 11 = 0.654054536 us per
    call, > 0 since t_gemm > t_pw), a larger share of pointwise ones cheaper
    ((t_pw - t_k) / 11 = -0.545045454 us)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.test_util import check_grads

    def t_of(x):
        return eager_launch_host_s(*jnp.exp(x))

    x = jnp.log(jnp.array([HOST_GEMM_CALL_S, HOST_POINTWISE_CALL_S, 5.0, 6.0]))
    g_log = np.asarray(jax.grad(t_of)(x))
    assert np.all(np.isfinite(g_log))
    # d t / d log p = p d t / d p: back to the plain partial derivatives
    g = g_log / np.exp(np.asarray(x))
    assert g[0] == pytest.approx(5.0 / 11.0, rel=1e-12)
    assert g[1] == pytest.approx(6.0 / 11.0, rel=1e-12)
    assert g[2] == pytest.approx(0.654054536e-6, rel=1e-7)
    assert g[3] == pytest.approx(-0.545045454e-6, rel=1e-7)
    check_grads(t_of, (x,), order=1, modes=("rev",), eps=1e-4)
