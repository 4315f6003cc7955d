"""Run a name-map plan: checkpoint tensors -> our params pytree, and back (for export)."""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.errors import CheckpointError
from specjax.loading.namemap import Step
from specjax.loading.transforms import COMBINES, ROLE_TRANSFORMS


def _empty_params(cfg: ModelConfig) -> dict:
    return {"layers": [{} for _ in range(cfg.n_layers)]}


def _set(params: dict, path: tuple, value) -> None:
    node = params
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _get(params: dict, path: tuple):
    node = params
    for key in path:
        node = node[key]
    return node


def build_params(steps: list[Step], fetch: Callable[[str], np.ndarray], cfg: ModelConfig, dtype) -> dict:
    """Build params from checkpoint tensors; ``fetch(name)`` returns one tensor as numpy ``[out, in]``.

    Each param is transformed in numpy and moved to JAX (cast to ``dtype``) before the next one is
    read, so peak host memory stays near one checkpoint tensor group.
    """
    params = _empty_params(cfg)
    for step in steps:
        ws = [ROLE_TRANSFORMS[s.transform].load(fetch(s.name), cfg) for s in step.sources]
        _set(params, step.target, jnp.asarray(COMBINES[step.combine].load(ws), dtype=dtype))
    return params


def _param_paths(params: dict) -> set[tuple]:
    paths = {(k,) for k in params if k != "layers"}
    for i, layer in enumerate(params.get("layers", [])):
        paths |= {("layers", i, k) for k in layer}
    return paths


def split_params(steps: list[Step], params: dict, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """The inverse of :func:`build_params`: checkpoint name -> numpy tensor (params' dtype)."""
    if len(params.get("layers", [])) != cfg.n_layers:
        raise CheckpointError(f"params have {len(params.get('layers', []))} layers, config says {cfg.n_layers}")
    planned = {step.target for step in steps}
    extra = _param_paths(params) - planned
    if extra:
        raise CheckpointError(f"params hold entries the config does not describe: {sorted(map(str, extra))} "
                              f"(tie_embeddings={cfg.tie_embeddings}, qkv_bias={cfg.qkv_bias})")
    out = {}
    for step in steps:
        try:
            p = np.asarray(_get(params, step.target))
        except (KeyError, IndexError):
            raise CheckpointError(f"params lack {'.'.join(map(str, step.target))}, which the config needs") from None
        want = COMBINES[step.combine].load([np.empty(s.shape, np.int8) for s in step.sources]).shape
        if p.shape != want:
            raise CheckpointError(f"param {'.'.join(map(str, step.target))} has shape {p.shape}, config expects {want}")
        ws = COMBINES[step.combine].save(p, [s.shape[0] for s in step.sources])
        for s, w in zip(step.sources, ws):
            out[s.name] = ROLE_TRANSFORMS[s.transform].save(w, cfg)
    return out
