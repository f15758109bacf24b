"""predict._layer_parts' GPU and host seconds, read where it takes their smooth maximum."""

import importlib

from diffperf.api import _as_float


def layer_gpu_host_s(monkeypatch, model, parallel, system, trainings):
    """For each training, ((GPU forward, host forward), (GPU backward, host backward)) seconds
    of one layer and micro-batch: the first two pairs `predict._layer_parts` passes to
    `predict.pnorm_max` (the smooth max of the GPU time and the host's launch floor), with the
    features `features_of` finds for that training (eager, nothing compiled)."""
    pr = importlib.import_module("diffperf.predict")  # the module, not diffperf.predict()
    seen = []
    real = pr.pnorm_max
    monkeypatch.setattr(pr, "pnorm_max", lambda a, b, p: seen.append((a, b)) or real(a, b, p))
    out = []
    for tr in trainings:
        seen.clear()
        M, P, S, T = _as_float((model, parallel, system, tr))
        pr._layer_parts(M, P, S, T, None, features=pr.features_of(M, P, T))
        out.append([(float(a), float(b)) for a, b in seen[:2]])
    return out
