"""Memory and work of one XLA-compiled training step (diffperf/memory/xla.py,
diffperf/workload/xla.py, diffperf/costs/xla.py).

- golden cases by hand: each term's docstring example;
- reference: what `lax.scan` stacks for the backward in the jaxpr of the reference program
  (tests/jax_transformer.py `make_scan_step`, the H100 JAX runs' program) equals
  `layer_residual_bytes` / `scan_residual_bytes` exactly; the lowered program re-runs 5 of
  a layer's 6 forward GEMMs under `jax.checkpoint` (`remat_skipped_gemms`);
- the whole peak against hand arithmetic for the three phases (loss, layer backward,
  optimizer) on three measured H100 shapes;
- isolation: with training.xla_compiled = 0 nothing of this changes a prediction.
Everything here traces or lowers tiny programs, or compiles diffperf's own predict.
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from jax_transformer import Config, make_scan_step, scan_step_args  # noqa: E402

from diffperf import Parallel, load_system, predict  # noqa: E402
from diffperf.costs.xla import kernel_fixed_s  # noqa: E402
from diffperf.load import model_from_dict, training_from_name  # noqa: E402
from diffperf.memory import xla as mem_xla  # noqa: E402
from diffperf.workload import xla as work_xla  # noqa: E402
from diffperf.workload.params import total_params  # noqa: E402

XLA = training_from_name("xla-amp-bf16")
EAGER = training_from_name("amp-bf16")


def _model(cfg: Config):
    return model_from_dict(cfg.as_diffperf_dict() | dict(norm="rmsnorm"), "test")


# The H100 JAX runs' shapes used below (data/h100_jax_single_gpu.csv ids).
ROW_000 = Config(n_layers=24, hidden=2048, n_heads=16, n_kv_heads=4, ffn_hidden=5376,
                 vocab=50304, seq_len=1024, micro_batch=2, gated_mlp=True, rms_norm=True)


# --------------------------------------------------------------------------- golden cases

def test_layer_residual_bytes_worked_example():
    """workload.xla.layer_residual_bytes docstring: h 2048, a 16, a_kv 4, d_h 128, SwiGLU f
    5376, b 2, s 1024, q 2."""
    per_token = (2 * (2 * 4 + 2) * 2048 + 16           # two norms: fp32 x2, bf16 out, stats
                 + 2 * (16 + 2 * 4) * 128                # Q, K, V
                 + 2 * 2 * 16 * 128                      # attention output + out-proj input
                 + 4 * 16                                # softmax statistics
                 + 6 * 2 * 5376)                         # MLP's six saved tensors
    n_mat = 2048 * 24 * 128 + 16 * 128 * 2048 + 3 * 2048 * 5376   # 43.5 M matrix weights
    expected = 2048 * per_token + 2 * n_mat + 2 * 4 * 2048   # + the two norm scales
    got = work_xla.layer_residual_bytes(_model(ROW_000), Parallel(micro_batch=2), XLA)
    assert float(got) == pytest.approx(expected, rel=1e-6)
    assert expected == pytest.approx(0.3326e9, rel=1e-3)


def test_scan_residual_bytes_remat_keeps_the_carry():
    """memory.xla.scan_residual_bytes docstring: full recompute stacks the bf16 carry only:
    2 x 1024 x 2048 bytes a layer at b 1, s 1024, h 2048."""
    model = _model(ROW_000)
    got = mem_xla.scan_residual_bytes(model, Parallel(micro_batch=1, recompute=2), XLA)
    assert float(got) == 2 * 1024 * 2048
    none = mem_xla.scan_residual_bytes(model, Parallel(micro_batch=1), XLA)
    assert float(none) == pytest.approx(
        float(work_xla.layer_residual_bytes(model, Parallel(micro_batch=1), XLA)))


def test_fraction_of_layers_checkpointed_under_xla_stacks_the_rest():
    """recompute full of a fraction p of the layers (Parallel.recompute_layer_frac): the mean
    scanned layer stacks p x the carry + (1 - p) x its residuals, and (1 - p) x its residuals
    move in each pass; a checkpointed layer still rebuilds itself whole (b 1, s 1024, h 2048;
    workload.recompute.full_frac, as the eager memory and the recompute time weigh it)."""
    model, p = _model(ROW_000), 0.4
    par = Parallel(micro_batch=1, recompute=2, recompute_layer_frac=p)
    carry = 2 * 1024 * 2048
    resid = float(work_xla.layer_residual_bytes(model, Parallel(micro_batch=1), XLA))
    got = float(mem_xla.scan_residual_bytes(model, par, XLA))
    assert got == pytest.approx(p * carry + (1 - p) * resid, rel=1e-6)
    assert float(work_xla.stacked_pass_traffic_bytes(model, par, XLA)) == pytest.approx(
        (1 - p) * resid, rel=1e-6)
    assert float(mem_xla.xla_working_layer_bytes(model, par, XLA)) == pytest.approx(resid)


def test_loss_buffer_bytes_worked_example():
    """(4 + q) T V: T = 8 x 4096 tokens, V = 128256, q = 2 -> 6 x 4.203e9 bytes."""
    cfg = Config(n_layers=24, hidden=1024, n_heads=16, n_kv_heads=4, ffn_hidden=4096,
                 vocab=128256, seq_len=4096)
    got = mem_xla.loss_buffer_bytes(_model(cfg), Parallel(micro_batch=8), XLA)
    assert float(got) == pytest.approx((4 + 2) * 8 * 4096 * 128256, rel=1e-6)


def test_optimizer_bytes_per_param_worked_example():
    """Fused AdamW over fp32 gradient, weights and two moments: 4 + 2 (4 + 0 + 8) = 28 B; the
    eager count keeps its 2 q_g + 2 q_opt + q_w + q_master + q_w = 32 B."""
    assert float(work_xla.optimizer_bytes_per_param(XLA)) == 4 + 2 * (4 + 0 + 8)
    assert float(work_xla.optimizer_bytes_per_param(EAGER)) == 2 * 4 + 2 * 8 + 4 + 0 + 4


def test_grad_accumulation_traffic_bytes_worked_example():
    """m x 3 G for m > 1: G = 4 x 2.02e9 B (fp32 gradients), m = 2 -> 48.5 GB; 0 for m = 1
    and eager."""
    two, G = Parallel(micro_batch=1, global_batch=2), 4 * 2.02e9
    assert float(work_xla.grad_accumulation_traffic_bytes(G, two, XLA)) == pytest.approx(
        2 * 3 * 4 * 2.02e9, rel=1e-6)
    assert float(work_xla.grad_accumulation_traffic_bytes(G, Parallel(), XLA)) == 0.0
    assert float(work_xla.grad_accumulation_traffic_bytes(G, two, EAGER)) == 0.0


def test_stacked_pass_traffic_is_the_residuals_without_remat_only():
    """Each pass moves one layer's stacked residuals (forward writes, backward reads)."""
    model, par = _model(ROW_000), Parallel(micro_batch=2)
    resid = float(work_xla.layer_residual_bytes(model, par, XLA))
    assert float(work_xla.stacked_pass_traffic_bytes(model, par, XLA)) == pytest.approx(resid)
    assert float(work_xla.stacked_pass_traffic_bytes(model, par.replace(recompute=2),
                                                     XLA)) == 0.0
    assert float(work_xla.stacked_pass_traffic_bytes(model, par, EAGER)) == 0.0


def test_kernel_fixed_time_by_framework():
    system = load_system("h100-sxm-80gb")
    system = system.replace(eff=system.eff.replace(kernel_s=2e-5, queued_kernel_s=3e-6))
    assert float(kernel_fixed_s(system, XLA)) == pytest.approx(3e-6)
    assert float(kernel_fixed_s(system, EAGER)) == pytest.approx(2e-5)


# ------------------------------------------------- reference: the jaxpr and the compiled HLO

def _forward_layer_scan(cfg, remat, m=1):
    """The scan over the layers inside the differentiated step, and its stacked outputs."""
    optimizer, params, state, tokens = scan_step_args(cfg, m)
    jaxpr = jax.make_jaxpr(make_scan_step(cfg, optimizer, remat))(params, state, tokens, tokens)

    def scans(j):
        for e in j.eqns:
            if e.primitive.name == "scan":
                yield e
                yield from scans(e.params["jaxpr"].jaxpr)
            for v in e.params.values():
                inner = getattr(v, "jaxpr", v)
                if hasattr(inner, "eqns") and e.primitive.name != "scan":
                    yield from scans(inner)

    # the first scan of length L with stacked outputs (the micro-batch scan stacks nothing)
    fwd = next(e for e in scans(jaxpr.jaxpr) if e.params["length"] == cfg.n_layers
               and len(e.outvars) > e.params["num_carry"])
    ys = fwd.outvars[fwd.params["num_carry"]:]
    return sum(int(np.prod(v.aval.shape)) * v.aval.dtype.itemsize for v in ys)


SMALL = {
    "mha-gelu": Config(n_layers=3, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=256,
                       vocab=96, seq_len=32, micro_batch=2, rms_norm=True),
    "gqa-swiglu": Config(n_layers=2, hidden=96, n_heads=6, n_kv_heads=2, ffn_hidden=160,
                         vocab=80, seq_len=16, micro_batch=3, gated_mlp=True, rms_norm=True),
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_residual_count_equals_what_the_scan_stacks(name):
    """What JAX's partial evaluation makes `lax.scan` stack for the backward (every backend
    runs these stacked buffers) equals L x layer_residual_bytes without remat (norm values,
    Q K V, attention output and statistics, MLP internals, the bf16 weight casts) and
    L x the bf16 carry with jax.checkpoint; also inside the micro-batch scan (m = 2)."""
    cfg = SMALL[name]
    model = _model(cfg)
    par = Parallel(micro_batch=cfg.micro_batch)
    L = cfg.n_layers
    per_layer = float(work_xla.layer_residual_bytes(model, par, XLA))
    assert _forward_layer_scan(cfg, remat=False) == pytest.approx(L * per_layer, rel=1e-6)
    assert _forward_layer_scan(cfg, remat=False, m=2) == pytest.approx(L * per_layer, rel=1e-6)
    carry = float(mem_xla.scan_residual_bytes(model, par.replace(recompute=2), XLA))
    assert _forward_layer_scan(cfg, remat=True) == pytest.approx(L * carry, rel=1e-6)


def _dots(cfg, remat):
    optimizer, params, state, tokens = scan_step_args(cfg)
    step = make_scan_step(cfg, optimizer, remat)
    text = jax.jit(step).lower(params, state, tokens, tokens).as_text()
    return len(re.findall(r"dot_general", text))


def test_checkpoint_recomputes_all_forward_gemms_but_the_down_projection():
    """The lowered program (StableHLO, before XLA: JAX's partial evaluation already drops
    it) has 5 more GEMMs with jax.checkpoint than without: the layer's 6 forward GEMMs (Q, K,
    V, out, up, down) less the down projection, whose output no backward op reads
    (`remat_skipped_gemms`: rows 3, 6, 8)."""
    cfg = SMALL["mha-gelu"]
    assert _dots(cfg, remat=True) - _dots(cfg, remat=False) == 5
    skipped = np.asarray(work_xla.remat_skipped_gemms(XLA))
    assert skipped.tolist() == [0, 0, 0, 1, 0, 0, 1, 0, 1, 0, 0, 0]  # rows 9-11: MLA (inputs)
    assert not np.asarray(work_xla.remat_skipped_gemms(EAGER)).any()
    from diffperf.workload.flops import layer_ops
    rows = np.asarray(layer_ops(_model(cfg), Parallel(), XLA).dense.count)
    assert rows.shape[-1] == skipped.shape[-1]  # one weight per dense GEMM row


# ------------------------------------------------------------------- the peak by phases

def _P(cfg):
    """Parameters of the JAX program (RMSNorm: 2 h vectors a layer, final norm h)."""
    h, dh, f, L = cfg.hidden, cfg.head_dim, cfg.ffn_hidden, cfg.n_layers
    n_mat = h * (cfg.n_heads + 2 * cfg.n_kv_heads) * dh + cfg.n_heads * dh * h + (
        2 + cfg.gated_mlp) * h * f
    layers = L * (n_mat + 2 * h)
    return layers + 2 * cfg.vocab * h + h, layers, n_mat


def _memory(cfg, **layout):
    system = load_system("h100-sxm-80gb")
    system = system.replace(eff=system.eff.replace(mem_reserved_bytes=0.0))
    return mem_xla.xla_device_memory(_model(cfg), Parallel(micro_batch=cfg.micro_batch, **layout),
                                     system, XLA)


def test_peak_is_the_layer_backward_with_accumulation():
    """Run h100-jax-7-000 (measured 24.695 GB): m = 2 and full recompute. Phase B:
    12 P (weights, Adam) + 4 P (accumulator) + 4 P_layers (the backward scan's gradients)
    + 24 stacked bf16 carries + the one layer rebuilt (its `layer_residual_bytes`)."""
    P, P_layers, n_mat = _P(ROW_000)
    T = 2 * 1024
    rebuilt = T * (2 * (8 + 2) * 2048 + 16 + 2 * 24 * 128 + 2 * 2 * 2048 + 64
                   + 6 * 2 * 5376) + 2 * n_mat + 2 * 4 * 2048
    expected = 12 * P + 4 * P + 4 * P_layers + 24 * 2 * T * 2048 + rebuilt
    mem = _memory(ROW_000, global_batch=4, recompute=2)
    assert float(total_params(_model(ROW_000))) == pytest.approx(P, rel=1e-9)
    assert float(mem.total_bytes) == pytest.approx(expected, rel=1e-5)  # float32 sums
    assert float(mem.total_bytes) / 24.695e9 == pytest.approx(1.0, abs=0.01)


def test_peak_is_the_optimizer_update_for_a_small_remat_step():
    """Run h100-jax-7-010 (measured 21.323 GB): m = 1, full recompute: the optimizer phase,
    16 P (weights, two moments, gradients), is above the layer backward."""
    cfg = Config(n_layers=24, hidden=2048, n_heads=16, n_kv_heads=16, ffn_hidden=5376,
                 vocab=32000, seq_len=1024, micro_batch=1, gated_mlp=True, rms_norm=True)
    P, _, _ = _P(cfg)
    mem = _memory(cfg, global_batch=1, recompute=2)
    assert float(mem.total_bytes) == pytest.approx(16 * P, rel=1e-5)
    assert float(mem.activations_bytes) == 0.0
    assert float(mem.gradients_bytes) == pytest.approx(4 * P, rel=1e-5)
    assert float(mem.total_bytes) / 21.323e9 == pytest.approx(1.0, abs=0.01)


def test_peak_is_the_loss_for_a_large_vocabulary():
    """Run h100-jax-7-020 (measured 33.548 GB): b 8, s 4096, V 128256, full recompute: the
    loss phase, 12 P + 24 stacked carries + (4 + 2) T V, is the peak."""
    cfg = Config(n_layers=24, hidden=1024, n_heads=16, n_kv_heads=4, ffn_hidden=4096,
                 vocab=128256, seq_len=4096, micro_batch=8, rms_norm=True)
    P, _, _ = _P(cfg)
    T = 8 * 4096
    expected = 12 * P + 24 * 2 * T * 1024 + 6 * T * 128256
    mem = _memory(cfg, global_batch=8, recompute=2)
    assert float(mem.total_bytes) == pytest.approx(expected, rel=1e-5)
    assert float(mem.total_bytes) / 33.548e9 == pytest.approx(1.0, abs=0.015)


def test_more_accumulation_never_lowers_the_peak_and_remat_lowers_it():
    m1 = float(_memory(ROW_000, global_batch=2).total_bytes)
    m2 = float(_memory(ROW_000, global_batch=4).total_bytes)
    remat = float(_memory(ROW_000, global_batch=4, recompute=2).total_bytes)
    P, _, _ = _P(ROW_000)
    assert m2 - m1 == pytest.approx(4 * P, rel=1e-5)  # the fp32 accumulator
    assert remat < m2


# ------------------------------------------------------------------------------ isolation

CASES = [("llama3-8b", "h100-sxm-80gb", dict(tp=2, pp=2, dp=2, micro_batch=1, global_batch=16,
                                             recompute=2, zero_stage=1), "amp-bf16"),
         ("megatron-1.7b", "a100-4nic", dict(tp=2, pp=1, dp=4, micro_batch=2, global_batch=32,
                                             sequence_parallel=1), "bf16"),
         ("gpt-small", "a100-sxm-80gb", dict(micro_batch=4, global_batch=32), "fp32")]


def test_xla_terms_leave_eager_predictions_unchanged(monkeypatch):
    """With xla_compiled = 0, replacing the XLA program's counts by absurd values (1e30
    bytes of scan residuals and loss buffers, 1e30 s per queued kernel) changes no leaf of
    the Result: they enter only through jnp.where on the flag. The same patched program with
    the flag at 1 does change (the patch reaches the terms)."""
    from diffperf import load_model
    from diffperf.predict import predict_step
    from diffperf.specs.batch import anonymous

    def specs(case, queued=None, precision=None):
        model_name, system_name, layout, prec = case
        system = load_system(system_name)
        if queued is not None:
            system = system.replace(eff=system.eff.replace(queued_kernel_s=queued))
        return tuple(map(anonymous, (load_model(model_name), Parallel(**layout), system,
                                     training_from_name(precision or prec))))

    base = [jax.jit(predict_step)(*specs(c)) for c in CASES]
    huge = lambda *a, **k: jnp.float32(1e30)  # noqa: E731
    monkeypatch.setattr(work_xla, "layer_residual_bytes", huge)
    monkeypatch.setattr(mem_xla, "layer_residual_bytes", huge)
    monkeypatch.setattr(mem_xla, "scan_residual_bytes", huge)
    monkeypatch.setattr(mem_xla, "loss_buffer_bytes", huge)
    patched_fn = jax.jit(functools.partial(predict_step))
    for case, want in zip(CASES, base):
        assert float(training_from_name(case[3]).xla_compiled) == 0.0
        got = patched_fn(*specs(case, queued=1e30))
        for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    on = patched_fn(*specs(CASES[0], queued=1e30, precision="xla-amp-bf16"))
    assert float(on.memory.total_bytes) >= 1e30 and float(on.step_time_s) > 1e20


def test_xla_preset_changes_the_prediction():
    """The preset is not inert: the same single-GPU layout under xla-amp-bf16 has a different
    step time and memory than under amp-bf16."""
    from diffperf import load_model

    model, system = load_model("llama3-8b"), load_system("h100-sxm-80gb")
    par = Parallel(micro_batch=1, global_batch=4, recompute=2)
    a, b = predict(model, par, system, EAGER), predict(model, par, system, XLA)
    assert float(a.step_time_s) != float(b.step_time_s)
    assert float(a.memory.total_bytes) != float(b.memory.total_bytes)


def test_sharded_xla_program_holds_the_gathered_parameters_and_cp_buffers(monkeypatch):
    """A ZeRO-3 layout under XLA holds the gathered parameters in use, as under eager
    (memory.device.gathered_buffer_bytes; zero3_prefetch_params = 0 is FSDP's whole next
    layer prefetched, f = 1: N_layer (2 q_w + q_g); Llama 3 8B's output layer is the larger
    unit, memory.device.nonlayer_unit_bytes), and a CP layout holds its K/V buffers
    during the layer's backward: leaving them out would make a search under xla-amp-bf16
    favour exactly those layouts."""
    from diffperf.load import load_model
    from diffperf.memory.activations import cp_kv_buffer_bytes
    from diffperf.workload.params import layer_params_per_device

    model, system = load_model("llama3-8b"), load_system("h100-sxm-80gb")
    z3 = Parallel(tp=1, pp=1, dp=64, micro_batch=1, global_batch=64, zero_stage=3,
                  recompute=2, zero3_prefetch_params=0)
    reserved = float(system.eff.mem_reserved_bytes)
    n_layer = float(layer_params_per_device(model, z3))
    vh = 128256 * 4096
    for training in (XLA, EAGER):
        q_w, q_g = float(training.weight_bytes), float(training.grad_bytes)
        gathered = n_layer * (2.0 * q_w + q_g)
        # memory.device.nonlayer_unit_bytes: at the start of the backward the output layer is
        # the unit in use (V h > N_l), the last layer prefetched: V h (q_w + q_g) + N_l q_w
        output_unit = vh * (q_w + q_g) + n_layer * q_w
        assert output_unit > gathered
        buffers = float(predict(model, z3, system, training).memory.buffers_bytes) - reserved
        assert buffers == pytest.approx(output_unit, rel=1e-5), training.name
    # gpt3-175b (a small vocabulary for its layers): the layer backward is the peak.
    model = load_model("gpt3-175b")
    cp = Parallel(tp=8, pp=1, dp=2, cp=4, micro_batch=1, global_batch=2, recompute=2)
    kv = float(cp_kv_buffer_bytes(model, cp, XLA))
    with_kv = mem_xla.xla_device_memory(model, cp, system, XLA)
    monkeypatch.setattr(mem_xla, "cp_kv_buffer_bytes", lambda *a: 0.0)
    without = mem_xla.xla_device_memory(model, cp, system, XLA)
    assert kv > 0
    # The layer backward (phase B) is this step's peak: the K/V buffers add to it in full.
    assert float(with_kv.total_bytes - without.total_bytes) == pytest.approx(kv, rel=1e-4)


def test_sharded_xla_program_end_of_backward_holds_every_gradient():
    """ZeRO-3 + FSDP's root unit under XLA, m = 1 (memory.xla `with_units`): the end of the
    backward (the root's reduce-scatter, Y = Psi_r (q_w + q_g)) holds every gradient
    (G = Psi q_g / N) and no activation, so the peak is w + opt + B_l + workspace + Y + G
    whatever phase carries it. Llama 3 8B at s 512, dp 8, full recompute, xla-amp-bf16 (q_w =
    q_g = 4): Y = 2 V h 8 = 8.405 GB, G = 8,030,257,152 x 4 / 8 = 4.015 GB. Before, phase A's
    slack ignored that G grows from 0 (phase A at m = 1) to all of it: 0.34 GB short.
    Eager ops, no compiled program."""
    from diffperf.load import load_model
    from diffperf.memory.device import gathered_buffer_bytes

    model, system = load_model("llama3-8b").replace(seq_len=512), load_system("h100-sxm-80gb")
    par = Parallel(dp=8, micro_batch=1, global_batch=8, zero_stage=3, zero3_root_unit=1,
                   recompute=2)
    mem = mem_xla.xla_device_memory(model, par, system, XLA)
    vh, psi = 128256 * 4096, 8_030_257_152
    end = (float(mem.weights_bytes) + float(mem.optimizer_bytes)
           + float(gathered_buffer_bytes(model, par, XLA)) + float(system.eff.mem_reserved_bytes)
           + 2 * vh * 8 + psi * 4 / 8)
    assert float(mem.total_bytes) == pytest.approx(end, rel=1e-6)
    assert float(mem.weights_bytes) == pytest.approx(psi * 4 / 8, rel=1e-6)   # sharded states
