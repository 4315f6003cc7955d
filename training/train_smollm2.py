"""Train and ship EAGLE-3 heads, Medusa heads and a distilled draft model for SmolLM2-135M-Instruct.

    python -m training.train_smollm2 --preset h100 --ship [--bundle $OUT]   # one H100, ~8 min
    python -m training.train_smollm2 --preset cpu-smollm2 --out /tmp/run     # real target, tiny settings
    python -m training.train_smollm2 --preset cpu-tiny --out /tmp/run        # random tiny target (tests)

Stages: self-distillation corpus (``make_corpus``) -> EAGLE-3 -> Medusa -> draft model (each
checkpointed with Orbax under ``OUT/ckpt``, so a rerun resumes) -> export to ``OUT/export`` (and
with ``--ship`` to ``specjax/shipped/smollm2-135m-instruct``) -> tau on held-out MT-bench/HumanEval
through the real speculative loop -> ``CARD.md`` per artifact and ``OUT/results.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from specjax import assets
from specjax.errors import AssetsMissing
from specjax.heads import draft_io, eagle3_io, medusa_io, shipped
from specjax.heads.files import atomic_write_text
from specjax.speculative.drafters.draft_model import DraftModel
from specjax.speculative.drafters.eagle3 import Eagle3
from specjax.speculative.drafters.medusa import Medusa
from training import cards, decontam, evaluate, recipes, tiny
from training.make_corpus import build_corpus
from training.presets import PRESETS, Preset

MODEL = "smollm2-135m-instruct"
BUILTIN_EVAL = ["Explain what a hash map is.", "Write a haiku about the sea.",
                "def fib(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load_target(preset: Preset, model_path: str | None):
    if preset.target == "tiny":
        cfg, tp = tiny.target()
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


def with_ckpt(tc, out: Path, name: str):
    return dataclasses.replace(tc, ckpt_dir=str(out / "ckpt" / name))


def run(preset: Preset, out: Path, *, ship: bool, model_path: str | None = None, only=("eagle3", "medusa", "draft")):
    t_start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    dev = jax.devices()[0]
    hardware = f"{dev.device_kind} ({dev.platform})"
    log(f"device: {hardware}; preset target={preset.target} dtype={preset.dtype}")
    cfg, tp, tok, target_name = load_target(preset, model_path)
    texts = eval_texts_or_none(preset)
    ds, manifest = build_corpus(tp, cfg, tok, preset.corpus, out / "corpus", texts, log=log)
    sets, set_name = eval_sets(preset, tok, cfg)
    reference = evaluate.ReferenceOutputs()
    results = {"preset": dataclasses.asdict(preset), "target": target_name, "hardware": hardware,
               "corpus": manifest["meta"], "eval_set": set_name, "artifacts": {}}
    ship_dtype, dtype = jnp.bfloat16, tp["embed"].dtype  # ship bf16; measure tau on the files, in the target's dtype
    export = out / "export"
    for kind in only:
        t0 = time.perf_counter()
        log(f"{kind}: training")
        if kind == "eagle3":
            ecfg, params, ids, res = recipes.train_eagle3(tp, cfg, ds, with_ckpt(preset.eagle3, out, kind),
                                                          draft_vocab_size=preset.draft_vocab, ttt_steps=preset.ttt_steps)
            eagle3_io.save_eagle3(export / kind, jax.tree.map(lambda x: x.astype(ship_dtype), params), ecfg, ids)
            _, params, ids = eagle3_io.load_eagle3(export / kind, target=cfg, dtype=dtype)
            drafter, dp, tc = Eagle3(ecfg), {"params": params, "draft_ids": ids}, preset.eagle3
        elif kind == "medusa":
            mcfg, params, res = recipes.train_medusa(tp, cfg, ds, with_ckpt(preset.medusa, out, kind),
                                                     num_heads=preset.medusa_heads)
            medusa_io.save_medusa(export / kind, jax.tree.map(lambda x: x.astype(ship_dtype), params), mcfg,
                                  base_model=MODEL)
            _, params = medusa_io.load_medusa(export / kind, cfg, dtype=dtype)
            drafter, dp, tc = Medusa(mcfg), params, preset.medusa
        else:
            dcfg, params, res = recipes.train_draft(tp, cfg, ds, with_ckpt(preset.draft, out, kind),
                                                    n_layers=preset.draft_layers)
            params = jax.tree.map(lambda x: x.astype(ship_dtype), params)
            draft_io.save_draft_model(export / "draft-hf", params, dcfg, shared_embedding=False)
            draft_io.save_draft_model(export / kind, params, dcfg, shared_embedding=True)
            _, dp = draft_io.load_draft_model(export / kind, tp, dtype)
            drafter, tc = DraftModel(dcfg), preset.draft
        train_s = time.perf_counter() - t0
        log(f"{kind}: tau on {set_name}")
        tau = evaluate.tau(tp, cfg, drafter, dp, sets, num_draft=preset.num_draft, max_new_tokens=preset.eval_max_new,
                           reference=reference)
        rec = {"train_seconds": round(train_s, 1), "steps": tc.steps, "batch_size": tc.batch_size, "lr": tc.lr,
               "seq_len": ds.seq_len, "final": res.history[-1] if res.history else None,
               "history": res.history[:: max(1, len(res.history) // 50)], "tau": tau, "num_draft": preset.num_draft,
               "size_bytes": sum(f.stat().st_size for f in (export / kind).iterdir())}
        results["artifacts"][kind] = rec
        atomic_write_text(export / kind / "CARD.md", cards.card(kind, rec, results))
        log(f"{kind}: done in {time.perf_counter() - t0:.0f}s; tau "
            + ", ".join(f"{k}={v['mean_accepted']:.2f}" for k, v in tau.items() if isinstance(v, dict)))
        if ship:
            dest = shipped.ROOT / MODEL / kind
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(export / kind, dest)
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
    p.add_argument("--only", default="eagle3,medusa,draft", help="comma-separated subset of eagle3,medusa,draft")
    args = p.parse_args(argv)
    preset = PRESETS[args.preset]
    if args.ship and preset.target != "smollm2":
        p.error("--ship needs a preset that trains on SmolLM2")
    only = tuple(k for k in args.only.split(",") if k)
    if not set(only) <= {"eagle3", "medusa", "draft"}:
        p.error(f"--only takes eagle3, medusa, draft; got {args.only!r}")
    out = Path(args.out).expanduser() if args.out else assets.home() / "train" / args.preset
    run(preset, out, ship=args.ship, model_path=args.model, only=only)
    if args.bundle:
        cards.bundle(out / "export", [k for k in only], Path(args.bundle))
    return 0


if __name__ == "__main__":
    sys.exit(main())
