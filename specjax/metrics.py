"""Decoding metrics with vLLM's definitions (per sequence and aggregated).

Speculative (counted by the verifier, before EOS/budget cuts, as vLLM does):
  mean_accepted (tau)        1 + accepted drafts / cycles  (tokens per target forward, bonus included)
  acceptance_per_position[i] cycles in which draft i was accepted / cycles  (unconditional)
  draft_acceptance_rate      accepted drafts / drafts proposed (cycles * K, unless the drafter stops early)
  mean_drafted               drafts proposed / cycles (K, unless the drafter stops early: ``min_confidence``)
  num_cycles                 verify cycles (target forwards after the prefill)
Latency: ``ttft_s`` is the prefill (first token) time. The decode loop runs on device without host
syncs, so a sequence's decode time is apportioned by its share of the loop's cycles:
``decode_s[b] = decode_s * cycles[b] / max(cycles)``; ``itl_s[b] = decode_s[b] / (new_tokens[b] - 1)``.
``tokens_per_s`` = all new tokens / wall time of the call (prefill included). Where the prefill was not
timed apart (``ttft_s`` None: prefill and loop in one program), ``ttft_s`` and ``itl_s`` are None.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class SpecStats:
    """Per-sequence counters copied off the device after the loop."""
    num_draft: int  # K
    cycles_B: np.ndarray  # int: cycles each sequence was live in
    accepted_BK: np.ndarray  # int: cycles in which draft position i was accepted
    new_tokens_B: np.ndarray  # int: tokens generated (the prefill's first token included)
    drafted_B: np.ndarray | None = None  # int: drafts proposed (None: K per cycle)


def _ratio(a, b):
    return np.asarray(a, np.float64) / np.maximum(np.asarray(b, np.float64), 1)


def acceptance_rows(cycles_B, accepted_BK, num_draft: int, drafted_B=None) -> list[dict]:
    """Acceptance metrics of each row (``cycles_B`` [B], ``accepted_BK`` [B, K], ``drafted_B`` [B] or None for K
    per cycle), computed over the batch at once (``summarize`` of 49k rows, the sampling tests' batches:
    0.12-0.14 s; one row at a time 0.47-0.49 s, benchmarks/results/ci_time_cpu_2026-12-02b.txt)."""
    cycles_B = np.asarray(cycles_B, np.int64)
    total_B = np.asarray(accepted_BK, np.int64).sum(axis=1)
    drafted_B = cycles_B * num_draft if drafted_B is None else np.asarray(drafted_B, np.int64)
    tau_B = np.where(cycles_B > 0, 1.0 + _ratio(total_B, cycles_B), 0.0)
    per_pos_BK = _ratio(accepted_BK, cycles_B[:, None])
    rate_B = _ratio(total_B, drafted_B)
    return [{"num_cycles": c, "mean_accepted": t, "acceptance_per_position": a, "draft_acceptance_rate": r,
             "num_accepted": n, "num_drafted": d, "mean_drafted": m}
            for c, t, a, r, n, d, m in zip(cycles_B.tolist(), tau_B.tolist(), per_pos_BK.tolist(), rate_B.tolist(),
                                           total_B.tolist(), drafted_B.tolist(), _ratio(drafted_B, cycles_B).tolist())]


def acceptance(cycles, accepted_K, num_draft: int, drafted=None) -> dict:
    """Acceptance metrics for one sequence or a total (``cycles`` scalar, ``accepted_K`` [K], ``drafted`` scalar
    or None for K per cycle)."""
    return acceptance_rows([cycles], [accepted_K], num_draft, None if drafted is None else [drafted])[0]


def latency(ttft_s: float | None, seconds: float, new_tokens_B, steps_B=None) -> dict:
    """TTFT, ITL and tokens/s; ``steps_B`` (loop iterations each sequence was live in) apportions
    the decode time per sequence (None: all sequences were live for the whole loop). ``ttft_s`` None:
    the prefill was not timed apart, so TTFT and ITL are None and a sequence's share covers the whole call."""
    new_tokens_B = np.asarray(new_tokens_B)
    timed = ttft_s is not None
    decode_s = max(seconds - ttft_s, 0.0) if timed else seconds
    share_B = np.ones(len(new_tokens_B)) if steps_B is None else _ratio(steps_B, np.max(steps_B, initial=1))
    decode_B = decode_s * share_B
    itl_B = _ratio(decode_B, new_tokens_B - 1)
    itl = (float(np.mean(itl_B[new_tokens_B > 1])) if np.any(new_tokens_B > 1) else 0.0) if timed else None
    return {
        "ttft_s": float(ttft_s) if timed else None,
        "itl_s": itl,
        "tokens_per_s": float(new_tokens_B.sum() / max(seconds, 1e-9)),
        "seconds": float(seconds),
        "per_sequence": [{"new_tokens": n, "itl_s": i if timed else None, "tokens_per_s": r}
                         for n, i, r in zip(new_tokens_B.tolist(), itl_B.tolist(),
                                            (new_tokens_B / np.maximum((ttft_s or 0.0) + decode_B, 1e-9)).tolist())],
    }


def summarize(stats: SpecStats, ttft_s: float | None, seconds: float) -> dict:
    """JSON-ready aggregate + per-sequence metrics of one speculative run."""
    drafted = None if stats.drafted_B is None else int(np.sum(stats.drafted_B))
    out = acceptance(int(stats.cycles_B.sum()), stats.accepted_BK.sum(axis=0), stats.num_draft, drafted)
    out["num_draft"] = stats.num_draft
    out["new_tokens"] = int(stats.new_tokens_B.sum())
    lat = latency(ttft_s, seconds, stats.new_tokens_B, stats.cycles_B)
    per_seq = lat.pop("per_sequence")
    out.update(lat)
    out["per_sequence"] = [{**a, **ps} for a, ps in
                           zip(acceptance_rows(stats.cycles_B, stats.accepted_BK, stats.num_draft, stats.drafted_B),
                               per_seq)]
    return out
