"""Hugging Face transformers generation on the GPU with the same GGUF, prompts and token budget.

Only the benchmarks import this (torch + transformers live on the GPU machine, not in specjax).
"""

from __future__ import annotations

import os
import time


def load(gguf_path: str):
    import torch
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path),
                                                dtype=torch.bfloat16).cuda().eval()


def generate(model, prompts: list[list[int]], max_new: int, *, eos_token_id: int | None = None,
             prompt_lookup_num_tokens: int | None = None) -> dict:
    """Greedy generation one prompt at a time (B=1); ``eos_token_id=None`` forces ``max_new`` tokens.
    ``prompt_lookup_num_tokens`` switches on HF's prompt-lookup decoding."""
    import torch
    kw = dict(max_new_tokens=max_new, do_sample=False, eos_token_id=eos_token_id, pad_token_id=0)
    if eos_token_id is None:
        kw["min_new_tokens"] = max_new
    if prompt_lookup_num_tokens:
        kw["prompt_lookup_num_tokens"] = prompt_lookup_num_tokens
    outputs, total, secs = [], 0, 0.0
    with torch.inference_mode():
        warm = torch.tensor([prompts[0]], device="cuda")
        model.generate(warm, attention_mask=torch.ones_like(warm), **{**kw, "max_new_tokens": 8, "min_new_tokens": 0})
        for p in prompts:
            ids = torch.tensor([p], device="cuda")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
            torch.cuda.synchronize()
            secs += time.perf_counter() - t0
            outputs.append(out[0, ids.shape[1]:].tolist())
            total += len(outputs[-1])
    return {"hf_prompts": len(prompts), "hf_tokens": total, "hf_seconds": secs, "hf_tokens_per_s": total / secs,
            "outputs": outputs}
