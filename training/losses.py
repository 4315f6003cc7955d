"""Distillation losses against the frozen target, which runs inside the train step (for the draft model it
may instead come from the target's hidden states cached once, ``training/teacher_cache.py``).

A batch is ``{"tokens": int32 [B, T], "weight": float32 [B, T]}``; ``weight[p] = 1`` where the
target's distribution at position p (predicting token p+1) is to be learned. Every loss is a soft
cross-entropy against that distribution; each returns ``(loss, metrics)`` with per-offset losses and
an acceptance proxy (draft argmax == target argmax) over the weighted positions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax import model
from specjax.config import ModelConfig
from specjax.heads import eagle3, medusa
from training import teacher_cache
from training.eagle3_ttt import ttt_logits


def teacher(tp: dict, cfg: ModelConfig, tokens_BT: jax.Array, taps: tuple[int, ...] = ()):
    """The frozen target's float32 logits [B, T, V] and hidden-state taps."""
    logits, tapped, _ = model.forward(tp, cfg, tokens_BT, taps=taps)
    return jax.lax.stop_gradient(logits), tuple(jax.lax.stop_gradient(t) for t in tapped)


def soft_ce(student_XN: jax.Array, p_XN: jax.Array) -> jax.Array:
    """-sum_n p_n log softmax(student)_n per row, for a teacher distribution ``p`` (float32)."""
    s = student_XN.astype(jnp.float32)
    return jax.nn.logsumexp(s, axis=-1) - jnp.sum(p_XN * s, axis=-1)


def masked_mean(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.sum(x * w) / jnp.maximum(jnp.sum(w), 1.0)


def ahead(x_BT: jax.Array, n: int) -> jax.Array:
    """Rows n.. of a [B, T, ...] array: row t of the result is position t+n (a slice, no padded copy)."""
    return x_BT[:, n:]


def offset_terms(s_BTX: jax.Array, p_BTX: jax.Array, t_arg_BT: jax.Array, weight_BT: jax.Array, n: int,
                 to_target=lambda i: i, loss_mask_BT=None):
    """Loss and acceptance proxy of predictions at rows t for the teacher at positions t+n."""
    T = s_BTX.shape[1]
    s = s_BTX[:, :T - n]
    w = ahead(weight_BT, n)
    lw = w if loss_mask_BT is None else w * ahead(loss_mask_BT, n)
    hit = to_target(jnp.argmax(s, axis=-1)) == ahead(t_arg_BT, n)
    return masked_mean(soft_ce(s, ahead(p_BTX, n)), lw), masked_mean(hit.astype(jnp.float32), w)


def eagle3_loss(params: dict, frozen: dict, batch: dict, *, cfg: eagle3.Eagle3Config, num_steps: int = 7,
                decay: float = 0.8):
    """TTT loss: step j (weight decay^j) at row t matches the target's distribution over the draft
    vocabulary at position t+1+j; positions whose target argmax lies outside the draft vocabulary
    are left out of the loss (as SpecForge does) but count, as misses, in the acceptance proxy.
    ``frozen = {"target": params, "draft_ids": int32 [N]}``."""
    tp, ids_N = frozen["target"], frozen["draft_ids"]
    tokens, weight = batch["tokens"], batch["weight"]
    t_logits, taps = teacher(tp, cfg.target, tokens, cfg.taps)
    t_arg_BT = jnp.argmax(t_logits, axis=-1)
    in_vocab_BT = jnp.zeros((cfg.target.vocab_size,), bool).at[ids_N].set(True)[t_arg_BT]
    p_BTN = jax.nn.softmax(jnp.take(t_logits, ids_N, axis=-1), axis=-1)
    outs = ttt_logits(params, cfg, tp["embed"], tokens, taps, num_steps)
    terms = [offset_terms(s, p_BTN, t_arg_BT, weight, 1 + j, lambda i: jnp.take(ids_N, i), in_vocab_BT)
             for j, s in enumerate(outs)]
    return _combine(terms, decay)


def medusa_loss(params: dict, frozen: dict, batch: dict, *, cfg: medusa.MedusaConfig, decay: float = 0.8):
    """Head k (weight decay^k) at row t matches the target's distribution at position t+1+k.
    ``frozen = {"target": params}``."""
    tp = frozen["target"]
    tokens, weight = batch["tokens"], batch["weight"]
    t_logits, (h_BTD,) = teacher(tp, cfg.target, tokens, cfg.taps)
    t_arg_BT = jnp.argmax(t_logits, axis=-1)
    p_BTV = jax.nn.softmax(t_logits, axis=-1)
    terms = []
    for k in range(cfg.num_heads):  # one head at a time: [B, T, V] logits, not [K, B, T, V]
        head = {name: x[k:k + 1] for name, x in params.items()}
        terms.append(offset_terms(medusa.logits(head, cfg, h_BTD, tp)[0], p_BTV, t_arg_BT, weight, 1 + k))
    return _combine(terms, decay)


def _combine(terms, decay: float):
    losses = jnp.stack([loss for loss, _ in terms])
    total = jnp.sum(losses * decay ** jnp.arange(len(terms), dtype=jnp.float32))
    return total, {"loss_k": losses, "acc_k": jnp.stack([acc for _, acc in terms])}


def distill_loss(params: dict, frozen: dict, batch: dict, *, cfg: ModelConfig, target_cfg: ModelConfig):
    """A small Llama (trainable layers + final norm; embedding/LM head shared with the target and
    frozen) matches the target's next-token distribution at every weighted position.
    ``frozen = {"target": params, "shared": {"embed": ..., ("lm_head": ...)}}``, plus ``"t_hidden"`` when
    the batches carry ``t_index`` (``training/teacher_cache.py``: the target's logits from its cached
    hidden states instead of a forward of the target)."""
    tokens, weight = batch["tokens"], batch["weight"]
    if "t_index" in batch:
        t_logits = teacher_cache.teacher_logits(frozen["target"], target_cfg, frozen["t_hidden"], batch["t_index"])
    else:
        t_logits, _ = teacher(frozen["target"], target_cfg, tokens)
    shared = jax.tree.map(lambda x: x.astype(params["final_norm"].dtype), frozen["shared"])
    s_logits, _, _ = model.forward({**shared, **params}, cfg, tokens)
    loss, acc = offset_terms(s_logits, jax.nn.softmax(t_logits, axis=-1), jnp.argmax(t_logits, axis=-1), weight, 0)
    return loss, {"loss_k": loss[None], "acc_k": acc[None]}
