"""Is the EAGLE-3 decoding loop as good as its training-time computation on the same text?

For the shipped SmolLM2 head and the first N MT-bench (and HumanEval) prompts, in float32 on any
backend:
  1. the target's greedy continuation (``generate``), M new tokens and K more (what the last cycle's
     verifier sees past the budget);
  2. the training-time unroll (``training.eagle3_ttt.ttt_logits``, 7 steps) over prompt + response
     with the target's features, and from it, offline, the chain decoding would run: a cycle starting
     after position L drafts step j's argmax at row L-1 and stops at the first mismatch with the
     greedy text; tau and per-position acceptance of that simulation, and the step-0 accuracy over
     all response positions (the training bar's "acceptance proxy") with the share of those
     positions whose token lies outside the head's draft vocabulary;
  3. the real loop (``speculative_generate``, K=7) on the same prompts: tau and per-position
     acceptance.
(3) equal to (2)'s simulation means the loop loses nothing against training; then the gap between
the proxy (all positions) and position-1 acceptance (cycle starts only) is the choice of positions.

    PYTHONPATH=. python3 benchmarks/eagle3_consistency_probe.py [--n 8] [--new 96]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax.heads import shipped
from specjax.speculative import speculative_generate
from specjax.speculative.drafters.eagle3 import Eagle3
from training.eagle3_ttt import chain_acceptance, greedy_drafts
from training.evaluate import heldout_prompts

K = 7


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8, help="prompts per set")
    ap.add_argument("--new", type=int, default=96, help="new tokens")
    a = ap.parse_args(argv)
    lm = specjax.load("smollm2-135m-instruct", dtype="float32")
    cfg, tp = lm.cfg, lm.params
    ecfg, dp = shipped.load("smollm2-135m-instruct", "eagle3", cfg, tp, dtype=jnp.float32)
    sets = heldout_prompts(lm.tokenizer, a.n, a.n, 512)
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}; {a.n} prompts per set, {a.new} new tokens, K={K}, float32")
    for name, prompts in sets.items():
        ref = specjax.generate(tp, cfg, prompts, max_new_tokens=a.new + K, eos_token_ids=()).output_ids
        proxy_hits = proxy_n = oov = 0
        in_vocab = np.zeros(cfg.vocab_size, bool)
        in_vocab[np.asarray(dp["draft_ids"])] = True
        s_cyc, s_acc = 0, np.zeros(K, int)
        for p, out in zip(prompts, ref):
            text = np.asarray(list(p) + list(out), np.int32)
            pred = greedy_drafts(tp, ecfg, dp, text, K)
            end = len(p) + a.new
            rows = np.arange(len(p) - 1, end - 2)  # rows whose step-0 target is a new token within the budget
            proxy_hits += int((pred[0, rows] == text[rows + 2]).sum())
            proxy_n += len(rows)
            oov += int((~in_vocab[text[rows + 2]]).sum())  # targets the head cannot draft at all
            c, acc = chain_acceptance(pred, text, len(p), end)  # text runs K past the budget, as the verifier sees
            s_cyc, s_acc = s_cyc + c, s_acc + acc
        res = speculative_generate(tp, cfg, prompts, Eagle3(ecfg), dp, num_draft=K, max_new_tokens=a.new,
                                   eos_token_ids=())
        same = sum(list(x) == list(y)[:a.new] for x, y in zip(res.output_ids, ref))
        l_cyc, l_acc = int(res.stats.cycles_B.sum()), res.stats.accepted_BK.sum(0)
        fmt = lambda acc, cyc: " ".join(f"{x / cyc:.2f}" for x in acc)
        print(f"[{name}] step-0 accuracy over all new-token rows (proxy): {proxy_hits / proxy_n:.3f} ({proxy_n} rows); "
              f"targets outside the {len(dp['draft_ids'])}-token draft vocabulary: {oov / proxy_n:.3f}")
        print(f"[{name}] simulated chain from the training unroll: tau {1 + s_acc.sum() / s_cyc:.3f}, "
              f"{s_cyc} cycles, acceptance per position {fmt(s_acc, s_cyc)}")
        print(f"[{name}] speculative loop: tau {1 + l_acc.sum() / l_cyc:.3f}, {l_cyc} cycles, "
              f"acceptance per position {fmt(l_acc, l_cyc)}; outputs equal to AR greedy: {same}/{len(prompts)}",
              flush=True)


if __name__ == "__main__":
    main()
