"""A small, real JAX decoder Transformer training step, used as a FLOP reference.

Token embedding (gather), L pre-norm layers (LayerNorm or RMSNorm), causal self-attention with
grouped-query heads (K/V heads repeated to the query heads) written in plain jnp (the s x s
score matrix is materialised and masked; no flash kernel), a GELU or SwiGLU MLP, a final norm,
an untied output layer and a mean cross-entropy loss. The step is `jax.value_and_grad` of the
loss followed by an optax AdamW update. Layers are an unrolled Python loop (no `lax.scan`), so
XLA's `cost_analysis()` sees every layer: it counts a scan body only once.
"""

from __future__ import annotations

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
