"""Distillation losses against the frozen target, which runs inside the train step.

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
from training.eagle3_ttt import shift_left, ttt_logits


def teacher(tp: dict, cfg: ModelConfig, tokens_BT: jax.Array, taps: tuple[int, ...] = ()):
    """The frozen target's float32 logits [B, T, V] and hidden-state taps."""
    logits, tapped, _ = model.forward(tp, cfg, tokens_BT, taps=taps)
    return jax.lax.stop_gradient(logits), tuple(jax.lax.stop_gradient(t) for t in tapped)


def soft_ce(student_XN: jax.Array, teacher_XN: jax.Array) -> jax.Array:
    """-sum_n softmax(teacher)_n log softmax(student)_n, per row (float32)."""
    s = student_XN.astype(jnp.float32)
    p = jax.nn.softmax(teacher_XN.astype(jnp.float32), axis=-1)
    return jax.nn.logsumexp(s, axis=-1) - jnp.sum(p * s, axis=-1)


def masked_mean(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.sum(x * w) / jnp.maximum(jnp.sum(w), 1.0)


def eagle3_loss(params: dict, frozen: dict, batch: dict, *, cfg: eagle3.Eagle3Config, num_steps: int = 7,
                decay: float = 0.8):
    """TTT loss: step j (weight decay^j) matches the target's distribution over the draft vocabulary
    at position t+1+j; positions whose target argmax lies outside the draft vocabulary are skipped
    (as SpecForge does). ``frozen = {"target": params, "draft_ids": int32 [N]}``."""
    tp, ids_N = frozen["target"], frozen["draft_ids"]
    tokens, weight = batch["tokens"], batch["weight"]
    t_logits, taps = teacher(tp, cfg.target, tokens, cfg.taps)
    t_arg_BT = jnp.argmax(t_logits, axis=-1)
    in_vocab_V = jnp.zeros((cfg.target.vocab_size,), bool).at[ids_N].set(True)
    t_draft_BTN = jnp.take(t_logits, ids_N, axis=-1)
    outs = ttt_logits(params, cfg, tp["embed"], tokens, taps, num_steps)
    total, losses, accs = 0.0, [], []
    for j, s_BTN in enumerate(outs):
        w = shift_left(weight, 1 + j)
        arg = shift_left(t_arg_BT, 1 + j)
        loss_j = masked_mean(soft_ce(s_BTN, shift_left(t_draft_BTN, 1 + j)), w * in_vocab_V[arg])
        hit = jnp.take(ids_N, jnp.argmax(s_BTN, axis=-1)) == arg
        total = total + decay ** j * loss_j
        losses.append(loss_j)
        accs.append(masked_mean(hit.astype(jnp.float32), w))
    return total, {"loss_k": jnp.stack(losses), "acc_k": jnp.stack(accs)}


def medusa_loss(params: dict, frozen: dict, batch: dict, *, cfg: medusa.MedusaConfig, decay: float = 0.8):
    """Head k (weight decay^k) matches the target's distribution at position t+1+k.
    ``frozen = {"target": params}``."""
    tp = frozen["target"]
    tokens, weight = batch["tokens"], batch["weight"]
    t_logits, (h_BTD,) = teacher(tp, cfg.target, tokens, cfg.taps)
    t_arg_BT = jnp.argmax(t_logits, axis=-1)
    total, losses, accs = 0.0, [], []
    for k in range(cfg.num_heads):
        head = {name: x[k:k + 1] for name, x in params.items()}
        s_BTV = medusa.logits(head, cfg, h_BTD, tp)[0]
        w = shift_left(weight, 1 + k)
        loss_k = masked_mean(soft_ce(s_BTV, shift_left(t_logits, 1 + k)), w)
        hit = jnp.argmax(s_BTV, axis=-1) == shift_left(t_arg_BT, 1 + k)
        total = total + decay ** k * loss_k
        losses.append(loss_k)
        accs.append(masked_mean(hit.astype(jnp.float32), w))
    return total, {"loss_k": jnp.stack(losses), "acc_k": jnp.stack(accs)}


def distill_loss(params: dict, frozen: dict, batch: dict, *, cfg: ModelConfig, target_cfg: ModelConfig):
    """A small Llama (trainable layers + final norm; embedding/LM head shared with the target and
    frozen) matches the target's next-token distribution at every weighted position.
    ``frozen = {"target": params, "shared": {"embed": ..., ("lm_head": ...)}}``."""
    tokens, weight = batch["tokens"], batch["weight"]
    t_logits, _ = teacher(frozen["target"], target_cfg, tokens)
    shared = jax.tree.map(lambda x: x.astype(params["final_norm"].dtype), frozen["shared"])
    s_logits, _, _ = model.forward({**shared, **params}, cfg, tokens)
    loss = masked_mean(soft_ce(s_logits, t_logits), weight)
    hit = jnp.argmax(s_logits, axis=-1) == jnp.argmax(t_logits, axis=-1)
    return loss, {"loss_k": loss[None], "acc_k": masked_mean(hit.astype(jnp.float32), weight)[None]}
