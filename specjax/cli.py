"""`specjax fetch | generate | train` — the command-line contract.

Errors: a message on stderr, exit code 2, nothing on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys

from specjax.config import COMPUTE_DTYPES
from specjax.errors import SpecjaxError

METHODS = ("ar", "draft", "layerskip", "ngram", "eagle3", "medusa")


def _prompts(args) -> list[str]:
    if args.prompt is not None:
        return [args.prompt]
    rows = []
    with open(args.prompts_file, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{args.prompts_file}:{n}: not valid JSON ({e.msg})") from e
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise ValueError(f'{args.prompts_file}:{n}: expected an object with a "prompt" string')
            rows.append(row["prompt"])
    if not rows:
        raise ValueError(f"{args.prompts_file} holds no prompts")
    return rows


def _generate_one(lm, ids: list[int], args):
    from specjax.generate import generate
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
              top_p=args.top_p, seed=args.seed)
    if args.method == "ar":
        res = generate(lm.params, lm.cfg, [ids], **kw)
        return res, {}
    from specjax.speculative.engine import run
    tree = int(args.tree) if args.tree and args.tree.isdigit() else args.tree
    res = run(lm.params, lm.cfg, [ids], method=args.method, num_draft=args.num_draft, draft_model=args.draft_model,
              layerskip_layers=args.layerskip_layers, ngram_min=args.ngram_min, ngram_max=args.ngram_max, tree=tree,
              min_confidence=args.min_confidence, ttft=args.ttft, **kw)
    m = res.metrics()
    return res, {"mean_accepted": m["mean_accepted"], "acceptance_per_position": m["acceptance_per_position"],
                 "num_cycles": m["num_cycles"], "draft_acceptance_rate": m.get("draft_acceptance_rate"),
                 "mean_drafted": m["mean_drafted"],
                 "ttft_s": m.get("ttft_s")}


def cmd_generate(args) -> int:
    from specjax.generate import validate_request
    from specjax.pipeline import load
    from specjax.sampling import validate
    validate(args.temperature, args.top_k, args.top_p)
    if args.max_new_tokens <= 0:
        raise ValueError(f"--max-new-tokens must be > 0, got {args.max_new_tokens}")
    texts = _prompts(args)
    lm = load(args.model, args.dtype, compute_dtype=args.compute)
    encoded = [lm.encode(t, chat=args.chat) for t in texts]
    for ids in encoded:  # fail before any work
        validate_request(lm.cfg, [ids], args.max_new_tokens)
    for ids in encoded:
        res, extra = _generate_one(lm, ids, args)
        out = res.output_ids[0]
        row = {"prompt_ids": ids, "output_ids": out, "text": lm.decode(out), "new_tokens": len(out),
               "seconds": res.seconds, "tokens_per_s": res.tokens_per_s, "method": args.method, **extra}
        print(json.dumps(row) if args.json else row["text"], flush=True)
    return 0


def cmd_fetch(args) -> int:
    from specjax import assets
    for name, path in assets.fetch(progress=not args.quiet, force=args.force).items():
        print(f"{name}: {path}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specjax", description="Speculative decoding in JAX.")
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch", help="download the offline assets (SmolLM2 GGUF, MT-bench, HumanEval)")
    f.add_argument("--force", action="store_true")
    f.add_argument("--quiet", action="store_true")
    f.set_defaults(func=cmd_fetch)

    g = sub.add_parser("generate", help="generate text (autoregressive or speculative)")
    g.add_argument("--model", default="smollm2-135m-instruct", help="registered name, .gguf file or HF folder")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompts-file", help='JSONL, one {"prompt": ...} per line')
    g.add_argument("--chat", action="store_true", help="render each prompt as a user turn with the chat template")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="weights dtype (and the KV cache's, unless --compute float32)")
    g.add_argument("--compute", choices=COMPUTE_DTYPES, default="param",
                   help="matmul operand dtype. 'param' (default): the weight dtype (--dtype), fastest. "
                        "'float32': weights stay --dtype in memory but every matmul and the attention "
                        "take float32 operands and the KV cache is float32 (weights upcast in the product, "
                        "full float32 precision, "
                        "no TF32), so with bfloat16 a speculative greedy run keeps the autoregressive "
                        "tokens far more often; slower. With --dtype float32 it only forces full-precision matmuls")
    g.add_argument("--method", default="ar", help=f"one of {', '.join(METHODS)}")
    g.add_argument("--num-draft", type=int, default=None,
                   help="K, draft tokens per cycle (default 4; with --tree, the tree's node count)")
    g.add_argument("--tree", default=None,
                   help="draft/eagle3/medusa: draft a static tree: N (the head's or draft model's fitted N-node tree, "
                        "e.g. 15, 31, 63; 31 is the shipped EAGLE-3 head's fastest on an H200) or a JSON file of "
                        "rank paths such as [[0], [1], [0, 0]]")
    g.add_argument("--ttft", action="store_true",
                   help="speculative methods: run the prefill as a program of its own and report the time to first "
                        "token (ttft_s in --json; ~4 ms more per request than the default single program)")
    g.add_argument("--draft-model", default=None)
    g.add_argument("--layerskip-layers", type=int, default=None)
    g.add_argument("--ngram-min", type=int, default=1)
    g.add_argument("--ngram-max", type=int, default=3)
    g.add_argument("--min-confidence", type=float, default=0.0,
                   help="draft: an adaptive chain of at most K drafts, each stopping after a draft whose probability "
                        "under the draft model is below this (0 = always K)")
    g.add_argument("--json", action="store_true", help="one JSON object per prompt on stdout")
    g.set_defaults(func=cmd_generate)

    from training.cli import add_arguments, train_main  # training imports specjax, never the reverse
    t = sub.add_parser("train", help="train an EAGLE-3 / Medusa head or a distilled draft model")
    add_arguments(t)
    t.set_defaults(func=train_main)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "method", "ar") not in METHODS:
        print(f"specjax: error: unknown --method {args.method!r}; expected one of {', '.join(METHODS)}",
              file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except (SpecjaxError, ValueError, FileNotFoundError) as e:
        print(f"specjax: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
