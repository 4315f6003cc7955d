"""Autoregressive decode ms/token at B=1 and B=8 vs the HBM roofline, plus HF transformers greedy.

    python benchmarks/bench_decode.py [--gguf PATH] [--hf-prompts N] [--models 8b,smollm-shape,smollm-gguf] \
        [--compute param|float32] [--unroll 1,4] [--fold 1,0]

ms/token is the slope between two runs of the same compiled loop (max_new_tokens is traced), so
prefill and compilation drop out. Roofline = weight bytes read per step / copy bandwidth measured
in the same run. ``--compute float32``: float32 matmul operands with the bf16 weights upcast inside
each product (``ModelConfig.compute_dtype``; the roofline's weight bytes are unchanged). ``--unroll``
compares decode steps per ``while_loop`` iteration in the same process (default: ``generate``'s). ``--fold 1,0``
compares, in the same process, one-row (B=1) steps with each RMSNorm's statistic inside the next matmul's
reduction where ``layers.fold_norm`` allows it (the default) and without (a reduction kernel per norm). Writes
benchmarks/results/decode_<device>_<date>[_f32compute]<tag>.{json,md} after every model (a cut-off run keeps its
rows; ``finished`` in the JSON says whether it ran to the end); the JSON records the mode.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

import common
import hf_baseline
from specjax import config, layers, model
from specjax.generate import default_unroll, generate


SMOLLM2_SHAPE = config.ModelConfig(vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, ffn_dim=1536,
                                   rope_theta=100000.0, tie_embeddings=True, max_seq_len=8192, eos_token_ids=(2,))


def weight_bytes(params: dict, cfg) -> int:
    """Bytes of weights one decode step must read (the embedding gather reads one row per token)."""
    leaves = jax.tree_util.tree_leaves({k: v for k, v in params.items() if k != "embed"})
    n = sum(x.size * x.dtype.itemsize for x in leaves)
    if cfg.tie_embeddings:  # the embedding doubles as the LM head
        n += params["embed"].size * params["embed"].dtype.itemsize
    return n


def decode_ms_per_token(params, cfg, batch: int, prompt_len: int, n_lo: int, n_hi: int, repeats: int = 3,
                        unroll: int | None = None):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, cfg.vocab_size - 10, prompt_len).tolist() for _ in range(batch)]

    def run(n):
        times = [generate(params, cfg, prompts, max_new_tokens=n, eos_token_ids=(), unroll=unroll).seconds
                 for _ in range(repeats + 1)]
        return float(np.median(times[1:]))
    lo, hi = run(n_lo), run(n_hi)
    return 1000 * (hi - lo) / (n_hi - n_lo)


def set_fold(on: bool) -> None:
    """Fold the norms into one-row matmuls (``layers.fold_norm``, the default) or not; clears JAX's caches."""
    layers.FOLD_MAX_IN = ORIG_FOLD_MAX if on else -1
    jax.clear_caches()


ORIG_FOLD_MAX = layers.FOLD_MAX_IN


def bench_model(name, params, cfg, bw, prompt_len, n_lo, n_hi, unrolls=(None,), folds=(True,)):
    """Rows for B=1 and B=8, one per ``unroll`` (None: ``generate``'s default) and norm fold (B=1 only: at B=8
    no step is one row)."""
    rows = []
    wb = weight_bytes(params, cfg)
    roof = 1000 * wb / bw
    for batch, unroll, fold in [(b, u, f) for b in (1, 8) for u in unrolls for f in (folds if b == 1 else (True,))]:
        set_fold(fold)
        ms = decode_ms_per_token(params, cfg, batch, prompt_len, n_lo, n_hi, unroll=unroll)
        rows.append({"model": name, "B": batch, "unroll": unroll or default_unroll(), "norm_fold": fold,
                     "ms_per_token": ms, "roofline_ms": roof, "pct_roofline": 100 * roof / ms, "tokens_per_s": 1000 * batch / ms,
                     "prompt_len": prompt_len, "weight_GB": wb / 1e9})
        print(rows[-1], flush=True)
    return rows


def markdown(res: dict, rows: list[dict], args) -> str:
    md = (f"# AR decode on {res['device_kind']} (jax {res['jax']}, {res['date']}), compute {args.compute}\n\n"
          f"XLA_FLAGS={res['xla_flags']!r}\n\n"
          f"HBM bandwidth (max of copy and read, same run) {res['bandwidth_GBps']['best']:.0f} GB/s\n\n"
          + common.md_table(rows, ["model", "B", "unroll", "norm_fold", "ms_per_token", "roofline_ms", "pct_roofline",
                                   "tokens_per_s"]))
    if "mtbench_greedy" in res:
        g = res["mtbench_greedy"]
        md += (f"\nMT-bench greedy, {g['prompts']} prompts x {g['max_new_tokens']} tokens, B=1: specjax "
               f"{g['specjax_tokens_per_s']:.1f} tok/s, HF transformers {g['hf_tokens_per_s']:.1f} tok/s "
               f"({g['speedup_vs_hf']:.2f}x)\n")
    if not res.get("finished"):
        md += "\nPartial: the run had not finished when these files were last written (rows so far).\n"
    return md


def save(res: dict, rows: list[dict], args, finished: bool = False) -> None:
    """(Re)write the results files; called after every model so a cut-off run keeps what it measured."""
    res["rows"], res["finished"] = rows, finished
    name = f"decode_{res['device']}_{res['date']}{common.compute_suffix(args.compute)}{args.tag}"
    common.write_results(name, res, markdown(res, rows, args))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=None, help="SmolLM2 GGUF path (default: the fetched asset)")
    ap.add_argument("--prompts", default=None, help="chat-templated MT-bench prompt ids: make_prompt_ids.py's JSON "
                    "(its 'mtbench' list) or a JSON list")
    ap.add_argument("--hf-prompts", type=int, default=10, help="MT-bench prompts for the HF comparison")
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--models", default="8b,smollm-gguf", help="comma list of 8b, smollm-shape, smollm-gguf")
    ap.add_argument("--unroll", default="", help="comma list of decode steps per loop iteration to compare "
                    "(default: only specjax.generate.default_unroll())")
    ap.add_argument("--fold", default="1", help="comma list of 1 (norms folded into one-row matmuls, the "
                    "default) and 0 (not), compared at B=1 in the same process")
    ap.add_argument("--tag", default="", help="suffix for the results file name (e.g. an XLA flag variant)")
    ap.add_argument("--compute", choices=config.COMPUTE_DTYPES, default="param",
                    help="matmul operand dtype: param (bf16, default) or float32 (bf16 weights upcast inside "
                         "each product; slower); recorded in the results file name (_f32compute) and JSON")
    args = ap.parse_args()
    models = args.models.split(",")
    unrolls = tuple(int(u) for u in args.unroll.split(",") if u) or (None,)
    folds = tuple(bool(int(f)) for f in args.fold.split(",") if f) or (True,)
    res = common.header()
    res["xla_flags"] = __import__("os").environ.get("XLA_FLAGS", "")
    res["compute_dtype"] = args.compute
    bws = common.copy_bandwidth()
    bw = bws["best"]
    res["bandwidth_GBps"] = {k: v / 1e9 for k, v in bws.items()}
    print("bandwidth GB/s", res["bandwidth_GBps"], flush=True)
    rows = []
    if "smollm-shape" in models:
        cfgs = SMOLLM2_SHAPE.replace(compute_dtype=args.compute)
        ps = model.init_params(cfgs, jax.random.key(0), dtype=jnp.bfloat16)
        rows += bench_model("smollm2-135m-shape (random)", ps, cfgs, bw, prompt_len=128, n_lo=64, n_hi=256,
                            unrolls=unrolls, folds=folds)
        del ps
        save(res, rows, args)
    if "8b" in models:
        cfg8 = config.llama3_8b_shape().replace(compute_dtype=args.compute)
        p8 = model.init_params(cfg8, jax.random.key(0), dtype=jnp.bfloat16)
        rows += bench_model("llama3-8b-shape (random)", p8, cfg8, bw, prompt_len=1024, n_lo=64, n_hi=512,
                            unrolls=unrolls, folds=folds)
        del p8
        save(res, rows, args)
    if "smollm-gguf" in models:
        from specjax.loading import load_model
        from specjax import assets
        path = args.gguf or str(assets.resolve_model("smollm2-135m-instruct"))
        cfg, params = load_model(path, jnp.bfloat16)
        cfg = cfg.replace(compute_dtype=args.compute)
        rows += bench_model("smollm2-135m (GGUF, bf16)", params, cfg, bw, prompt_len=128, n_lo=64, n_hi=256,
                            unrolls=unrolls, folds=folds)
        save(res, rows, args)
        if args.prompts:
            data = json.load(open(args.prompts))  # make_prompt_ids.py's dict, or a plain list of id lists
            prompts = (data["mtbench"] if isinstance(data, dict) else data)[: args.hf_prompts]
            set_fold(True)
            ours = [generate(params, cfg, [p], max_new_tokens=args.max_new, eos_token_ids=(), pad_to=512)
                    for p in prompts]
            ours_tps = sum(sum(r.new_tokens) for r in ours) / sum(r.seconds for r in ours)
            hf = hf_baseline.generate(hf_baseline.load(path), prompts, args.max_new)
            hf.pop("outputs")
            res["mtbench_greedy"] = {"prompts": len(prompts), "max_new_tokens": args.max_new,
                                     "specjax_tokens_per_s": ours_tps, **hf,
                                     "speedup_vs_hf": ours_tps / hf["hf_tokens_per_s"]}
            print(res["mtbench_greedy"], flush=True)
    save(res, rows, args, finished=True)
    print(markdown(res, rows, args))


if __name__ == "__main__":
    main()
