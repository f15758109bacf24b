"""A small, real JAX decoder Transformer training step, used as a FLOP reference.

Token embedding (gather), L pre-norm layers (LayerNorm or RMSNorm), causal self-attention with
grouped-query heads (K/V heads repeated to the query heads) written in plain jnp (the s x s
score matrix is materialised and masked; no flash kernel), a GELU or SwiGLU MLP, a final norm,
an untied output layer and a mean cross-entropy loss. The step is `jax.value_and_grad` of the
loss followed by an optax AdamW update. Layers are an unrolled Python loop (no `lax.scan`), so
XLA's `cost_analysis()` sees every layer: it counts a scan body only once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax


@dataclass(frozen=True)
class Config:
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    micro_batch: int = 1
    gated_mlp: bool = False
    rms_norm: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads

    def as_diffperf_dict(self) -> dict:
        """The same model in diffperf's YAML schema (`diffperf.load.model_from_dict`)."""
        return dict(num_layers=self.n_layers, hidden=self.hidden, ffn_hidden=self.ffn_hidden,
                    num_heads=self.n_heads, num_kv_heads=self.n_kv_heads,
                    head_dim=self.head_dim, vocab=self.vocab, seq_len=self.seq_len,
                    gated_mlp=self.gated_mlp, attention="causal",
                    norm="rmsnorm" if self.rms_norm else "layernorm",
                    tied_embeddings=False, biases=False, learned_positions=False)


def _norm_params(cfg):
    p = {"scale": jnp.ones((cfg.hidden,), jnp.float32)}
    if not cfg.rms_norm:
        p["shift"] = jnp.zeros((cfg.hidden,), jnp.float32)
    return p


def init_params(cfg: Config, key):
    """Parameters as a pytree of fp32 arrays (scaled normal initialisation)."""
    h, dh, f = cfg.hidden, cfg.head_dim, cfg.ffn_hidden
    keys = iter(jax.random.split(key, 2 + 7 * cfg.n_layers))

    def w(shape):
        return jax.random.normal(next(keys), shape, jnp.float32) / jnp.sqrt(shape[0])

    layers = []
    for _ in range(cfg.n_layers):
        layer = {
            "norm1": _norm_params(cfg),
            "wq": w((h, cfg.n_heads * dh)),
            "wk": w((h, cfg.n_kv_heads * dh)),
            "wv": w((h, cfg.n_kv_heads * dh)),
            "wo": w((cfg.n_heads * dh, h)),
            "norm2": _norm_params(cfg),
            "w_up": w((h, f)),
            "w_down": w((f, h)),
        }
        if cfg.gated_mlp:
            layer["w_gate"] = w((h, f))
        layers.append(layer)
    return {
        "embed": jax.random.normal(next(keys), (cfg.vocab, h), jnp.float32) * 0.02,
        "layers": layers,
        "final_norm": _norm_params(cfg),
        "w_out": w((h, cfg.vocab)),
    }


def _norm(p, x, rms_norm, eps=1e-6):
    if rms_norm:
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * p["scale"]
    mu = jnp.mean(x, axis=-1, keepdims=True)
    xc = x - mu
    var = jnp.mean(xc * xc, axis=-1, keepdims=True)
    return xc * jax.lax.rsqrt(var + eps) * p["scale"] + p["shift"]


def _attention(cfg, p, x):
    """Causal GQA self-attention with materialised scores (plain jnp, no fused kernel)."""
    b, s, _ = x.shape
    a, akv, dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    q = (x @ p["wq"]).reshape(b, s, a, dh)
    k = (x @ p["wk"]).reshape(b, s, akv, dh)
    v = (x @ p["wv"]).reshape(b, s, akv, dh)
    k = jnp.repeat(k, a // akv, axis=2)          # GQA: each K/V head serves a / akv query heads
    v = jnp.repeat(v, a // akv, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(dh))
    mask = jnp.tril(jnp.ones((s, s), dtype=bool))
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, a * dh)
    return out @ p["wo"]


def _mlp(cfg, p, x):
    if cfg.gated_mlp:
        return (jax.nn.silu(x @ p["w_gate"]) * (x @ p["w_up"])) @ p["w_down"]
    return jax.nn.gelu(x @ p["w_up"], approximate=True) @ p["w_down"]


def loss_fn(cfg: Config, params, tokens, targets):
    """Mean next-token cross-entropy of a (b, s) batch."""
    x = jnp.take(params["embed"], tokens, axis=0)             # gather, no matmul
    for layer in params["layers"]:                             # unrolled: no lax.scan
        x = x + _attention(cfg, layer, _norm(layer["norm1"], x, cfg.rms_norm))
        x = x + _mlp(cfg, layer, _norm(layer["norm2"], x, cfg.rms_norm))
    x = _norm(params["final_norm"], x, cfg.rms_norm)
    logits = x @ params["w_out"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def make_step(cfg: Config, optimizer):
    """One training step: loss and gradients by `value_and_grad`, then the AdamW update."""

    def step(params, opt_state, tokens, targets):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(cfg, p, tokens, targets))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def compiled_step(cfg: Config):
    """The jitted, lowered and compiled step for `cfg` (abstract shapes: nothing is run)."""
    optimizer = optax.adamw(1e-3, weight_decay=0.1)
    params = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    opt_state = jax.eval_shape(optimizer.init, params)
    tok = jax.ShapeDtypeStruct((cfg.micro_batch, cfg.seq_len), jnp.int32)
    return jax.jit(make_step(cfg, optimizer)).lower(params, opt_state, tok, tok).compile()


def xla_flops(compiled) -> float:
    """'flops' of `compiled.cost_analysis()`: a dict in recent JAX, a list of one dict per
    module in older versions (summed)."""
    cost = compiled.cost_analysis()
    if isinstance(cost, dict):
        cost = [cost]
    return float(sum(c.get("flops", 0.0) for c in cost if c))


def n_params(cfg: Config) -> int:
    params = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    return int(sum(x.size for x in jax.tree_util.tree_leaves(params)))


# ------------------------------------------------------------------ the scanned XLA program
# The H100 JAX runs' program as data/README.md describes it (the reference of
# diffperf/memory/xla.py and diffperf/workload/xla.py): fp32 parameters with the layers
# stacked and run as one `lax.scan`, bf16 matmul inputs and residual stream, RMSNorm in fp32,
# flash attention (here a stand-in with the cuDNN rule's residuals and no s x s buffer, so
# that it runs on the CPU), gradient accumulation as a `lax.scan` over micro-batches,
# `jax.checkpoint` around the layer for full recompute, AdamW (the measured runs donate the
# parameter and optimizer buffers; the jaxpr and its dot counts, all these tests read, do not
# depend on donation, so `make_scan_step` is not jitted with donate_argnums).

BF16 = jnp.bfloat16


def stacked_param_shapes(cfg: Config):
    """Abstract fp32 parameters with the layers stacked on a leading axis of n_layers."""
    L, h, dh, f = cfg.n_layers, cfg.hidden, cfg.head_dim, cfg.ffn_hidden
    layers = dict(norm1=(L, h), wq=(L, h, cfg.n_heads * dh), wk=(L, h, cfg.n_kv_heads * dh),
                  wv=(L, h, cfg.n_kv_heads * dh), wo=(L, cfg.n_heads * dh, h), norm2=(L, h),
                  w_up=(L, h, f), w_down=(L, f, h))
    if cfg.gated_mlp:
        layers["w_gate"] = (L, h, f)
    shapes = dict(embed=(cfg.vocab, h), layers=layers, final_norm=(h,), w_out=(h, cfg.vocab))
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32), shapes,
                        is_leaf=lambda x: isinstance(x, tuple))


def _rms_fp32(x, scale, eps=1e-6):
    x32 = x.astype(jnp.float32)
    return x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps) * scale


@jax.custom_vjp
def flash_standin(q, k, v):
    """[b, s, a, d] attention output with cuDNN flash attention's memory behaviour: O(b s a d)
    work, no s x s buffer, and the residuals of JAX's cuDNN rule (q, k, v, the output and the
    fp32 softmax statistics [b, a, s]). Its values are not attention's."""
    return _flash_fwd(q, k, v)[0]


def _flash_fwd(q, k, v):
    group = q.shape[2] // k.shape[2]
    kv = jnp.repeat(k.astype(jnp.float32) + v.astype(jnp.float32), group, axis=2)
    out = (q.astype(jnp.float32) * jnp.cumsum(kv, axis=1)).astype(q.dtype)
    stats = jnp.swapaxes(jnp.sum(q.astype(jnp.float32), -1), 1, 2)
    return out, (q, k, v, out, stats)


def _flash_bwd(res, d_out):
    q, k, v, out, stats = res
    group = q.shape[2] // k.shape[2]
    d32 = d_out.astype(jnp.float32) * (1.0 + jnp.swapaxes(stats, 1, 2)[..., None])
    dq = (d32 * out.astype(jnp.float32)).astype(q.dtype)
    t = (d32 * q.astype(jnp.float32)).reshape(*k.shape[:3], group, k.shape[3]).sum(3)
    return dq, (t * k.astype(jnp.float32)).astype(k.dtype), (t * v.astype(jnp.float32)).astype(
        v.dtype)


flash_standin.defvjp(_flash_fwd, _flash_bwd)


def scan_layer(cfg: Config, x, w):
    """One pre-RMSNorm layer on the bf16 residual stream x; w: this layer's fp32 weights."""
    b, s, h = x.shape
    a, akv, dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    cast = {k: v.astype(BF16) for k, v in w.items() if v.ndim == 2}
    n = _rms_fp32(x, w["norm1"]).astype(BF16)
    q = (n @ cast["wq"]).reshape(b, s, a, dh)
    k = (n @ cast["wk"]).reshape(b, s, akv, dh)
    v = (n @ cast["wv"]).reshape(b, s, akv, dh)
    x = x + flash_standin(q, k, v).reshape(b, s, a * dh) @ cast["wo"]
    n = _rms_fp32(x, w["norm2"]).astype(BF16)
    if cfg.gated_mlp:
        u = jax.nn.silu(n @ cast["w_gate"]) * (n @ cast["w_up"])
    else:
        u = jax.nn.gelu(n @ cast["w_up"], approximate=True)
    return x + u @ cast["w_down"], None


def scan_loss(cfg: Config, params, tokens, targets, remat: bool):
    body = functools.partial(scan_layer, cfg)
    x = jnp.take(params["embed"], tokens, axis=0).astype(BF16)
    x, _ = jax.lax.scan(jax.checkpoint(body) if remat else body, x, params["layers"])
    logits = _rms_fp32(x, params["final_norm"]).astype(BF16) @ params["w_out"].astype(BF16)
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), targets).mean()


def make_scan_step(cfg: Config, optimizer, remat: bool = False):
    """step(params, opt_state, tokens [m, b, s], targets): m micro-batches accumulated by a
    `lax.scan` (one micro-batch: no scan), then the optimizer update."""
    grad_fn = jax.value_and_grad(functools.partial(scan_loss, cfg, remat=remat))

    def step(params, opt_state, tokens, targets):
        m = tokens.shape[0]
        if m == 1:
            loss, grads = grad_fn(params, tokens[0], targets[0])
        else:
            def accumulate(carry, batch):
                g_sum, l_sum = carry
                loss, g = grad_fn(params, *batch)
                return (jax.tree.map(jnp.add, g_sum, g), l_sum + loss), None

            zeros = jax.tree.map(jnp.zeros_like, params)
            (grads, loss), _ = jax.lax.scan(accumulate, (zeros, 0.0), (tokens, targets))
            grads, loss = jax.tree.map(lambda g: g / m, grads), loss / m
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def scan_step_args(cfg: Config, n_microbatches: int = 1):
    """(optimizer, abstract params, abstract optimizer state, abstract tokens) of the step."""
    optimizer = optax.adamw(1e-4, weight_decay=0.1)
    params = stacked_param_shapes(cfg)
    tokens = jax.ShapeDtypeStruct((n_microbatches, cfg.micro_batch, cfg.seq_len), jnp.int32)
    return optimizer, params, jax.eval_shape(optimizer.init, params), tokens
