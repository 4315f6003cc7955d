"""Train and ship EAGLE-3 heads, Medusa heads and a distilled draft model for SmolLM2-135M-Instruct.

    python -m training.train_smollm2 --preset h100 --ship [--bundle $OUT] [--time-budget S]  # Hopper, ~15 min
    python -m training.train_smollm2 --preset cpu-smollm2 --out /tmp/run     # real target, tiny settings
    python -m training.train_smollm2 --preset cpu-tiny --out /tmp/run        # random tiny target (tests)

Stages: self-distillation corpus (``make_corpus``) -> EAGLE-3 -> Medusa -> draft model (each
checkpointed with Orbax under ``OUT/ckpt``, so a rerun resumes) -> export to ``OUT/export`` (and
with ``--ship`` to ``specjax/shipped/smollm2-135m-instruct``) -> tau on held-out MT-bench/HumanEval
through the real speculative loop -> ``CARD.md`` per artifact and ``OUT/results.json``.

On the lent GPU machine (64 MiB carried per call, the GGUF is 98 MB) the chain of device calls is
``benchmarks/device_heads.sh`` (stage: the GGUF's parts but the last; train1: join it, corpus
+ EAGLE-3 with ``--time-budget``; train2: the rest, ``--bundle $OUT``; bench). Locally afterwards:
``cat shipped.tar.part* | tar x -C specjax/shipped/smollm2-135m-instruct/``. The shipped artifacts
were made that way: the EAGLE-3 head on two H200s with ``--preset large --steps 13000 --only eagle3``
(benchmarks/results/train_large13k_H200x2_2026-11-29.*), then fine-tuned on one H200 with ``--preset large --steps 6500
--init-eagle3 shipped --corpus-seed 1`` (train_ft1_H200_2026-12-02.*), the Medusa heads on one H200 with
``--preset h100`` (train_heads2_H200_2026-11-26.*), the draft model on one H200 with ``--preset large --only draft
--steps 22000 --teacher-cache`` in two calls (train_draftcache22k_H200_2026-12-04.*) and fine-tuned three times
on one H100 with ``--preset large --only draft --steps 11000 --teacher-cache --init-draft shipped --corpus-seed N``, N =
1, 2, 3 (train_draftft11k{,_seed2,_seed3}_H100_2026-12-06.*). The corpus and the
training use every local device (``training/pool.py``, ``TrainConfig.devices``); ``--preset large`` is sized for two
GPUs (benchmarks/NOTES.md items 29 and 31). ``--steps N`` overrides every stage's step count. ``--init-eagle3`` /
``--init-draft FOLDER`` (or ``shipped``) fine-tune that EAGLE-3 head / draft model instead of starting afresh, its
draft vocabulary kept.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shlex
import shutil
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from specjax import assets
from specjax.errors import AssetsMissing
from specjax.heads import draft_io, eagle3_io, medusa_io, shipped
from specjax.files import atomic_write_text
from specjax.speculative.drafters.draft_model import DraftModel
from specjax.speculative.drafters.eagle3 import Eagle3
from specjax.speculative.drafters.medusa import Medusa
from training import cards, decontam, evaluate, recipes, tiny
from training.make_corpus import build_corpus
from training.presets import PRESETS, Preset

MODEL = "smollm2-135m-instruct"
SHIPPED_KINDS = ("eagle3", "medusa", "draft")
KINDS = SHIPPED_KINDS + ("medusa-own",)
HF_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # base_model_name_or_path of the Medusa export
BUILTIN_EVAL = ["Explain what a hash map is.", "Write a haiku about the sea.",
                "def fib(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load_target(preset: Preset, model_path: str | None):
    if preset.target == "tiny":
        cfg, tp = tiny.target()
        tp = jax.tree.map(lambda x: x.astype(preset.dtype), tp)
        return cfg, tp, tiny.tokenizer(), "tiny random llama (training/tiny.py)"
    from specjax.pipeline import load
    lm = load(model_path or MODEL, preset.dtype)
    return lm.cfg, lm.params, lm.tokenizer, f"{MODEL} ({lm.path.name})"


def eval_texts_or_none(preset: Preset):
    try:
        return decontam.eval_texts()
    except AssetsMissing:
        if preset.target == "tiny":
            return None
        raise


def eval_sets(preset: Preset, tok, cfg) -> tuple[dict, str]:
    limit = min(preset.eval_max_prompt, cfg.max_seq_len - preset.eval_max_new - preset.num_draft - 1)
    try:
        return evaluate.heldout_prompts(tok, preset.eval_mtbench, preset.eval_humaneval, limit), "mtbench+humaneval"
    except AssetsMissing:
        if preset.target != "tiny":
            raise
        chat = [tok.apply_chat_template([{"role": "user", "content": t}]) for t in BUILTIN_EVAL]
        return {"builtin": chat}, "builtin (assets not fetched)"


def train_and_export(kind: str, preset: Preset, tp: dict, cfg, ds, out: Path, seconds_left: float | None = None,
                     heldout=None, init: str | None = None):
    """Train one artifact, write it (bf16) to ``out/export/<kind>`` and load it back from there in the
    target's dtype, so tau is measured on the files. -> (drafter, draft_params, TrainResult, TrainConfig).
    ``seconds_left`` tightens the stage's wall-clock cap (it stops with a checkpoint; a rerun resumes).
    ``init``: for ``eagle3`` a head folder (``eagle3_io``), for ``draft`` a draft model folder (``draft_io``) to
    fine-tune instead of the usual start; a draft model keeps its draft vocabulary (``draft_vocab.safetensors``)."""
    folder, dtype, bf16 = out / "export" / kind, tp["embed"].dtype, lambda t: jax.tree.map(
        lambda x: x.astype(jnp.bfloat16), t)
    tc = dataclasses.replace(getattr(preset, kind.split("-")[0]), ckpt_dir=str(out / "ckpt" / kind))
    if seconds_left is not None:
        tc = dataclasses.replace(tc, max_seconds=min(tc.max_seconds or seconds_left, seconds_left))
    if kind == "eagle3":
        start = None if init is None else eagle3_io.load_eagle3(init, target=cfg)
        ecfg, params, ids, res = recipes.train_eagle3(tp, cfg, ds, tc, draft_vocab_size=preset.draft_vocab,
                                                      ttt_steps=preset.ttt_steps, heldout=heldout, init=start)
        eagle3_io.save_eagle3(folder, bf16(params), ecfg, ids)
        _, params, ids = eagle3_io.load_eagle3(folder, target=cfg, dtype=dtype)
        return Eagle3(ecfg), {"params": params, "draft_ids": ids}, res, tc
    if kind in ("medusa", "medusa-own"):  # medusa-own: one LM head per head (measured, too big to ship)
        mcfg, params, res = recipes.train_medusa(tp, cfg, ds, tc, num_heads=preset.medusa_heads,
                                                 own_lm_head=kind == "medusa-own", heldout=heldout)
        medusa_io.save_medusa(folder, bf16(params), mcfg, base_model=HF_ID)
        return Medusa(mcfg), medusa_io.load_medusa(folder, cfg, dtype=dtype)[1], res, tc
    start, ids = (None, None) if init is None else draft_io.fine_tune_start(init, tp)
    dcfg, params, res = recipes.train_draft(tp, cfg, ds, tc, n_layers=preset.draft_layers, heldout=heldout,
                                            cache_teacher=preset.draft_teacher_cache, init=start)
    draft_io.save_draft_model(out / "export" / "draft-hf", bf16(params), dcfg, shared_embedding=False, vocab_ids=ids)
    draft_io.save_draft_model(folder, bf16(params), dcfg, shared_embedding=True, vocab_ids=ids)
    lcfg, lp = draft_io.load_draft_model(folder, tp, dtype)  # a cut head comes back untied: its config, not dcfg
    return DraftModel(lcfg), lp, res, tc


def continued_record(prev: dict | None, res, train_s: float) -> dict:
    """Training fields of a stage resumed from its checkpoint: the earlier invocation's time and history
    carried over (a stage already complete trains 0 steps here and keeps its earlier record). Where the earlier
    invocation left no record of that step (it died before writing results.json), ``resumed_from_step`` says
    that ``train_seconds`` covers only the steps after it."""
    if res.start_step == 0:
        return {}
    if not prev or prev.get("steps") != res.start_step:
        return {"resumed_from_step": res.start_step}
    history = prev.get("history", []) + res.history[:: max(1, len(res.history) // 50)]
    return {"train_seconds": round(prev.get("train_seconds", 0.0) + (train_s if res.history else 0.0), 1),
            "final": res.history[-1] if res.history else prev.get("final"), "history": history}


def init_record(folder: str) -> dict:
    """Which head or draft model a fine-tune started from: its folder (repo-relative when shipped, since a shipped
    artifact is replaced by its fine-tune) and the sha256 of its weights (``model.safetensors`` in a head's folder
    and in a draft model's alike), which name it after the folder has changed."""
    path = Path(folder).resolve()
    shown = (Path("specjax/shipped") / path.relative_to(shipped.ROOT.resolve())
             if path.is_relative_to(shipped.ROOT.resolve()) else path)
    return {"init_from": str(shown),
            "init_sha256": hashlib.sha256((path / eagle3_io.WEIGHTS).read_bytes()).hexdigest()}


EVAL_RESERVE_S = 75  # export + tau check of one stage, kept free inside --time-budget


def run(preset: Preset, out: Path, *, ship: bool, model_path: str | None = None, only=SHIPPED_KINDS,
        time_budget: float | None = None, init_eagle3: str | None = None, init_draft: str | None = None,
        command: str | None = None):
    """``command``: the invocation, recorded with each artifact it trains (runs merge into one results.json).
    ``init_eagle3`` / ``init_draft``: folders whose EAGLE-3 head / draft model that stage fine-tunes."""
    t_start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    if jax.default_backend() != "cpu":  # a rerun after a timeout (same warm machine) skips recompiling
        jax.config.update("jax_compilation_cache_dir", str(out / "jax_cache"))
    dev, n_dev = jax.devices()[0], len(jax.devices())
    hardware = f"{n_dev} x " * (n_dev > 1) + f"{dev.device_kind} ({dev.platform})"  # corpus and training use all
    log(f"device: {hardware}; preset target={preset.target} dtype={preset.dtype}")
    cfg, tp, tok, target_name = load_target(preset, model_path)
    ds, manifest = build_corpus(tp, cfg, tok, preset.corpus, out / "corpus", eval_texts_or_none(preset), log=log)
    ds, heldout = ds.split(preset.heldout_rows, seed=1, by_prompt=True)  # prompts no stage trains on
    sets, set_name = eval_sets(preset, tok, cfg)
    reference = evaluate.ReferenceOutputs()
    earlier = json.loads((out / "results.json").read_text())["artifacts"] if (out / "results.json").is_file() else {}
    results = {"preset": dataclasses.asdict(preset), "target": target_name, "hardware": hardware,
               "jax": jax.__version__, "date": time.strftime("%Y-%m-%d"),
               "corpus": manifest["meta"], "eval_set": set_name, "artifacts": dict(earlier)}
    for kind in only:
        t0 = time.perf_counter()
        left = None if time_budget is None else time_budget - (t0 - t_start) - EVAL_RESERVE_S
        if left is not None and left < 30:
            log(f"{kind}: skipped, {left + EVAL_RESERVE_S:.0f}s of --time-budget left (rerun to continue)")
            continue
        log(f"{kind}: training")
        init = {"eagle3": init_eagle3, "draft": init_draft}.get(kind)
        drafter, dp, res, tc = train_and_export(kind, preset, tp, cfg, ds, out, left, heldout, init)
        log(f"{kind}: held-out corpus rows ({res.heldout['rows']}): loss {res.heldout['loss']:.3f}, acc "
            + " ".join(f"{a:.2f}" for a in res.heldout["acc_k"]))
        train_s = time.perf_counter() - t0
        log(f"{kind}: tau on {set_name}")
        kd = min(preset.num_draft, drafter.max_draft or preset.num_draft)
        tau = evaluate.tau(tp, cfg, drafter, dp, sets, num_draft=kd, max_new_tokens=preset.eval_max_new,
                           reference=reference)
        folder = out / "export" / kind
        rec = {"train_seconds": round(train_s, 1), "steps": res.end_step, "planned_steps": tc.steps,
               "batch_size": tc.batch_size, "lr": tc.lr, "seq_len": ds.seq_len,
               "final": res.history[-1] if res.history else None, "heldout": res.heldout,
               "history": res.history[:: max(1, len(res.history) // 50)], "tau": tau, "num_draft": kd,
               "size_bytes": sum(f.stat().st_size for f in folder.iterdir()), "command": command}
        if init is not None:
            rec |= init_record(init)
        rec |= continued_record(earlier.get(kind), res, train_s)
        results["artifacts"][kind] = rec
        atomic_write_text(folder / "CARD.md", cards.card(kind, rec, results))
        log(f"{kind}: done in {time.perf_counter() - t0:.0f}s; tau "
            + ", ".join(f"{k}={v['mean_accepted']:.2f}" for k, v in tau.items() if isinstance(v, dict)))
        if ship and kind in SHIPPED_KINDS:
            dest = shipped.ROOT / MODEL / kind
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(folder, dest)
    results["total_seconds"] = round(time.perf_counter() - t_start, 1)
    atomic_write_text(out / "results.json", json.dumps(results, indent=1, default=str))
    log(f"all done in {results['total_seconds']}s -> {out / 'results.json'}")
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="h100")
    p.add_argument("--out", default=None, help="work folder (default: $SPECJAX_HOME/train/<preset>)")
    p.add_argument("--model", default=None, help="target GGUF/HF folder (default: the fetched SmolLM2)")
    p.add_argument("--ship", action="store_true", help="copy the artifacts into specjax/shipped/")
    p.add_argument("--bundle", default=None, help="also write the shipped folders as a tar split in 15 MB parts here")
    p.add_argument("--only", default="eagle3,medusa,draft",
                   help=f"comma-separated subset of {','.join(KINDS)} "
                        "(medusa-own: own LM heads, measured, not shipped)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None, help="override the preset's dtype")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds for this invocation: stages stop early with a checkpoint (a rerun resumes)")
    p.add_argument("--steps", type=int, default=None,
                   help="override the preset's step count of every stage (the schedule's cosine follows it)")
    p.add_argument("--corpus-seed", type=int, default=None,
                   help="override the preset's corpus seed (other Magpie queries and sampled answers: a new corpus)")
    p.add_argument("--init-eagle3", default=None,
                   help="fine-tune this EAGLE-3 head folder (e.g. specjax/shipped/.../eagle3; 'shipped': the shipped "
                        "head) instead of starting from random weights; its draft vocabulary is kept")
    p.add_argument("--init-draft", default=None,
                   help="fine-tune this draft model folder ('shipped': the shipped model) instead of starting from the "
                        "truncated target; its draft vocabulary (draft_vocab.safetensors) is exported with it")
    p.add_argument("--teacher-cache", action="store_true",
                   help="draft: run the target over the corpus once and distill from its cached hidden states "
                        "(training/teacher_cache.py; ~1.2 KB of device memory per trained-on token at SmolLM2's width)")
    args = p.parse_args(argv)
    preset = PRESETS[args.preset]
    if args.teacher_cache:
        preset = dataclasses.replace(preset, draft_teacher_cache=True)
    if args.corpus_seed is not None:
        preset = dataclasses.replace(preset, corpus=dataclasses.replace(preset.corpus, seed=args.corpus_seed))
    init_eagle3 = str(shipped.path(MODEL, "eagle3")) if args.init_eagle3 == "shipped" else args.init_eagle3
    init_draft = str(shipped.path(MODEL, "draft")) if args.init_draft == "shipped" else args.init_draft
    if args.steps is not None:
        if args.steps < 1:
            p.error(f"--steps takes a positive step count; got {args.steps}")
        preset = dataclasses.replace(preset, **{k: dataclasses.replace(getattr(preset, k), steps=args.steps)
                                                for k in ("eagle3", "medusa", "draft")})
    if args.dtype:
        preset = dataclasses.replace(preset, dtype=args.dtype, **{k: dataclasses.replace(
            getattr(preset, k), compute_dtype=args.dtype) for k in ("eagle3", "medusa", "draft")})
    if args.ship and preset.target != "smollm2":
        p.error("--ship needs a preset that trains on SmolLM2")
    only = tuple(k for k in args.only.split(",") if k)
    if not only or not set(only) <= set(KINDS):
        p.error(f"--only takes a comma-separated subset of {', '.join(KINDS)}; got {args.only!r}")
    out = Path(args.out).expanduser() if args.out else assets.home() / "train" / args.preset
    command = shlex.join(["python3", "-m", "training.train_smollm2", *(sys.argv[1:] if argv is None else argv)])
    run(preset, out, ship=args.ship, model_path=args.model, only=only, time_budget=args.time_budget,
        init_eagle3=init_eagle3, init_draft=init_draft, command=command)
    if args.bundle:
        cards.bundle(out / "export", [k for k in only if k in SHIPPED_KINDS], Path(args.bundle))
    return 0


if __name__ == "__main__":
    sys.exit(main())
