"""Host entry points: ``speculative_generate`` (token ids in, token ids + metrics out) and ``run``
(the CLI's options: method name, K, draft model path, ...).

Mirrors ``specjax.generate``: prompts right-padded to a power-of-two width, ``max_new_tokens``
traced, cache capacity bucketed (it must hold prompt + max_new + K + 1 slots), EOS per sequence.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax import metrics
from specjax.config import ModelConfig
from specjax.generate import GenerateResult, bucket_shapes, pad_prompts, validate_request
from specjax.sampling import SamplingParams
from specjax.speculative import drafters, loop

MAX_NUM_DRAFT = 32


@dataclasses.dataclass(frozen=True)
class SpecResult(GenerateResult):
    """``GenerateResult`` plus the speculative statistics."""
    ttft_s: float | None = None  # prefill + first token (measured with ``ttft=True`` only)
    method: str = ""
    stats: metrics.SpecStats | None = None

    def metrics(self) -> dict:
        """JSON-ready: mean_accepted, acceptance_per_position, num_cycles, draft_acceptance_rate,
        ttft_s, itl_s, tokens_per_s, and the same per sequence (see ``specjax.metrics``)."""
        return {"method": self.method, **metrics.summarize(self.stats, self.ttft_s, self.seconds)}


def check_num_draft(num_draft, drafter: drafters.Drafter | None = None) -> int:
    limit = min(MAX_NUM_DRAFT, (drafter and drafter.max_draft) or MAX_NUM_DRAFT)
    if isinstance(num_draft, bool) or not isinstance(num_draft, (int, np.integer)) or not 1 <= num_draft <= limit:
        who = f" for {drafter.name}" if drafter else ""
        raise ValueError(f"num_draft (K, draft tokens per cycle) must be an integer in [1, {limit}]{who}, "
                         f"got {num_draft!r}")
    return int(num_draft)


def speculative_generate(params: dict, cfg: ModelConfig, prompts: list[list[int]], drafter: drafters.Drafter,
                         draft_params: Any = None, *, num_draft: int | None = None, max_new_tokens: int = 64,
                         temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                         eos_token_ids: tuple[int, ...] | None = None, pad_to: int = 0,
                         capacity: int | None = None, ttft: bool = False) -> SpecResult:
    """Speculative decoding of a batch of token-id prompts; the output distribution is the target's.

    At temperature 0 the outputs equal ``specjax.generate.generate``'s greedy outputs. ``num_draft`` (K)
    defaults to 4 for a chain; a drafter with a ``tree`` drafts its N nodes (K = N). ``pad_to``
    fixes the prompt width (as in ``generate``: a sweep over prompts compiles once). ``capacity``
    (cache slots per sequence) defaults to a power-of-two bucket >= prompt + max_new + K + 1.
    One program runs the prefill and the loop (``loop.generate``); ``ttft=True`` runs them as two, with a host
    sync between, to measure the time to first token (``SpecResult.ttft_s``; ~4 ms more per request on an
    H200, benchmarks/NOTES.md item 32).
    """
    if not isinstance(ttft, bool):
        raise ValueError(f"ttft must be True or False (time the first token: two programs), got {ttft!r}")
    if not isinstance(drafter, drafters.Drafter):
        raise ValueError(f"drafter must be a specjax.speculative.drafters.Drafter, got {type(drafter).__name__}")
    if drafter.tree is not None:
        K = drafter.tree.num_nodes if num_draft is None else num_draft  # validate() checks it equals N
    else:
        K = check_num_draft(4 if num_draft is None else num_draft, drafter)
    validate_request(cfg, prompts, max_new_tokens)
    drafter.validate(cfg, draft_params, K)
    sp = SamplingParams.make(temperature, top_k, top_p)
    eos = tuple(cfg.eos_token_ids if eos_token_ids is None else eos_token_ids)
    longest = max(len(p) for p in prompts)
    need = longest + max_new_tokens + K + 1  # verify writes K+1 slots past the last emitted token
    width, default_capacity = bucket_shapes(prompts, max_new_tokens, pad_to, reserve=K + 1)
    capacity = default_capacity if capacity is None else capacity
    if capacity < max(width, need):  # dynamic_update_slice would clamp silently: refuse instead
        raise ValueError(f"cache capacity {capacity} is too small: need at least {max(width, need)} slots (padded "
                         f"prompt width {width}; longest prompt {longest} + max_new_tokens {max_new_tokens} + K+1)")
    toks, lens = pad_prompts(prompts, width)
    static = dict(cfg=cfg, drafter=drafter, eos_ids=eos)
    pre_args = (params, draft_params, jnp.asarray(toks), jnp.asarray(lens), jnp.int32(max_new_tokens), sp,
                jax.random.key(seed))
    t0 = time.perf_counter()  # compile ahead (cached per bucket), so the timings below are run time only
    if ttft:
        prefill, decode = loop.compile_prefill_decode(pre_args, sp, capacity=capacity, num_draft=K, **static)
    else:
        run_all = loop.generate.lower(*pre_args, capacity=capacity, num_draft=K, **static).compile()
    t1 = time.perf_counter()
    ttft_s = None
    if ttft:
        state = prefill(*pre_args)
        jax.block_until_ready(state.last_B)
        ttft_s = time.perf_counter() - t1
        out = loop.outcome(decode(params, draft_params, state, sp))
    else:
        out = run_all(*pre_args)
    out = jax.device_get(out)  # one host read
    seconds = time.perf_counter() - t1
    stats = metrics.SpecStats(K, out.cycles_B, out.accepted_BK, out.n_out_B, out.drafted_B)
    return SpecResult(prompt_ids=[list(p) for p in prompts], output_ids=loop.outputs(out, lens), seconds=seconds,
                      ttft_s=ttft_s, method=drafter.name, stats=stats, compile_seconds=t1 - t0)


def run(params: dict, cfg: ModelConfig, prompts: list[list[int]], *, method: str, num_draft: int | None = None,
        draft_model=None, layerskip_layers: int | None = None, ngram_min: int = 1, ngram_max: int = 3, tree=None,
        min_confidence: float = 0.0, **generate_kw) -> SpecResult:
    """The CLI's entry: ``--method draft|layerskip|ngram|eagle3|medusa --num-draft K [--draft-model PATH]
    [--layerskip-layers N] [--ngram-min A --ngram-max B] [--tree N|FILE] [--min-confidence C]``; other keywords go
    to speculative_generate. Draft models and heads are loaded in the target's dtype (see ``drafters.build``)."""
    if method not in drafters.METHODS:
        raise ValueError(f"unknown speculative method {method!r}; expected one of {', '.join(drafters.METHODS)}")
    if tree is None and num_draft is not None:
        check_num_draft(num_draft)  # before loading a draft model
    drafter, dp = drafters.build(method, cfg, target_params=params, draft_model=draft_model,
                                 layerskip_layers=layerskip_layers, ngram_min=ngram_min, ngram_max=ngram_max,
                                 tree=tree, min_confidence=min_confidence)
    return speculative_generate(params, cfg, prompts, drafter, dp, num_draft=num_draft, **generate_kw)
