"""Time, GPU-hours, energy and cost of training on a token budget at a predicted throughput."""

from __future__ import annotations

from dataclasses import dataclass

_S_PER_DAY = 86_400.0
_S_PER_H = 3_600.0
_J_PER_MWH = 3.6e9


@dataclass(frozen=True)
class Budget:
    """What `tokens` cost at `tokens_per_s` on `gpus` devices."""
    tokens: float
    days: float
    gpu_hours: float
    energy_MWh: float
    usd: float | None  # None without a price per GPU-hour


def token_budget(tokens, tokens_per_s, gpus, power_W, usd_per_gpu_hour=None) -> Budget:
    """Wall time, GPU-hours, GPU energy and dollars of training on `tokens` tokens.

        t = D / R,   GPU-hours = N t / 3600,   E = N P t,   $ = GPU-hours x price

    D = tokens, R = tokens_per_s (Result.tokens_per_s: the step's tokens / step time, no
    failures or checkpoints: see Result.goodput for those), N = gpus, P = power_W (the
    system's board power per device, System.power_W: its datasheet TDP), price =
    usd_per_gpu_hour. The energy is that of the accelerator boards running at their rated
    power: an upper end for the boards (they draw less when communication stalls them) and
    a lower end for the facility (no host CPUs, network, storage, cooling: multiply by the
    data centre's PUE). Source: Patterson et al. (2021), "Carbon Emissions and Large Neural
    Network Training", section 2: energy = training hours x number of processors x average
    power per processor (x PUE for the facility).
    Example: 1e12 tokens at 1e6 tokens/s on 1024 GPUs of 400 W: 1e6 s = 11.57 days,
    284,444 GPU-hours, 1024 x 400 W x 1e6 s = 4.096e11 J = 113.8 MWh; at $2/GPU-hour
    $568,889.
    """
    t = float(tokens) / float(tokens_per_s)
    gpu_hours = float(gpus) * t / _S_PER_H
    return Budget(tokens=float(tokens), days=t / _S_PER_DAY, gpu_hours=gpu_hours,
                  energy_MWh=float(gpus) * float(power_W) * t / _J_PER_MWH,
                  usd=None if usd_per_gpu_hour is None else gpu_hours * float(usd_per_gpu_hour))
