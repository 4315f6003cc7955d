"""Prompt lookup (n-gram) drafting on device, over the prompt and the tokens generated so far.

For n from ``max_n`` down to ``min_n``: find an earlier occurrence of the last n tokens (the most
recent one by default, ``latest=False`` for the earliest like HF transformers' implementation) and
propose the K tokens that followed it. Where the continuation runs into the present, the matched
period repeats (the match at j means the text is periodic with period ``L + 1 - (j + n)``), which
is what repetitive text does. No match: propose ``last`` repeated. Drafts are deterministic, so
q is one-hot (``None``); any proposal is lossless, a bad one just gets rejected.
Cost per cycle: O(max_n^2 * S) integer compares per sequence, no model call.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.speculative.drafters.base import Context, Drafter, Proposal

MAX_NGRAM = 32


@dataclasses.dataclass(frozen=True)
class NGram(Drafter):
    name: ClassVar[str] = "ngram"
    min_n: int = 1
    max_n: int = 3
    latest: bool = True  # match the most recent occurrence (False: the earliest)

    def validate(self, cfg: ModelConfig, dp, num_draft: int) -> None:
        super().validate(cfg, dp, num_draft)
        if not 1 <= self.min_n <= self.max_n <= MAX_NGRAM:
            raise ValueError(f"n-gram sizes need 1 <= ngram_min <= ngram_max <= {MAX_NGRAM}, "
                             f"got ngram_min={self.min_n}, ngram_max={self.max_n}")
        if dp is not None:
            raise ValueError("the n-gram drafter has no parameters; pass draft_params=None")

    def propose(self, tp, dp, state, ctx: Context, target_cache, cfg):
        hist_BS = ctx.history_BS
        B, S = hist_BS.shape
        cur_B = ctx.lengths_B + 1  # valid tokens: positions 0..L (last included)
        j_S = jnp.arange(S, dtype=jnp.int32)
        start_B = jnp.full((B,), -1, jnp.int32)  # where the continuation starts; -1 = no match yet
        for n in range(self.max_n, self.min_n - 1, -1):
            suffix_Bn = jnp.take_along_axis(hist_BS, jnp.maximum(cur_B[:, None] - n + jnp.arange(n), 0), axis=1)
            match_BS = jnp.ones((B, S), bool)
            for t in range(n):  # window j..j+n-1 equals the suffix
                shifted_BS = jnp.pad(hist_BS[:, t:], ((0, 0), (0, t)), constant_values=-1)
                match_BS &= shifted_BS == suffix_Bn[:, t:t + 1]
            match_BS &= j_S[None, :] + n < cur_B[:, None]  # a continuation exists; excludes the suffix itself
            if self.latest:
                j_B = jnp.max(jnp.where(match_BS, j_S, -1), axis=1)
            else:
                j_B = jnp.where(match_BS.any(axis=1), jnp.argmax(match_BS, axis=1), -1)
            start_B = jnp.where((start_B < 0) & (j_B >= 0), j_B + n, start_B)
        period_B = jnp.maximum(cur_B - start_B, 1)
        idx_BK = start_B[:, None] + jnp.arange(ctx.num_draft)[None, :] % period_B[:, None]
        drafts_BK = jnp.take_along_axis(hist_BS, jnp.clip(idx_BK, 0, S - 1), axis=1)
        drafts_BK = jnp.where((start_B >= 0)[:, None], drafts_BK, ctx.last_B[:, None])
        return Proposal(drafts_BK.astype(jnp.int32), None), state, target_cache
