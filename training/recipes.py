"""The three recipes on one corpus: EAGLE-3 head, Medusa heads, distilled draft model.

Each takes the frozen target ``(cfg, tp)`` (in the compute dtype), a ``TokenDataset`` and a
``TrainConfig`` and returns the trained float32 params with the ``TrainResult``.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.heads import eagle3, medusa
from training import data, losses, teacher_cache
from training.loop import TrainConfig, train


def train_eagle3(tp: dict, cfg: ModelConfig, ds: data.TokenDataset, tc: TrainConfig, *, draft_vocab_size: int,
                 ttt_steps: int = 7, decay: float = 0.8, seed: int = 0, heldout: data.TokenDataset | None = None,
                 init: tuple | None = None):
    """-> (Eagle3Config, params, draft_ids_N, TrainResult). The draft vocabulary is the most frequent
    response tokens of ``ds``. All head weights start random (as in SpecForge): on SmolLM2 that
    trained faster than starting the LM head from the target's rows, whose peaked logits on the
    untrained head's hidden states start from a loss far above uniform. ``init``: ``(Eagle3Config,
    params, draft_ids_N)`` of a trained head (``eagle3_io.load_eagle3``) to fine-tune instead: its
    weights become the float32 master weights and its draft vocabulary is kept (``draft_vocab_size``
    must equal it); the optimizer starts afresh (warmup + cosine over ``tc.steps``)."""
    if init is None:
        ids_N = jnp.asarray(data.draft_vocab(data.response_token_counts(ds, cfg.vocab_size), draft_vocab_size))
        ecfg = eagle3.Eagle3Config(cfg, draft_vocab_size)
        params = eagle3.init_params(ecfg, jax.random.key(seed))
    else:
        ecfg, params, ids_N = init
        shape = lambda c: (c.vocab_size, c.d_model, c.n_layers)  # noqa: E731
        if ecfg.draft_vocab_size != draft_vocab_size or shape(ecfg.target) != shape(cfg):
            raise ValueError(f"the head to fine-tune has draft vocabulary {ecfg.draft_vocab_size} over a target of "
                             f"(vocab, width, layers) {shape(ecfg.target)}; expected {draft_vocab_size} over "
                             f"{shape(cfg)}: pass the draft_vocab_size and the target the head was trained with")
        ecfg = eagle3.Eagle3Config(cfg, ecfg.draft_vocab_size, ecfg.taps, ecfg.ffn_dim)  # this target's numerics
        params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
        ids_N = jnp.asarray(ids_N, jnp.int32)
    loss = functools.partial(losses.eagle3_loss, cfg=ecfg, num_steps=ttt_steps, decay=decay)
    res = train(loss, params, {"target": tp, "draft_ids": ids_N}, ds, tc, desc="eagle3", heldout=heldout)
    return ecfg, res.params, ids_N, res


def train_medusa(tp: dict, cfg: ModelConfig, ds: data.TokenDataset, tc: TrainConfig, *, num_heads: int = 4,
                 own_lm_head: bool = False, decay: float = 0.8, heldout: data.TokenDataset | None = None):
    """-> (MedusaConfig, params, TrainResult). Residual blocks start as the identity."""
    mcfg = medusa.MedusaConfig(cfg, num_heads=num_heads, own_lm_head=own_lm_head)
    params = medusa.init_params(mcfg, tp)
    loss = functools.partial(losses.medusa_loss, cfg=mcfg, decay=decay)
    res = train(loss, params, {"target": tp}, ds, tc, desc="medusa", heldout=heldout)
    return mcfg, res.params, res


def shared_of(tp: dict, cfg: ModelConfig) -> dict:
    """The target's embedding (and untied LM head), shared frozen with a draft model."""
    return {k: tp[k] for k in ("embed", "lm_head") if k in tp and (k == "embed" or not cfg.tie_embeddings)}


def init_draft(tp: dict, cfg: ModelConfig, n_layers: int) -> tuple[ModelConfig, dict]:
    """A draft of ``n_layers`` layers at the target's width, started as the target truncated to its
    first ``n_layers`` layers (+ its final norm): an early exit, which distills from a far lower
    loss than spread-out or random layers. Only these layers and the norm are trained."""
    if not 0 < n_layers < cfg.n_layers:
        raise ValueError(f"a draft model needs 1 <= n_layers < {cfg.n_layers} (the target's depth), got {n_layers}")
    dcfg = cfg.replace(n_layers=n_layers)
    layers = [jax.tree.map(jnp.asarray, tp["layers"][i]) for i in range(n_layers)]
    return dcfg, {"layers": layers, "final_norm": tp["final_norm"]}


def train_draft(tp: dict, cfg: ModelConfig, ds: data.TokenDataset, tc: TrainConfig, *, n_layers: int = 2,
                heldout: data.TokenDataset | None = None, cache_teacher: bool = False, init: tuple | None = None):
    """-> (draft ModelConfig, full draft params incl. the shared embedding, TrainResult).
    ``cache_teacher``: run the target over ``ds`` once (``teacher_cache.build``, held on the device) and
    take its logits from those hidden states in every step instead of a forward of the target; the
    held-out rows still run the target. Its build time counts against ``tc.max_seconds``.
    ``init``: ``(ModelConfig, params)`` of a trained draft model (``draft_io.fine_tune_start(folder)[0]``, i.e.
    ``load_draft_model(..., full_vocab=True)``) to fine-tune instead of the truncated target: its layers and final
    norm become the float32 master weights (``n_layers`` must equal its depth); the optimizer starts afresh."""
    if init is None:
        dcfg, params = init_draft(tp, cfg, n_layers)
    else:
        icfg, iparams = init
        shape = lambda c: (c.vocab_size, c.d_model)  # noqa: E731
        if icfg.n_layers != n_layers or shape(icfg) != shape(cfg) or "vocab_ids" in iparams:
            raise ValueError(f"the draft model to fine-tune has {icfg.n_layers} layers over (vocab, width) "
                             f"{shape(icfg)}{' and a cut LM head' if 'vocab_ids' in iparams else ''}; expected "
                             f"{n_layers} layers over {shape(cfg)} with the full head: pass n_layers={icfg.n_layers} "
                             "and load it with full_vocab=True")
        dcfg = cfg.replace(n_layers=n_layers)  # this target's numerics
        params = {k: jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), iparams[k]) for k in ("layers", "final_norm")}
    shared = shared_of(tp, cfg)
    loss = functools.partial(losses.distill_loss, cfg=dcfg, target_cfg=cfg)
    frozen = {"target": tp, "shared": shared}
    if cache_teacher:
        t0 = time.perf_counter()
        frozen["t_hidden"] = jax.block_until_ready(teacher_cache.build(tp, cfg, ds))
        ds = teacher_cache.Indexed(ds)
        if tc.max_seconds is not None:
            tc = dataclasses.replace(tc, max_seconds=max(1.0, tc.max_seconds - (time.perf_counter() - t0)))
    res = train(loss, params, frozen, ds, tc, desc="draft", heldout=heldout)
    return dcfg, {**jax.tree.map(lambda x: x.astype(jnp.float32), shared), **res.params}, res
