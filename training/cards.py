"""Short model cards for the shipped artifacts, and a transport bundle (tar split into parts)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

_WHAT = {
    "eagle3": ("EAGLE-3 head", "one decoder layer over the target's fused hidden states (taps = inputs of layers "
               "2, L//2, L-3), reduced draft vocabulary (d2t/t2d), trained with the training-time test ({ttt} steps, "
               "weights 0.8^i). vLLM/SGLang layout (LlamaForCausalLMEagle3); the target's embedding is shared."),
    "medusa": ("Medusa-1 heads", "residual-block heads on the frozen target's last hidden state, head k predicting "
               "k+1 tokens beyond the next (loss weights 0.8^k); the target's LM head is shared "
               "(config `specjax_shared_lm_head`; export with lm_head='materialize' for the Medusa repository)."),
    "medusa-own": ("Medusa-1 heads with their own LM heads", "as the shipped Medusa heads, but each head has its own "
                   "LM head (initialised from the target's): the Medusa repository's layout; measured, not shipped."),
    "draft": ("distilled draft model", "a small Llama at the target's width started as the target's first "
              "layers (an early exit), distilled with soft cross-entropy; embedding/LM head shared with the target "
              "(`specjax_shared_embeddings`: load with specjax.heads.draft_io.load_draft_model)."),
}


_CLASS = {"eagle3": ("eagle3", "Eagle3"), "medusa": ("medusa", "Medusa"), "draft": ("draft_model", "DraftModel")}


def _tau_lines(tau: dict) -> list[str]:
    lines = []
    for name, m in tau.items():
        if isinstance(m, dict) and "mean_accepted" in m:
            per = ", ".join(f"{a:.2f}" for a in m["acceptance_per_position"])
            lines.append(f"| {name} | {m.get('num_prompts', '')} | {m['mean_accepted']:.3f} | {per} |")
    return lines


def _use(kind: str, num_draft: int) -> list[str]:
    module, cls = _CLASS[kind]
    return ["## Use", "```python", "import specjax", "from specjax.heads import shipped",
            "from specjax.speculative import speculative_generate",
            f"from specjax.speculative.drafters.{module} import {cls}",
            'lm = specjax.load("smollm2-135m-instruct")',
            f'cfg, dp = shipped.load("smollm2-135m-instruct", "{kind}", lm.cfg, lm.params)',
            f"out = speculative_generate(lm.params, lm.cfg, [lm.encode('Hi!', chat=True)], {cls}(cfg), dp, "
            f"num_draft={num_draft})", "```", ""]


def _heldout_line(h: dict | None) -> str:
    if not h:
        return ""
    return (f" On {h['rows']} held-out corpus rows (their prompts never trained on): loss {h['loss']:.3f}, "
            "acceptance proxy "
            + ", ".join(f"{a:.2f}" for a in h["acc_k"]) + ".")


def _throughput(rec: dict) -> str:
    if not rec.get("train_seconds"):
        return ""
    steps_run = rec["steps"] - rec.get("resumed_from_step", 0)  # the steps that train_seconds covers
    rate = steps_run * rec["batch_size"] * rec["seq_len"] / rec["train_seconds"]
    return (f" ({rate / 1e3:.0f}k token positions/s: steps x batch x sequence length over that wall time, which "
            "includes compilation and the held-out scoring)")


def _resumed(rec: dict) -> str:
    s = rec.get("resumed_from_step")
    return (f" for steps {s + 1}-{rec['steps']} (resumed from the checkpoint at step {s}; the invocation that wrote it "
            "left no record, so its time is not counted)" if s else "")


def _openers(corpus_meta: dict) -> str:
    return (", each begun with a random request opener (training/corpus.py OPENERS)"
            if corpus_meta.get("spec", {}).get("magpie_openers") else "")


def _code_source(corpus_meta: dict) -> str:
    packages = corpus_meta.get("spec", {}).get("code_packages") or []
    pool = f"; a pool of {corpus_meta['code_pool']} functions" if "code_pool" in corpus_meta else ""
    return "functions of the Python standard library" + (f" and of {', '.join(packages)}" if packages else "") + pool


def _init_sha(rec: dict) -> str:
    return f"model.safetensors sha256 {rec['init_sha256']}; " if rec.get("init_sha256") else ""


def card(kind: str, rec: dict, results: dict) -> str:
    title, what = _WHAT[kind]
    what = what.format(ttt=results["preset"].get("ttt_steps"))
    c, final = results["corpus"], rec.get("final") or {}
    ov = c.get("eval_overlap", {})
    acc = ", ".join(f"{a:.2f}" for a in final.get("acc_k", []))
    lines = [
        f"# {title} for {results['target']}", "", what, "",
        "## Data",
        f"Self-distilled, no dataset download: {c.get('num_chat_prompts')} Magpie-style chat prompts sampled by the "
        f"target from its user-turn prefix{_openers(c)} + {c.get('num_templated_prompts', 0)} templated instructions "
        f"(training/instructions.py) + {c.get('num_code_prompts')} code prompts (signature + docstring of "
        f"{_code_source(c)}, as a chat request) + {c.get('num_raw_code_prompts', 0)} such stubs "
        f"continued as plain text, answered by the target at temperatures "
        f"{c.get('spec', {}).get('temperatures')}: {c.get('num_examples')} examples, {c.get('response_tokens')} "
        f"response tokens. MT-bench/HumanEval overlap check ({ov.get('method')}, {ov.get('num_eval_texts')} eval "
        f"texts, checked={ov.get('checked')}): dropped {ov.get('dropped_prompts')} prompts, "
        f"{ov.get('dropped_examples')} examples.", "",
        "## Training",
        (f"Fine-tuned from the {'model' if kind == 'draft' else 'head'} in `{rec['init_from']}` "
         f"({_init_sha(rec)}its weights and draft vocabulary; a fresh optimizer). "
         if rec.get("init_from") else "") +
        ("The target's logits came from its final hidden states, computed once over the corpus and kept on the "
         "device (`--teacher-cache`, training/teacher_cache.py). "
         if kind == "draft" and results["preset"].get("draft_teacher_cache") else "") +
        f"{rec['steps']} steps (of {rec.get('planned_steps', rec['steps'])} planned), batch {rec['batch_size']} x "
        f"{rec['seq_len']} tokens, AdamW lr {rec['lr']} (warmup + cosine, global-norm clipping), fp32 master weights, "
        f"{results['preset']['dtype']} compute, {rec['train_seconds']} s on {results['hardware']}{_resumed(rec)}"
        f"{_throughput(rec)}. Final loss "
        f"{final.get('loss', float('nan')):.3f}; acceptance proxy per offset (head argmax == target argmax): "
        f"{acc}.{_heldout_line(rec.get('heldout'))}" + (f" Command: `{rec['command']}`." if rec.get("command") else ""),
        "",
        f"## tau (greedy, K={rec['num_draft']}, through specjax's speculative loop, eval set {results['eval_set']})",
        "| set | prompts | tau (mean accepted length) | acceptance per position |", "| --- | --- | --- | --- |",
        *_tau_lines(rec["tau"]), "",
        f"Sequences identical to autoregressive greedy: {rec['tau'].get('greedy_identical_sequences')} "
        f"({results['preset']['dtype']}; in bfloat16 a near-tie in the target's logits can round differently in the "
        f"(K+1)-token verify forward than in AR's 1-token steps). "
        f"Files: {rec['size_bytes'] / 1e6:.1f} MB (bfloat16).", "",
    ]
    return "\n".join(lines + (_use(kind, rec["num_draft"]) if kind in _CLASS else []))


def bundle(export: Path, kinds: list[str], dest: Path, part_bytes: int = 15_000_000) -> list[Path]:
    """Tar ``export/<kind>`` folders (+ ``../results.json``) and split it into parts of ``part_bytes``
    (the device tool returns files of at most 16 MiB). Reassemble: ``cat shipped.tar.part* | tar x``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for kind in kinds:
            if (export / kind / "config.json").is_file():  # a stage skipped by --time-budget has none yet
                tar.add(export / kind, arcname=kind)
        results = export.parent / "results.json"
        if results.is_file():
            tar.add(results, arcname="results.json")
    data = buf.getvalue()
    dest.mkdir(parents=True, exist_ok=True)
    parts = []
    for i in range(0, len(data), part_bytes):
        path = dest / f"shipped.tar.part{i // part_bytes:02d}"
        path.write_bytes(data[i:i + part_bytes])
        parts.append(path)
    (dest / "shipped.tar.json").write_text(json.dumps({"parts": [p.name for p in parts], "bytes": len(data)}))
    return parts
