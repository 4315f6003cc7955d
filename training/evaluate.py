"""tau (mean accepted length: tokens per target forward, bonus included) on held-out prompts, measured
through the real speculative loop (``specjax.speculative.speculative_generate``), plus a check that
greedy speculative outputs equal autoregressive ones on the same prompts."""

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


def tau(tp: dict, cfg: ModelConfig, drafter, dp, prompts: list[list[int]], *, num_draft: int, max_new_tokens: int,
        batch_size: int = 16, temperature: float = 0.0, seed: int = 0, check_greedy: bool = True,
        eos_token_ids: tuple[int, ...] | None = None) -> dict:
    """Acceptance over all prompts (batched); with ``check_greedy`` at temperature 0 also whether the
    outputs equal ``generate``'s."""
    cycles, accepted_K, new_tokens, seconds, same = 0, np.zeros(num_draft, np.int64), 0, 0.0, True
    for a in range(0, len(prompts), batch_size):
        chunk = prompts[a:a + batch_size]
        res = speculative_generate(tp, cfg, chunk, drafter, dp, num_draft=num_draft, max_new_tokens=max_new_tokens,
                                   temperature=temperature, seed=seed + a, eos_token_ids=eos_token_ids)
        cycles += int(res.stats.cycles_B.sum())
        accepted_K += res.stats.accepted_BK.sum(axis=0)
        new_tokens += sum(res.new_tokens)
        seconds += res.seconds
        if check_greedy and temperature == 0:
            ref = generate(tp, cfg, chunk, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids)
            same &= ref.output_ids == res.output_ids
    out = acceptance(cycles, accepted_K, num_draft)
    out.update(num_prompts=len(prompts), new_tokens=new_tokens, seconds=seconds, temperature=temperature)
    if check_greedy and temperature == 0:
        out["greedy_equals_ar"] = bool(same)
    return out
