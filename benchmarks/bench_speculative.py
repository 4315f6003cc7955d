"""Speculative vs autoregressive decoding on SmolLM2 (real weights, bf16), B=1, greedy.

    python benchmarks/bench_speculative.py --gguf PATH --prompts prompt_ids.json --dataset mtbench \
        [--methods ar,ngram:2,ngram:4,layerskip:4] [--max-new 256] [--limit N] [--batches 1,8,32] \
        [--compute param|float32] [--head LABEL=FOLDER ...]

Every prompt of the dataset runs alone (B=1) through each method after one warm-up call (so
compilation is excluded; prompts are padded to one width so each method compiles once). Reports
tau (mean accepted length, bonus included), tokens/s, the ratio to AR measured in the same run,
and how many outputs equal AR greedy in bf16. ``--batches`` adds batch throughput (spec over AR).
``eagle3:t31`` (or ``medusa:t15``, ...) in ``--methods`` drafts the head's fitted static tree of 31 nodes
(``trees.json`` beside the head; K in the table is then the node count).
``eagle3:7+ttft`` runs a method as two programs with the first token timed (mean ``ttft_ms`` in the JSON;
~4 ms more per request than the default one program, benchmarks/NOTES.md item 32).
``draft:7@0.3`` drafts an adaptive chain of at most 7 tokens that stops after a draft below probability 0.3
(``DraftModel(min_confidence=0.3)``; the JSON row has ``min_confidence`` and ``mean_drafted``).
``--head own=FOLDER`` makes ``own:K`` in ``--methods`` a Medusa or EAGLE-3 head or a draft model loaded from
FOLDER (kind from its config.json) instead of the shipped one, so two of a kind are measured against one AR run.
``--draft-vocab full=full`` makes ``full:K`` the shipped draft model over its whole LM head (``draft`` uses the
vocabulary shipped beside it, ``draft_vocab.safetensors``); ``LABEL=eagle3`` or ``LABEL=IDS.npy`` cut it to the
shipped EAGLE-3 head's draft vocabulary or to those token ids.
``--compute float32`` runs the target with float32 matmul operands (bf16 weights upcast inside each
product, ``ModelConfig.compute_dtype``). Writes benchmarks/results/spec_<dataset>_<device>_<date>
[_f32compute]<tag>.{json,md} (the suffix and the JSON's ``compute_dtype`` record the mode).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np

import common
import hf_baseline
from specjax import config
from specjax.generate import generate
from specjax.loading import load_model
from specjax.speculative import engine

PAD = 512  # default prompt width: one compilation per method (--pad 0: the library's power-of-two buckets)


def head_option(text: str) -> tuple[str, tuple[str, str]]:
    """``LABEL=FOLDER`` -> (label, (method, folder)); the method (medusa, eagle3 or a draft model) from
    FOLDER/config.json."""
    label, sep, folder = text.partition("=")
    if not (sep and label):
        raise argparse.ArgumentTypeError(f"--head takes LABEL=FOLDER, got {text!r}")
    try:
        conf = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"--head {text!r}: cannot read {folder}/config.json ({e})")
    if "medusa_num_heads" in conf:
        return label, ("medusa", folder)
    if "LlamaForCausalLMEagle3" in conf.get("architectures", ()):
        return label, ("eagle3", folder)
    if "LlamaForCausalLM" in conf.get("architectures", ()):
        return label, ("draft", folder)
    raise argparse.ArgumentTypeError(f"--head {text!r}: {folder}/config.json is not a Medusa head, an EAGLE-3 head "
                                     f"(architectures LlamaForCausalLMEagle3) or a draft model (LlamaForCausalLM)")


def shipped_draft_over(cfg, params, vocab: str):
    """``(cfg, params)`` of the shipped draft model proposing ``vocab``: "full" (its whole LM head), "eagle3" (the
    shipped EAGLE-3 head's draft vocabulary) or a .npy file of token ids (``draft_model.restrict_vocab``)."""
    from specjax.heads import draft_io, eagle3_io, shipped
    from specjax.speculative import drafters
    from specjax.speculative.drafters.draft_model import restrict_vocab
    dcfg, dp = draft_io.load_draft_model(shipped.path(drafters.SHIPPED_TARGET, "draft"), params, full_vocab=True)
    if vocab == "full":
        return dcfg, dp
    if vocab == "eagle3":
        ids = eagle3_io.load_eagle3(shipped.path(drafters.SHIPPED_TARGET, "eagle3"), target=cfg)[2]
    else:
        ids = np.load(vocab)
    return restrict_vocab(dcfg, dp, np.asarray(ids))


@dataclasses.dataclass(frozen=True)
class Spec:
    """One entry of ``--methods``."""
    method: str
    k: int = 0  # K (a tree's node count with ``tree``)
    tree: int | None = None  # the head's fitted tree of that many nodes
    ttft: bool = False  # prefill and loop as two programs, the first token timed (speculative_generate(ttft=True))
    min_confidence: float = 0.0  # the draft model's adaptive chain (DraftModel.min_confidence)

    def row(self) -> dict:
        return {"method": self.method, "K": self.k, "tree": "yes" if self.tree else "",
                "ttft": "timed" if self.ttft else "", **({"min_confidence": self.min_confidence}
                                                         if self.min_confidence else {})}


def parse_spec(spec: str) -> Spec:
    """``method[:K]`` or ``method:tN``, optionally ``@C`` (min_confidence) and ``+ttft``."""
    body = spec.removesuffix("+ttft")
    body, _, conf = body.partition("@")
    method, _, k = body.partition(":")
    extra = dict(ttft=spec.endswith("+ttft"), min_confidence=float(conf or 0))
    if k.startswith("t"):
        return Spec(method, int(k[1:]), int(k[1:]), **extra)
    return Spec(method, int(k or 0), **extra)


def method_call(params, cfg, spec: Spec, max_new: int, layerskip: int | None, heads: dict | None = None,
                pad: int = PAD):
    """prompts -> result for one method, prompts padded to ``pad`` (PAD: one compilation per method and batch).
    ``heads``: --head labels -> (method, folder)."""
    if spec.method == "ar":
        return lambda ps: generate(params, cfg, ps, max_new_tokens=max_new, pad_to=pad)
    method, folder = (heads or {}).get(spec.method, (spec.method, None))
    return lambda ps: engine.run(params, cfg, ps, method=method, num_draft=spec.k, max_new_tokens=max_new,
                                 layerskip_layers=layerskip, draft_model=folder, pad_to=pad, tree=spec.tree,
                                 ttft=spec.ttft, min_confidence=spec.min_confidence)


def run_method(params, cfg, prompts, spec: Spec, max_new: int, layerskip: int | None, heads=None, pad: int = PAD):
    call = method_call(params, cfg, spec, max_new, layerskip, heads, pad)
    call(prompts[:1])  # warm-up: compile once
    return [call([p]) for p in prompts]


def summarize(results, ar_outputs=None) -> dict:
    tokens = sum(sum(r.new_tokens) for r in results)
    seconds = sum(r.seconds for r in results)
    row = {"prompts": len(results), "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
           "per_prompt": [(sum(r.new_tokens), r.seconds) for r in results]}
    if hasattr(results[0], "stats"):
        cycles = sum(int(r.stats.cycles_B.sum()) for r in results)
        accepted = sum(r.stats.accepted_BK.sum(axis=0) for r in results)
        row["tau"] = 1.0 + float(accepted.sum()) / max(cycles, 1)
        row["acceptance_per_position"] = [float(a) / max(cycles, 1) for a in accepted]
        row["mean_drafted"] = sum(int(r.stats.drafted_B.sum()) for r in results) / max(cycles, 1)
        if results[0].ttft_s is not None:
            row["ttft_ms"] = 1e3 * sum(r.ttft_s for r in results) / len(results)
    if ar_outputs is not None:
        row["identical_to_ar"] = sum(r.output_ids[0] == a for r, a in zip(results, ar_outputs))
        row["first_divergence"] = [next((i for i, (x, y) in enumerate(zip(r.output_ids[0], a)) if x != y), None)
                                   for r, a in zip(results, ar_outputs)]
    return row


def batch_throughput(params, cfg, prompts, spec: Spec, max_new, layerskip, batch, heads=None):
    ps = (prompts * ((batch + len(prompts) - 1) // len(prompts)))[:batch]
    call = method_call(params, cfg, spec, max_new, layerskip, heads)
    call(ps)  # warm-up: compile once
    r = call(ps)
    return sum(r.new_tokens) / r.seconds


def save(res: dict, args) -> None:
    """(Re)write the results files; called after every row so a cut-off run keeps what it measured."""
    cols = ["method", "K", "tree", "ttft", "tau", "tokens_per_s", "speedup_vs_ar", "identical_to_ar", "prompts"]
    if any("min_confidence" in r for r in res["rows"]):  # adaptive chains: where they stop, and how long they run
        cols[4:4] = ["min_confidence", "mean_drafted"]
    md = (f"# Speculative decoding, SmolLM2-135M bf16 (compute {args.compute}), {args.dataset}, B=1, greedy, "
          f"{args.max_new} new tokens\n\n"
          f"{res['device_kind']}, jax {res['jax']}, {res['date']}\n\n" + common.md_table(res["rows"], cols))
    if "hf_rows" in res:
        md += f"\nSame {args.hf} prompts: " + ", ".join(
            f"{r['method']} {r['hf_tokens_per_s']:.1f} tok/s" for r in res["hf_rows"]) + "; " + ", ".join(
            f"specjax {r['method']}{r['K'] or ''} {r['subset_tokens_per_s']:.1f} tok/s" for r in res["rows"]
            if "subset_tokens_per_s" in r) + "\n"
    if "batch_rows" in res:
        md += "\n" + common.md_table(res["batch_rows"], ["B", "method", "K", "tokens_per_s", "speedup_vs_ar"])
    common.write_results(result_name(res, args), res, md)


def result_name(res: dict, args) -> str:
    return f"spec_{args.dataset}_{res['device']}_{res['date']}{common.compute_suffix(args.compute)}{args.tag}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--prompts", required=True, help="JSON with token-id prompt lists per dataset")
    ap.add_argument("--dataset", default="mtbench", choices=("mtbench", "humaneval"))
    ap.add_argument("--methods", default="ar,ngram:2,ngram:4,ngram:6,ngram:8,layerskip:2,layerskip:4,layerskip:6,layerskip:8")
    ap.add_argument("--layerskip-layers", type=int, default=None)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--limit", type=int, default=0, help="first N prompts only (0 = all)")
    ap.add_argument("--batches", default="", help="e.g. 1,8,32: batch throughput for each method")
    ap.add_argument("--batch-methods", default="ar,ngram:4", help="methods for the batch sweep (AR first)")
    ap.add_argument("--tag", default="", help="suffix for the results file name")
    ap.add_argument("--pad", type=int, default=PAD, help=f"prompt width (default {PAD}: one compilation per method; "
                    "0: the library's default, the longest prompt rounded up to a power of two, and a cache capacity "
                    "to match; compilation is never timed)")
    ap.add_argument("--compute", choices=config.COMPUTE_DTYPES, default="param",
                    help="matmul operand dtype of the target: param (bf16, default) or float32 (bf16 weights "
                         "upcast inside each product; slower, closer verify/decode numerics); recorded in the "
                         "results file name (_f32compute) and JSON")
    ap.add_argument("--hf", type=int, default=0, help="also run HF transformers greedy and prompt lookup on the "
                                                      "first N prompts (same budget, EOS on)")
    ap.add_argument("--head", action="append", type=head_option, default=[], metavar="LABEL=FOLDER",
                    help="a Medusa/EAGLE-3 head or draft model folder named LABEL in --methods "
                         "(e.g. own=/tmp/medusa-own, then own:4)")
    ap.add_argument("--draft-vocab", action="append", default=[], metavar="LABEL=full|eagle3|IDS.npy",
                    help="LABEL in --methods (e.g. LABEL:4) is the shipped draft model over its full LM head, the "
                         "shipped EAGLE-3 head's draft vocabulary, or the token ids in IDS.npy (its LM head cut to "
                         "those rows)")
    args = ap.parse_args()
    heads = dict(args.head)
    res_heads = {label: folder for label, (_, folder) in heads.items()}
    data = json.load(open(args.prompts))
    prompts = data[args.dataset][: args.limit or None]
    cfg, params = load_model(args.gguf, jnp.bfloat16)
    cfg = cfg.replace(compute_dtype=args.compute)
    for spec in args.draft_vocab:
        label, sep, vocab = spec.partition("=")
        if not (sep and label and vocab):
            ap.error(f"--draft-vocab takes LABEL=full|eagle3|IDS.npy, got {spec!r}")
        heads[label] = ("draft", shipped_draft_over(cfg, params, vocab))
        res_heads[label] = f"shipped draft model over vocabulary {vocab!r}"
    res = {**common.header(), "model": "SmolLM2-135M-Instruct (GGUF Q4_1 dequantized to bf16)",
           "compute_dtype": args.compute, "dataset": args.dataset, "max_new_tokens": args.max_new, "batch": 1,
           "greedy": True, "pad_to": args.pad, "rows": [], **({"heads": res_heads} if res_heads else {})}
    ar_out = None
    for spec in args.methods.split(","):
        spec = parse_spec(spec)
        results = run_method(params, cfg, prompts, spec, args.max_new, args.layerskip_layers, heads, args.pad)
        row = {**spec.row(), **summarize(results, ar_out)}
        if spec.method == "ar":
            ar_out = [r.output_ids[0] for r in results]
            ar_tps = row["tokens_per_s"]
        row["speedup_vs_ar"] = row["tokens_per_s"] / ar_tps
        if args.dataset == "mtbench" and "mtbench_category" in data:
            cats = data["mtbench_category"][: len(results)]
            row["per_category"] = {c: summarize([r for r, cc in zip(results, cats) if cc == c])
                                   for c in sorted(set(cats))}
        res["rows"].append(row)
        print({k: v for k, v in row.items() if k not in ("first_divergence", "per_category", "per_prompt")}, flush=True)
        save(res, args)
    for b in [int(x) for x in args.batches.split(",") if x]:
        for spec in args.batch_methods.split(","):
            spec = parse_spec(spec)
            tps = batch_throughput(params, cfg, prompts[:b], spec, args.max_new, args.layerskip_layers, b, heads)
            if spec.method == "ar":
                ar_b = tps
            res.setdefault("batch_rows", []).append({"B": b, **spec.row(), "tokens_per_s": tps,
                                                     "speedup_vs_ar": tps / ar_b})
            print(res["batch_rows"][-1], flush=True)
            save(res, args)
    if args.hf:
        hf_model = hf_baseline.load(args.gguf)
        sub = prompts[: args.hf]
        for name, kw in (("hf_greedy", {}), ("hf_prompt_lookup", {"prompt_lookup_num_tokens": 10})):
            hf = hf_baseline.generate(hf_model, sub, args.max_new, eos_token_id=cfg.eos_token_ids[0], **kw)
            outs = hf.pop("outputs")
            same = sum(o == a[: len(o)] or a == o[: len(a)] for o, a in zip(outs, ar_out)) if ar_out else None
            res.setdefault("hf_rows", []).append({"method": name, **hf, "prefix_agrees_with_specjax_ar": same})
            print(res["hf_rows"][-1], flush=True)
        for row in res["rows"]:  # specjax on the same prompts, for a same-prompt comparison
            toks, secs = zip(*row["per_prompt"][: args.hf])
            row["subset_tokens_per_s"] = sum(toks) / sum(secs)
        res["subset_note"] = f"hf_rows and subset_tokens_per_s use the first {args.hf} prompts"
    save(res, args)
    print((common.RESULTS / f"{result_name(res, args)}.md").read_text())


if __name__ == "__main__":
    main()
