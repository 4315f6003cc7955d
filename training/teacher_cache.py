"""The target's final-normed hidden states at a corpus's trained-on positions, computed once.

Distilling a draft model runs the frozen 30-layer target inside every step only to get its logits
at the weighted positions. Those logits are ``lm_head(h)`` of the target's final-normed hidden state
``h``, which does not change during training: ``build`` runs the target over the corpus once and
keeps ``h`` at every weighted position (``[P, D]`` on the device, P = the corpus's weighted
positions; SmolLM2's ``large`` corpus: ~23M x 576 bf16 = 27 GB), rounded to the dtype the LM head
reads it in (``layers.operand_dtype``), so the teacher's logits computed from it are the in-step
ones up to how XLA fuses the norm. ``Indexed`` wraps the dataset so each batch carries ``t_index``
(int32 [B, T]: the row of ``h`` for each weighted position, 0 elsewhere), which
``losses.distill_loss`` gathers from instead of running the target. The teacher's LM head, the
draft model and its LM head still run in the step.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax import model
from specjax.config import ModelConfig
from specjax.layers import operand_dtype
from training.data import TokenDataset


def flat_positions(weight_NT: np.ndarray) -> np.ndarray:
    """int32 [N, T]: the index of each weighted position among all weighted positions in row-major
    order (the row of ``build``'s array that holds it); 0 where the weight is 0."""
    w = np.asarray(weight_NT) > 0
    idx = np.cumsum(w.ravel(), dtype=np.int64).reshape(w.shape) - 1
    if idx.size and idx[-1, -1] >= np.iinfo(np.int32).max:
        raise ValueError(f"{int(idx[-1, -1]) + 1} weighted positions do not fit int32 indices")
    return np.where(w, idx, 0).astype(np.int32)


@functools.partial(jax.jit, static_argnums=(1,), donate_argnums=(3,))
def _fill(tp, cfg: ModelConfig, tokens_BT, h_PD, index_BT, keep_BT):
    """Scatter the target's final-normed hidden states of these rows into ``h_PD`` at ``index_BT``."""
    _, (h_BTD,), _ = model.forward(tp, cfg, tokens_BT, taps=(cfg.n_layers,), compute_logits=False)
    rows = jnp.where(keep_BT, index_BT, h_PD.shape[0]).reshape(-1)  # out of range: dropped
    return h_PD.at[rows].set(h_BTD.reshape(-1, h_BTD.shape[-1]).astype(h_PD.dtype), mode="drop")


def build(tp: dict, cfg: ModelConfig, ds: TokenDataset, batch_rows: int = 256) -> jax.Array:
    """[P, D] hidden states of the frozen target at ``ds``'s weighted positions (see the module doc)."""
    if batch_rows <= 0:
        raise ValueError(f"batch_rows must be positive, got {batch_rows}")
    keep_NT = np.asarray(ds.weight_NT) > 0
    n_pos = int(keep_NT.sum())
    if n_pos == 0:
        raise ValueError("the dataset has no weighted positions to cache")
    index_NT = flat_positions(ds.weight_NT)
    w_head = tp["embed"] if cfg.tie_embeddings else tp["lm_head"]
    h_PD = jnp.zeros((n_pos, cfg.d_model), operand_dtype(w_head, cfg.compute_dtype))
    n = len(ds)
    for a in range(0, n, batch_rows):
        sl = slice(a, min(a + batch_rows, n))
        tokens, index, keep = ds.tokens_NT[sl], index_NT[sl], keep_NT[sl]
        if len(tokens) < batch_rows and n > batch_rows:  # one compiled shape: pad the last batch (dropped rows)
            pad = batch_rows - len(tokens)
            tokens, index, keep = (np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)])
                                   for x in (tokens, index, keep))
        h_PD = _fill(tp, cfg, jnp.asarray(tokens, jnp.int32), h_PD, jnp.asarray(index), jnp.asarray(keep))
    return h_PD


class Indexed:
    """A ``TokenDataset`` whose batches also carry ``t_index`` (rows of ``build(..., ds)``'s array)."""

    def __init__(self, ds: TokenDataset):
        self.ds = ds
        self.index_NT = flat_positions(ds.weight_NT)

    def __len__(self) -> int:
        return len(self.ds)

    @property
    def seq_len(self) -> int:
        return self.ds.seq_len

    def indices(self, step: int, batch_size: int, seed: int) -> np.ndarray:
        return self.ds.indices(step, batch_size, seed)

    def batch(self, step: int, batch_size: int, seed: int) -> dict[str, np.ndarray]:
        return self.take(self.indices(step, batch_size, seed))

    def take(self, idx) -> dict[str, np.ndarray]:
        return {**self.ds.take(idx), "t_index": self.index_NT[idx]}


def teacher_logits(tp: dict, cfg: ModelConfig, h_PD: jax.Array, t_index_BT: jax.Array) -> jax.Array:
    """float32 [B, T, V]: the target's logits from its cached hidden states (garbage where unweighted)."""
    return jax.lax.stop_gradient(model.lm_head(tp, cfg, jnp.take(h_PD, t_index_BT, axis=0)))
