"""``specjax train eagle3|medusa|draft``: one artifact on a (generated or reused) self-distillation corpus.

    specjax train eagle3 --out runs/e3 --steps 1500 --batch-size 32
    -> runs/e3/corpus/ (token shards), runs/e3/ckpt/eagle3/ (Orbax; a rerun resumes), runs/e3/export/eagle3/

Wire-up (specjax/cli.py): ``add_arguments(sub.add_parser("train", ...))`` and call ``train_main(args)``.
For all three artifacts plus tau and the shipped cards, use ``python -m training.train_smollm2``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp

from specjax.heads import draft_io, eagle3_io, medusa_io
from training import decontam, recipes
from training.loop import TrainConfig
from training.make_corpus import CorpusSpec, build_corpus

KINDS = ("eagle3", "medusa", "draft")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=KINDS, help="what to train")
    p.add_argument("--model", default="smollm2-135m-instruct", help="target: registered name, .gguf or HF folder")
    p.add_argument("--out", required=True, help="work folder (corpus/, ckpt/<kind>/, export/<kind>/)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16", help="target and compute dtype")
    g = p.add_argument_group("corpus (generated into OUT/corpus unless one with the same settings is there)")
    g.add_argument("--n-chat", type=int, default=2048)
    g.add_argument("--n-code", type=int, default=1024)
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--seq-len", type=int, default=512)
    g.add_argument("--fixed-width", action="store_true",
                   help="answer prompts padded to one width in full batches: one compilation per temperature")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, default=1000)
    g.add_argument("--batch-size", type=int, default=32)
    g.add_argument("--lr", type=float, default=6e-4)
    g.add_argument("--warmup", type=int, default=50)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--devices", type=int, default=None,
                   help="devices for the corpus and data-parallel training (default: all local ones; "
                        "--batch-size must divide by it)")
    g.add_argument("--ttt-steps", type=int, default=7, help="eagle3: unrolled training-time-test steps")
    g.add_argument("--init", default=None,
                   help="eagle3: fine-tune this exported head folder (its weights and draft vocabulary) instead of "
                        "random weights; --draft-vocab must match it. draft: fine-tune this draft model folder "
                        "(--layers must match it; its draft_vocab.safetensors, if any, is exported with it)")
    g.add_argument("--draft-vocab", type=int, default=8192, help="eagle3: draft vocabulary size")
    g.add_argument("--num-heads", type=int, default=4, help="medusa: heads")
    g.add_argument("--own-lm-head", action="store_true", help="medusa: one LM head per head instead of the target's")
    g.add_argument("--layers", type=int, default=2, help="draft: decoder layers")
    g.add_argument("--teacher-cache", action="store_true",
                   help="draft: the target's hidden states computed once over the corpus and kept on the device, "
                        "instead of a target forward in every step (training/teacher_cache.py)")


def train_main(args: argparse.Namespace) -> int:
    from specjax.pipeline import load
    if args.steps <= 0 or args.batch_size <= 0:
        raise ValueError(f"--steps and --batch-size must be positive, got {args.steps} and {args.batch_size}")
    if args.init is not None and args.kind == "medusa":
        raise ValueError("--init fine-tunes an EAGLE-3 head or a draft model; got kind 'medusa'")
    if args.teacher_cache and args.kind != "draft":
        raise ValueError(f"--teacher-cache applies to the draft model's distillation; got kind {args.kind!r}")
    out = Path(args.out).expanduser()
    lm = load(args.model, args.dtype)
    cfg, tp = lm.cfg, lm.params
    spec = CorpusSpec(n_chat=args.n_chat, n_code=args.n_code, max_new_tokens=args.max_new_tokens, seq_len=args.seq_len,
                      max_prompt_tokens=min(256, args.seq_len // 2), seed=args.seed, fixed_width=args.fixed_width)
    ds, _ = build_corpus(tp, cfg, lm.tokenizer, spec, out / "corpus", decontam.eval_texts(),
                         devices=args.devices)
    tc = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup_steps=args.warmup,
                     compute_dtype=args.dtype, seed=args.seed, ckpt_dir=str(out / "ckpt" / args.kind),
                     ckpt_every=max(1, args.steps // 4), log_every=10, devices=args.devices)
    export = out / "export" / args.kind
    bf16 = lambda tree: jax.tree.map(lambda x: x.astype(jnp.bfloat16), tree)  # noqa: E731
    if args.kind == "eagle3":
        init = None if args.init is None else eagle3_io.load_eagle3(args.init, target=cfg)
        ecfg, params, ids, _ = recipes.train_eagle3(tp, cfg, ds, tc, draft_vocab_size=args.draft_vocab,
                                                    ttt_steps=args.ttt_steps, seed=args.seed, init=init)
        eagle3_io.save_eagle3(export, bf16(params), ecfg, ids)
    elif args.kind == "medusa":
        mcfg, params, _ = recipes.train_medusa(tp, cfg, ds, tc, num_heads=args.num_heads, own_lm_head=args.own_lm_head)
        medusa_io.save_medusa(export, bf16(params), mcfg, base_model=str(args.model))
    else:
        init, ids = (None, None) if args.init is None else draft_io.fine_tune_start(args.init, tp)
        dcfg, params, _ = recipes.train_draft(tp, cfg, ds, tc, n_layers=args.layers, cache_teacher=args.teacher_cache,
                                              init=init)
        draft_io.save_draft_model(export, bf16(params), dcfg, shared_embedding=False, vocab_ids=ids)
    print(f"wrote {export}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="specjax train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return train_main(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
