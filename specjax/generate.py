"""Autoregressive decoding: prefill + decode in one jit, the decode steps in one ``lax.while_loop``.

The host sees the state once, after the loop. ``max_new_tokens`` is traced (no recompilation when
it changes within a capacity bucket); prompt lengths are bucketed to powers of two.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from specjax import cache as kv
from specjax import model
from specjax.config import ModelConfig
from specjax.sampling import SamplingParams, sample


def bucket(n: int, minimum: int = 16) -> int:
    """Smallest power of two >= max(n, minimum)."""
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


def validate_request(cfg: ModelConfig, prompts: list[list[int]], max_new_tokens: int) -> None:
    if not prompts:
        raise ValueError("no prompts given: expected a non-empty list of token-id lists")
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be > 0, got {max_new_tokens}")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
        if len(p) + max_new_tokens > cfg.max_seq_len:
            raise ValueError(f"prompt {i} has {len(p)} tokens; with max_new_tokens={max_new_tokens} that exceeds "
                             f"the model's context of {cfg.max_seq_len} tokens")
        if min(p) < 0 or max(p) >= cfg.vocab_size:
            raise ValueError(f"prompt {i} has token ids outside [0, {cfg.vocab_size})")


def bucket_shapes(prompts: list[list[int]], max_new_tokens: int, pad_to: int = 0, reserve: int = 0) -> tuple[int, int]:
    """(prompt width, cache capacity), both bucketed so that nearby requests share a compilation.

    The cache must hold the longest prompt, ``max_new_tokens`` and ``reserve`` more slots (a
    speculative verify writes K+1 slots past the last emitted token); with ``pad_to`` the capacity
    depends on the padded width only, so a sweep over prompts compiles once."""
    longest = max(len(p) for p in prompts)
    width = bucket(max(pad_to, longest))
    need = width + max_new_tokens + reserve if pad_to else max(width, longest + max_new_tokens + reserve)
    return width, bucket(need, 256)


def pad_prompts(prompts: list[list[int]], width: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad to [B, width] (pad id 0; padded slots are never attended)."""
    toks = np.zeros((len(prompts), width), np.int32)
    for i, p in enumerate(prompts):
        toks[i, :len(p)] = p
    return toks, np.array([len(p) for p in prompts], np.int32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
    step: jax.Array  # int32: decode steps taken
    last_B: jax.Array  # int32: token to feed next
    out_BM: jax.Array  # int32 [B, M]: generated tokens (M = capacity)
    n_gen_B: jax.Array  # int32: tokens generated so far per sequence
    done_B: jax.Array  # bool: EOS produced or budget reached
    cache: kv.KVCache
    key: jax.Array


def is_eos(tok: jax.Array, eos_ids: tuple[int, ...]) -> jax.Array:
    """Which tokens end their sequence (any shape; no EOS ids -> never)."""
    return jnp.isin(tok, jnp.asarray(eos_ids, jnp.int32)) if eos_ids else jnp.zeros(tok.shape, bool)


def default_unroll() -> int:
    """Decode steps per ``while_loop`` iteration: 4 on GPUs, 1 elsewhere.

    On an H200 (SmolLM2 shape, B=1, one process, two rounds; ``benchmarks/verify_cost_probe.py``,
    ``results/verify_cost_probe_H200_2026-11-27_unroll.txt``): 0.630 / 0.625 ms per token with 1 step per
    iteration, 0.616 / 0.617 with 2 and 0.609 / 0.616 with 4. On CPU, unrolling only lengthens compilation.
    Outputs do not depend on it (``tests/test_generate.py``)."""
    return 4 if jax.default_backend() == "gpu" else 1


@functools.partial(jax.jit, static_argnames=("cfg", "capacity", "eos_ids", "unroll"))
def _generate(params, tokens_BT, prompt_len_B, max_new, sp: SamplingParams, key, *,
              cfg: ModelConfig, capacity: int, eos_ids: tuple[int, ...], unroll: int = 1):
    """``unroll`` steps per ``while_loop`` iteration; steps past the end leave finished sequences as they are.

    Each iteration ends with the loop predicate on the host (a device-to-host copy, then the next body's
    launch), ~15-20 us per iteration on an H200, which ``unroll`` amortizes (``default_unroll``)."""
    B, T = tokens_BT.shape
    cache = kv.init_cache(cfg, B, capacity, params["embed"].dtype)
    logits_BNV, _, cache = model.forward(params, cfg, tokens_BT, cache, logits_index_BN=(prompt_len_B - 1)[:, None])
    cache = kv.set_lengths(cache, prompt_len_B)
    key, sub = jax.random.split(key)
    tok_B = sample(sub, logits_BNV[:, 0], sp)
    out_BM = jnp.zeros((B, capacity), jnp.int32).at[:, 0].set(tok_B)
    state = DecodeState(step=jnp.int32(1), last_B=tok_B, out_BM=out_BM, n_gen_B=jnp.ones((B,), jnp.int32),
                        done_B=is_eos(tok_B, eos_ids) | (max_new <= 1), cache=cache, key=key)

    def cond(s: DecodeState):
        return (s.step < max_new) & ~jnp.all(s.done_B)

    def body(s: DecodeState):
        logits_BTV, _, cache = model.forward(params, cfg, s.last_B[:, None], s.cache)
        key, sub = (s.key, s.key) if sp.is_greedy else jax.random.split(s.key)  # greedy draws nothing
        tok_B = sample(sub, logits_BTV[:, -1], sp)
        live = ~s.done_B
        out_BM = s.out_BM.at[jnp.arange(B), s.n_gen_B].set(jnp.where(live, tok_B, 0))
        n_gen_B = s.n_gen_B + live.astype(jnp.int32)
        done_B = s.done_B | (live & is_eos(tok_B, eos_ids)) | (n_gen_B >= max_new)
        cache = kv.set_lengths(cache, jnp.where(live, cache.lengths_B, s.cache.lengths_B))
        return DecodeState(step=s.step + 1, last_B=tok_B, out_BM=out_BM, n_gen_B=n_gen_B, done_B=done_B,
                           cache=cache, key=key)

    def body_unrolled(s: DecodeState):
        for _ in range(unroll):
            s = body(s)
        return s

    final = jax.lax.while_loop(cond, body_unrolled, state)
    return final.out_BM, final.n_gen_B


@dataclasses.dataclass(frozen=True)
class GenerateResult:
    prompt_ids: list[list[int]]
    output_ids: list[list[int]]  # generated tokens only, EOS included if produced
    seconds: float  # wall time of prefill + decode, compilation excluded
    compile_seconds: float = 0.0  # lowering + compilation (near 0 when cached)

    @property
    def new_tokens(self) -> list[int]:
        return [len(o) for o in self.output_ids]

    @property
    def tokens_per_s(self) -> float:
        return sum(self.new_tokens) / max(self.seconds, 1e-9)


def generate(params, cfg: ModelConfig, prompts: list[list[int]], *, max_new_tokens: int = 64,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
             eos_token_ids: tuple[int, ...] | None = None, pad_to: int = 0,
             unroll: int | None = None) -> GenerateResult:
    """Generate for a batch of token-id prompts of different lengths. temperature 0 = greedy.

    ``pad_to`` fixes the prompt width (rounded up to a power of two) so that a sweep over prompts of
    different lengths compiles once. ``unroll``: decode steps per loop iteration (default
    ``default_unroll()``; the outputs are the same for any value)."""
    validate_request(cfg, prompts, max_new_tokens)
    unroll = default_unroll() if unroll is None else unroll
    if isinstance(unroll, bool) or not isinstance(unroll, int) or unroll < 1:
        raise ValueError(f"unroll (decode steps per loop iteration) must be an integer >= 1, got {unroll!r}")
    sp = SamplingParams.make(temperature, top_k, top_p)
    eos = tuple(cfg.eos_token_ids if eos_token_ids is None else eos_token_ids)
    width, capacity = bucket_shapes(prompts, max_new_tokens, pad_to)
    toks, lens = pad_prompts(prompts, width)
    args = (params, jnp.asarray(toks), jnp.asarray(lens), jnp.int32(max_new_tokens), sp, jax.random.key(seed))
    t0 = time.perf_counter()
    compiled = _generate.lower(*args, cfg=cfg, capacity=capacity, eos_ids=eos, unroll=unroll).compile()  # cached
    t1 = time.perf_counter()
    out_BM, n_B = jax.device_get(compiled(*args))
    seconds = time.perf_counter() - t1
    outputs = [out_BM[i, :n_B[i]].tolist() for i in range(len(prompts))]
    return GenerateResult(prompt_ids=[list(p) for p in prompts], output_ids=outputs, seconds=seconds,
                          compile_seconds=t1 - t0)
