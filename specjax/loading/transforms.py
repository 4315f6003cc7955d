"""Named, invertible tensor transforms that the name map (``namemap.py``) refers to.

Two kinds, both pure numpy:
  * role transforms act on one checkpoint tensor (numpy layout ``[out, in]``) before combining;
    today only llama.cpp's Q/K row permutation, which GGUF files of Llama models carry.
  * combines build one of our params from its checkpoint tensors (weights stay ``[out, in]``;
    fuse q|k|v or gate|up) and split it back for export.
Every transform has an inverse so the same table drives loading and exporting.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from specjax.config import ModelConfig


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``permute`` (convert_hf_to_gguf.py): rotate-half row order -> adjacent pairs.

    Within each head the rows ``[x_0..x_{d/2-1}, y_0..y_{d/2-1}]`` become ``[x_0, y_0, x_1, y_1, ...]``.
    """
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"cannot permute {rows} rows into {n_head} heads of even size")
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of :func:`permute_rows`: adjacent-pair row order -> HF rotate-half order."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"cannot un-permute {rows} rows from {n_head} heads of even size")
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@dataclasses.dataclass(frozen=True)
class RoleTransform:
    """Applied to one checkpoint tensor on load (``load``) and undone on export (``save``)."""

    load: Callable[[np.ndarray, ModelConfig], np.ndarray]
    save: Callable[[np.ndarray, ModelConfig], np.ndarray]


ROLE_TRANSFORMS: dict[str, RoleTransform] = {
    "none": RoleTransform(lambda w, c: w, lambda w, c: w),
    "unpermute_q": RoleTransform(lambda w, c: unpermute_rows(w, c.n_heads),
                                 lambda w, c: permute_rows(w, c.n_heads)),
    "unpermute_k": RoleTransform(lambda w, c: unpermute_rows(w, c.n_kv_heads),
                                 lambda w, c: permute_rows(w, c.n_kv_heads)),
}


@dataclasses.dataclass(frozen=True)
class Combine:
    """Builds one param from its checkpoint tensors and splits it back (given their row counts)."""

    load: Callable[[Sequence[np.ndarray]], np.ndarray]
    save: Callable[[np.ndarray, Sequence[int]], list[np.ndarray]]


def _split_rows(w: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
    return np.split(w, np.cumsum(sizes)[:-1], axis=0)


def _one(ws: Sequence[np.ndarray]) -> np.ndarray:
    (w,) = ws
    return w


COMBINES: dict[str, Combine] = {
    # norms, embeddings: stored as-is
    "copy": Combine(_one, lambda p, sizes: [p]),
    # several linear layers sharing an input (weights [out, in]) or their biases: stack the outputs
    "concat": Combine(lambda ws: np.concatenate(ws, axis=0),
                      lambda p, sizes: [np.ascontiguousarray(w) for w in _split_rows(p, sizes)]),
}
