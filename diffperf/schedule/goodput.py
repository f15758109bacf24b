"""Goodput at scale: the fraction of wall time a job trains, given failures and checkpoints.

A synchronous job of n devices stops at every failure of any of them, restarts (R), and
redoes the work since its last checkpoint; a checkpoint of its state stalls it for delta.
Failures are a Poisson process of rate n lambda (MTBF M = 1 / (n lambda)). Daly's (2006)
complete model gives the expected wall time of each segment of tau seconds of training:

    E(tau) = M e^{R/M} (e^{(tau + delta)/M} - 1)                                (Daly eq.)

(a segment of s = tau + delta seconds is retried until it runs s seconds without a failure:
e^{s/M} - 1 failures expected, each losing M - s / (e^{s/M} - 1) seconds of work on average
plus a restart of expected length M (e^{R/M} - 1), the restart itself being retried when a
failure hits it). Per unit wall time E splits into

    goodput     tau / E                       training that is kept
    checkpoint  delta / E                     writing checkpoints
    rework      (M (e^{s/M} - 1) - s) / E     work lost since the last checkpoint
    restart     1 - e^{-R/M}                  detecting, rescheduling, reloading
which sum to 1. Sources: J. W. Young (1974), "A first order approximation to the optimum
checkpoint interval", CACM 17(9):530-531; J. T. Daly (2006), "A higher order estimate of the
optimum checkpoint interval for restart dumps", Future Gener. Comput. Syst. 22(3):303-312
(figures 3-5: M = 24 h, 6 h, 15 min with delta = 5 min, R = 10 min give tau_opt = 117, 57,
9.1 min). The reliability figures that feed it: configs/README.md, "Reliability".
"""

from __future__ import annotations

import jax.numpy as jnp

_SERIES_BELOW = 0.1  # _lost_work_share: Taylor series below this x (see there)


def checkpoint_bytes(n_params, training):
    """Bytes of one checkpoint of the job: one copy of its model and optimizer state.

        V = N (q_w + q_master + q_opt)

    N = parameters of the model (workload.params.total_params), q_w = training.weight_bytes,
    q_master = training.master_bytes (fp32 master weights, 0 when the weights are the
    master), q_opt = training.optimizer_bytes (Adam m and v). Gradients are not saved (the
    step boundary has none). The data-parallel replicas hold the same weights, and ZeRO shards
    are disjoint pieces of one copy, so a distributed checkpoint (Megatron-Core dist-ckpt,
    torch.distributed.checkpoint) writes one copy of the state, spread over the ranks: V
    does not depend on the layout.
    Example: Llama 3 405B (N = 405.85e9), bf16 + fp32 master + Adam (2 + 4 + 8 = 14 B):
    5.68 TB.
    """
    return n_params * (training.weight_bytes + training.master_bytes + training.optimizer_bytes)


def checkpoint_write_s(bytes_, storage_write_Bps):
    """Time the job stalls to write one checkpoint: delta = V / B.

    B = the storage's write bandwidth for the whole job. Assumes the writes are synchronous
    (the step waits for them; an asynchronous checkpoint stalls only for its copy to host
    memory, so this is the upper end) and that the job's devices together can saturate B (at
    thousands of devices the storage, not their network links, is the limit; for a small job
    the per-node links bound the write, and delta is underestimated).
    Source: Daly (2006), the dump time delta of the model above; B for Llama 3 from Dubey et
    al. 2024 (arXiv:2407.21783) section 3.3.1, Tectonic's 2 TB/s sustained (configs/README.md,
    "Reliability").
    Example: V = 5.68 TB at B = 2 TB/s (Llama 3's Tectonic, sustained): 2.84 s.
    """
    return bytes_ / storage_write_Bps


def job_mtbf_s(failure_rate_per_s, n_devices):
    """Mean time between failures of the job: M = 1 / (n lambda).

    lambda = failures per device per second (all causes, normalised per device), n = devices:
    independent devices whose failures are Poisson processes add their rates, and any one
    stops a synchronous job (Daly 2006, section 2: the system MTBF M of the model above).
    Source for lambda: Dubey et al. 2024 (arXiv:2407.21783) section 3.3.4, 419 unexpected
    interruptions in 54 days on 16,384 GPUs (configs/README.md, "Reliability").
    Example: Llama 3's 1.973e-5 per GPU-hour on 16,384 GPUs: 3.09 h = 11,135 s.
    """
    return 1.0 / (failure_rate_per_s * n_devices)


def young_interval_s(delta, M):
    """Young's (1974) optimum checkpoint interval, to first order: tau = sqrt(2 delta M).

    The minimum of the first-order waste delta / tau + tau / (2 M) (delta << tau << M).
    Example: delta = 300 s, M = 86,400 s: 7,200 s.
    """
    return jnp.sqrt(2.0 * delta * M)


def daly_interval_s(delta, M):
    """Daly's (2006) higher-order optimum checkpoint interval (the perturbation solution):

        tau = sqrt(2 delta M) [1 + (1/3) sqrt(xi) + xi / 9] - delta,   xi = delta / (2 M) < 1
        tau = M                                                          xi >= 1
    It minimises E(tau) / tau of the module's model; its relative error against the exact
    minimum is about 0.03 xi^{3/2} (Young's: about (2/3) sqrt(xi)).
    Example (Daly's figure 3): delta = 300 s, M = 86,400 s: xi = 1/576, tau = 7,200
    (1 + 1/72 + 1/5184) - 300 = 7,001.39 s (Daly: 117 min).
    """
    xi = delta / (2.0 * M)
    tau = jnp.sqrt(2.0 * delta * M) * (1.0 + jnp.sqrt(xi) / 3.0 + xi / 9.0) - delta
    # Both branches are finite for delta, M > 0, so a plain where has finite gradients.
    return jnp.where(xi < 1.0, tau, M)


def _log_expm1(x):
    """ln(e^x - 1) for x > 0, as x + ln(1 - e^{-x}): no overflow at large x (a job whose
    segments almost never finish), no cancellation at small x (expm1)."""
    return x + jnp.log(-jnp.expm1(-x))


def _lost_work_share(x):
    """1 - x / (e^x - 1) for x > 0: the share of a segment's expected failed time that is lost
    work rather than the segment itself. Below _SERIES_BELOW the Taylor series of
    (e^x - 1 - x) / (e^x - 1), x/2 (1 + x/3 + x^2/12 + x^3/60) / ((e^x - 1)/x) (truncation
    below 3e-7 relative), which avoids the cancellation of 1 - x / (e^x - 1) ~ x/2; above
    it, 1 - x e^{-x} / (1 - e^{-x}), finite when e^x overflows. Each branch sees its own
    clamped x, so the masked one stays finite and jnp.where passes no NaN gradient."""
    below = x < _SERIES_BELOW
    small = jnp.where(below, x, _SERIES_BELOW)  # not jnp.minimum: at a tie it would pass
    large = jnp.where(below, _SERIES_BELOW, x)  # half the gradient to each branch
    series = 0.5 * small * (1.0 + small / 3.0 + small * small / 12.0
                            + small * small * small / 60.0) / (jnp.expm1(small) / small)
    direct = 1.0 - large * jnp.exp(-large) / -jnp.expm1(-large)
    return jnp.where(below, series, direct)


def log_goodput_frac(tau, delta, M, R):
    """ln G = ln tau - ln E(tau): the log of the goodput fraction (module docstring),

        ln G = ln tau - ln M - R / M - ln(e^{(tau + delta)/M} - 1)
    evaluated in log space so that G underflows to 0 gracefully (finite gradients) when the
    failures win (M << R or M << delta).
    """
    return jnp.log(tau) - jnp.log(M) - R / M - _log_expm1((tau + delta) / M)


def lost_fracs(tau, delta, M, R):
    """(goodput, checkpoint, rework, restart) fractions of wall time (module docstring).

    Regimes: delta, R << tau << M gives goodput ~ 1 - delta/tau - tau/(2M) - R/M (Young's
    first-order waste); at Young's tau both first-order terms equal sqrt(delta / (2M)).
    Example (Daly's figure 3: M = 24 h, delta = 5 min, R = 10 min, tau = 7,001.39 s): a
    segment costs E = 86,400 e^{1/144} (e^{7,301.39/86,400} - 1) = 7,671.87 s, so goodput
    7,001.39 / 7,671.87 = 0.9126, checkpoint 300 / 7,671.87 = 0.0391, rework 0.0414,
    restart 1 - e^{-1/144} = 0.0069.
    """
    goodput = jnp.exp(log_goodput_frac(tau, delta, M, R))
    checkpoint = goodput * delta / tau
    # rework = M (e^x - 1 - x) / E = e^{-R/M} (1 - x / (e^x - 1)),  x = (tau + delta) / M
    rework = jnp.exp(-R / M) * _lost_work_share((tau + delta) / M)
    return goodput, checkpoint, rework, -jnp.expm1(-R / M)
