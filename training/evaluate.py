"""tau (mean accepted length: tokens per target forward, bonus included, vLLM's definition) on
held-out prompt sets, measured through the real speculative loop (``speculative_generate``).

All sets go through one batched call per drafter (one compilation), and the per-sequence counters
are split back per set. At temperature 0 the outputs are also compared with ``generate``'s.
"""

from __future__ import annotations

import numpy as np

from specjax import prompts as eval_sets
from specjax.config import ModelConfig
from specjax.generate import generate
from specjax.metrics import acceptance
from specjax.speculative import speculative_generate
from specjax.tokenizer import Tokenizer

CODE_ASK = "Complete the following Python function:\n\n```python\n{prompt}```"


def heldout_prompts(tok: Tokenizer, n_mtbench: int, n_humaneval: int, max_tokens: int) -> dict[str, list[list[int]]]:
    """Chat-template ids of the first MT-bench turns and HumanEval prompts (needs `specjax fetch`)."""
    def chat(text):
        return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    sets = {"mtbench": [chat(q["prompt"]) for q in eval_sets.mtbench()],
            "humaneval": [chat(CODE_ASK.format(prompt=t["prompt"])) for t in eval_sets.humaneval()]}
    sets = {k: [p for p in v if len(p) <= max_tokens] for k, v in sets.items()}
    return {"mtbench": sets["mtbench"][:n_mtbench], "humaneval": sets["humaneval"][:n_humaneval]}


class ReferenceOutputs:
    """Autoregressive greedy outputs, computed once per prompt list and reused for every drafter."""

    def __init__(self):
        self._cache = {}

    def __call__(self, tp, cfg, prompts, max_new_tokens, eos_token_ids):
        key = (tuple(map(tuple, prompts)), max_new_tokens, eos_token_ids)
        if key not in self._cache:
            self._cache[key] = generate(tp, cfg, prompts, max_new_tokens=max_new_tokens,
                                        eos_token_ids=eos_token_ids).output_ids
        return self._cache[key]


def tau(tp: dict, cfg: ModelConfig, drafter, dp, sets: dict[str, list[list[int]]], *, num_draft: int,
        max_new_tokens: int, temperature: float = 0.0, seed: int = 0, reference: ReferenceOutputs | None = None,
        eos_token_ids: tuple[int, ...] | None = None) -> dict:
    """``{set: acceptance metrics, "all": ...}``; at temperature 0 with a ``reference`` also
    ``greedy_equals_ar`` and how many sequences are identical to AR greedy. (In fp32 all are; in bf16
    the verify forward over K+1 tokens and AR's 1-token steps round differently, so a near-tie in
    the target's own logits can flip an argmax — a property of bf16, not of the drafter.)"""
    names = [n for n, ps in sets.items() if ps]
    prompts = [p for n in names for p in sets[n]]
    res = speculative_generate(tp, cfg, prompts, drafter, dp, num_draft=num_draft, max_new_tokens=max_new_tokens,
                               temperature=temperature, seed=seed, eos_token_ids=eos_token_ids)
    cyc, acc = res.stats.cycles_B, res.stats.accepted_BK
    out, start = {}, 0
    for n in names:
        rows = slice(start, start + len(sets[n]))
        out[n] = acceptance(int(cyc[rows].sum()), acc[rows].sum(axis=0), num_draft)
        out[n]["num_prompts"] = len(sets[n])
        start += len(sets[n])
    out["all"] = acceptance(int(cyc.sum()), acc.sum(axis=0), num_draft)
    out["all"].update(new_tokens=int(np.sum(res.new_tokens)), seconds=res.seconds,
                      compile_seconds=res.compile_seconds, temperature=temperature)
    if reference is not None and temperature == 0:
        ref = reference(tp, cfg, prompts, max_new_tokens, eos_token_ids)
        same = sum(a == b for a, b in zip(ref, res.output_ids))
        out["greedy_equals_ar"] = same == len(prompts)
        out["greedy_identical_sequences"] = f"{same}/{len(prompts)}"  # < all only through bf16 near-ties
    return out
