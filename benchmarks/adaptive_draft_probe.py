"""Probe (CPU or GPU): the shipped draft model's adaptive chains (``DraftModel(min_confidence=c)``) on MT-bench.

    PYTHONPATH=.:benchmarks python3 benchmarks/adaptive_draft_probe.py [--prompts 16] [--max-new 128]
        [--settings 5@0,7@0,7@0.2,7@0.3,7@0.4,7@0.5,10@0.3,10@0.4] [--dtype float32]

Greedy, every ``80 / N``-th MT-bench first turn in one batch, the SmolLM2 GGUF and the shipped draft model over its
shipped draft vocabulary. Per setting ``K@c`` (at most K drafts, stop after one below probability c): tau, the mean
drafts proposed per cycle and the acceptance per position. Greedy outputs do not depend on the setting, so what
changes is how the same tokens are cut into cycles: tau against drafts proposed. Timing is left to
``bench_speculative.py`` (``draft:7@0.3``). Writes results/adaptive_draft_<device>_<date>.{json,md}
(benchmarks/NOTES.md item 44).
"""

from __future__ import annotations

import argparse

import common
import specjax
from specjax import prompts as eval_prompts
from specjax.heads import shipped
from specjax.speculative import speculative_generate
from specjax.speculative.drafters.draft_model import DraftModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16, help="MT-bench first turns, evenly spaced over the 80")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--settings", default="5@0,7@0,7@0.2,7@0.3,7@0.4,7@0.5,10@0.3,10@0.4", help="K@min_confidence")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = ap.parse_args()
    lm = specjax.load("smollm2-135m-instruct", args.dtype)
    dcfg, dp = shipped.load("smollm2-135m-instruct", "draft", lm.cfg, lm.params)
    rows = eval_prompts.mtbench()
    picked = rows[:: max(1, len(rows) // args.prompts)][: args.prompts]
    prompts = [lm.encode(q["prompt"], chat=True) for q in picked]
    res = {**common.header(), "dtype": args.dtype, "prompts": len(prompts), "max_new_tokens": args.max_new, "rows": []}
    for setting in args.settings.split(","):
        k, _, c = setting.partition("@")
        r = speculative_generate(lm.params, lm.cfg, prompts, DraftModel(dcfg, min_confidence=float(c or 0)), dp,
                                 num_draft=int(k), max_new_tokens=args.max_new, pad_to=256)
        m = r.metrics()
        row = {"K": int(k), "min_confidence": float(c or 0), "tau": m["mean_accepted"],
               "mean_drafted": m["mean_drafted"], "num_cycles": m["num_cycles"],
               "draft_acceptance_rate": m["draft_acceptance_rate"],
               "acceptance_per_position": m["acceptance_per_position"]}
        res["rows"].append(row)
        print({k: v for k, v in row.items() if k != "acceptance_per_position"}, flush=True)
    md = (f"# Adaptive draft chains, shipped draft model, MT-bench ({len(prompts)} prompts, {args.max_new} tokens, "
          f"greedy, {args.dtype})\n\n{res['device_kind']}, jax {res['jax']}, {res['date']}\n\n"
          + common.md_table(res["rows"], ["K", "min_confidence", "tau", "mean_drafted", "num_cycles",
                                          "draft_acceptance_rate"]))
    print(common.write_results(f"adaptive_draft_{common.device_name()}_{res['date']}", res, md))


if __name__ == "__main__":
    main()
