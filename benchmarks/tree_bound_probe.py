"""How much would static draft trees raise tau over chains, for the shipped SmolLM2 heads? (offline, float32)

For a greedy target, a cycle whose last emitted token is ``text[L]`` accepts the drafts along the
target's own continuation ``text[L+1], text[L+2], ...`` for as long as that path is in the draft
tree. Along that path every drafter here is conditioned on correct tokens only, so what matters is
the rank of the true token in each step's distribution at row ``L-1``: Medusa head j's logits
(``specjax.heads.medusa.logits``), EAGLE-3 step j's logits from the training-time unroll
(``training.eagle3_ttt.ttt_logits``, which ``eagle3_consistency_probe.py`` showed equal to the
decoding loop), the draft model's logits at position ``L + j`` of one forward over the text (over its
draft vocabulary). A static tree is a prefix-closed set of rank tuples; a chain is (0,), (0, 0), ...
A cycle accepts the longest prefix of its rank tuple that lies in the tree, so the replay below is
what tree decoding with that tree would accept (with one verify forward over all its nodes).

The tree of each size is the most frequent rank prefixes on calibration text (templated
instructions and standard-library code stubs, the training corpus's kinds, answered greedily by the
target), then replayed on held-out MT-bench / HumanEval prompts (chat form, as the training-time
check), each answer cut at its EOS. Prints tau for the chain and for trees of each size.

    PYTHONPATH=.:benchmarks python3 benchmarks/tree_bound_probe.py [--n 8] [--calib 16] [--new 96]
        [--drafters eagle3,medusa,draft] [--shipped-trees]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax import model
from specjax.files import atomic_write_text
from specjax.heads import medusa, shipped
from specjax.speculative.drafters import SHIPPED_TARGET
from specjax.speculative.tree import Tree
from training import corpus, instructions
from training.eagle3_ttt import (NOT_PROPOSED, draft_model_ranks, tree_acceptance, true_ranks, ttt_logits,
                                 vocab_columns)
from training.evaluate import heldout_prompts

EAGLE3_STEPS = 7  # EAGLE-3's chain length (issue #4's K=7) and the depth of its trees
SIZES = (4, 7, 15, 31, 63)
DRAFT_CHAIN = 5  # the draft model's fastest chain on an H200 (benchmarks/NOTES.md item 43); its trees go 7 deep


def rank_table(lm, heads: dict, text: np.ndarray) -> dict[str, np.ndarray]:
    """Per drafter ``R[t, j]``: rank of ``text[t + 2 + j]`` in step j's distribution at row t (``NOT_PROPOSED`` past
    the text). Row t: the cycle whose last emitted token is ``text[t + 1]``."""
    cfg, tp = lm.cfg, lm.params
    toks = jnp.asarray(text, jnp.int32)[None]
    taps = tuple(sorted({i for k in ("eagle3", "medusa") if k in heads for i in heads[k][0].taps}))
    by_layer = dict(zip(taps, model.forward(tp, cfg, toks, taps=taps)[1])) if taps else {}
    out = {}
    if "eagle3" in heads:
        ecfg, edp = heads["eagle3"]
        steps = ttt_logits(edp["params"], ecfg, tp["embed"], toks, tuple(by_layer[i] for i in ecfg.taps),
                           EAGLE3_STEPS)
        out["eagle3"] = true_ranks([s[0] for s in steps], text, vocab_columns(cfg.vocab_size, edp["draft_ids"])).T
    if "medusa" in heads:
        mcfg, mdp = heads["medusa"]
        out["medusa"] = true_ranks(list(medusa.logits(mdp, mcfg, by_layer[mcfg.taps[0]][0], tp)), text).T  # [J, T, V]
    if "draft" in heads:  # teacher-forced: step j at row t is the draft model's logits at position t + 1 + j
        out["draft"] = draft_model_ranks(*heads["draft"], text, EAGLE3_STEPS).T
    return out


def prefixes(R: np.ndarray, rows) -> collections.Counter:
    c = collections.Counter()
    for t in rows:
        for m in range(1, R.shape[1] + 1):
            if R[t, m - 1] >= NOT_PROPOSED:
                break
            c[tuple(R[t, :m])] += 1
    return c


def best_tree(counts: collections.Counter, size: int, max_depth: int | None = None) -> set:
    """The ``size`` most frequent rank prefixes, kept prefix-closed (a node only after its parent), at most
    ``max_depth`` deep."""
    tree = set()
    for tup, _ in sorted(counts.items(), key=lambda kv: (-kv[1], len(kv[0]), kv[0])):
        if len(tree) == size:
            break
        if max_depth is not None and len(tup) > max_depth:
            continue
        if len(tup) == 1 or tup[:-1] in tree:
            tree.add(tup)
    return tree


def _json_paths(tree: set) -> list[list[int]]:
    """A tree's rank paths as JSON lists, breadth-first (as ``Tree`` keeps them)."""
    return sorted(([int(r) for r in p] for p in tree), key=lambda p: (len(p), p))


def texts(lm, prompts: list[list[int]], new: int, depth: int) -> list[tuple[np.ndarray, int, int]]:
    """(prompt + greedy continuation running ``depth`` past the budget, start, end at the EOS or budget)."""
    outs = specjax.generate(lm.params, lm.cfg, prompts, max_new_tokens=new + depth, eos_token_ids=()).output_ids
    eos = set(lm.cfg.eos_token_ids)
    res = []
    for p, o in zip(prompts, outs):
        stop = next((i + 1 for i, x in enumerate(o[:new]) if x in eos), new)
        res.append((np.asarray(list(p) + list(o), np.int64), len(p), len(p) + stop))
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8, help="held-out prompts per set")
    ap.add_argument("--calib", type=int, default=16, help="calibration prompts per kind (instructions, code stubs)")
    ap.add_argument("--new", type=int, default=96, help="new tokens")
    ap.add_argument("--write-trees", default="",
                    help="also write the fitted trees (JSON: drafter -> size -> paths) here")
    ap.add_argument("--max-depths", default="",
                    help="also fit trees at most this deep, e.g. 5,6 (written as drafter-dN, e.g. draft-d5): for a "
                         "drafter whose every level costs a forward, a shallower tree of the same size may be faster")
    ap.add_argument("--drafters", default="eagle3,medusa,draft",
                    help="comma-separated shipped drafters to fit: eagle3, medusa, draft (the draft model over its "
                         "draft vocabulary)")
    ap.add_argument("--shipped-trees", action="store_true",
                    help="also replay the trees in each drafter's shipped trees.json (e.g. after its weights changed)")
    a = ap.parse_args(argv)
    names = [d for d in a.drafters.split(",") if d]
    if not names or set(names) - {"eagle3", "medusa", "draft"}:
        ap.error(f"--drafters: a comma-separated subset of eagle3, medusa, draft; got {a.drafters!r}")
    lm = specjax.load(SHIPPED_TARGET, dtype="float32")
    heads = {k: shipped.load(SHIPPED_TARGET, k, lm.cfg, lm.params, dtype=jnp.float32) for k in names}
    calib_prompts = [corpus.chat_ids(lm.tokenizer, q) for q in instructions.instructions(a.calib, seed=12345)]
    calib_prompts += [corpus.chat_ids(lm.tokenizer, q) for q in corpus.code_prompts(a.calib, seed=12345)]
    sets = {"calibration": [p for p in calib_prompts if len(p) <= 512],
            **heldout_prompts(lm.tokenizer, a.n, a.n, 512)}
    sets = {k: v for k, v in sets.items() if v}
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}, float32; {a.new} new tokens (cut at EOS); "
          f"prompts: " + ", ".join(f"{k} {len(v)}" for k, v in sets.items()), flush=True)
    tables = {name: [(rank_table(lm, heads, t), s, e) for t, s, e in texts(lm, ps, a.new, EAGLE3_STEPS)]
              for name, ps in sets.items()}
    fitted = {}
    chains = {"eagle3": EAGLE3_STEPS, "draft": DRAFT_CHAIN,
              "medusa": heads["medusa"][0].num_heads if "medusa" in heads else 0}
    for drafter in names:
        chain_len = chains[drafter]
        counts = collections.Counter()
        for tabs, s, e in tables["calibration"]:
            counts += prefixes(tabs[drafter], range(s - 1, e - 2))
        trees = {f"chain K={chain_len}": {(0,) * m for m in range(1, chain_len + 1)}}
        trees |= {f"tree {n} nodes": best_tree(counts, n) for n in SIZES}
        shipped_file = shipped.path(SHIPPED_TARGET, drafter) / "trees.json"
        if a.shipped_trees and shipped_file.is_file():  # e.g. trees fitted on the weights before a fine-tune
            sizes = sorted(json.loads(shipped_file.read_text())[drafter], key=int)
            trees |= {f"shipped tree {n} nodes": set(Tree.load(shipped_file, int(n), drafter).paths) for n in sizes}
        fitted[drafter] = {str(n): _json_paths(trees[f"tree {n} nodes"]) for n in SIZES}
        for cap in [int(c) for c in a.max_depths.split(",") if c]:
            capped = {n: best_tree(counts, n, cap) for n in SIZES}
            trees |= {f"tree {n} nodes, depth <= {cap}": t for n, t in capped.items()}
            fitted[f"{drafter}-d{cap}"] = {str(n): _json_paths(t) for n, t in capped.items()}
        print(f"\n{drafter}: tau (mean accepted length, bonus included) per set")
        print("| tree | " + " | ".join(tables) + " | max depth |")
        print("|---|" + "---|" * (len(tables) + 1))
        for label, tree in trees.items():
            taus = []
            for name, rows in tables.items():
                cyc = acc = 0
                for tabs, s, e in rows:
                    c, n = tree_acceptance(tabs[drafter].T, tree, s, e)
                    cyc, acc = cyc + c, acc + int(n.sum())
                taus.append(f"{1 + acc / max(cyc, 1):.3f}")
            print(f"| {label} | " + " | ".join(taus) + f" | {max(map(len, tree))} |", flush=True)
    if a.write_trees:
        meta = {"fitted_on": f"{len(sets['calibration'])} calibration prompts ({a.calib} templated instructions + "
                             f"{a.calib} stdlib code requests, chat form), {a.new} greedy tokens each, float32",
                "command": "benchmarks/tree_bound_probe.py " + " ".join(argv if argv is not None else sys.argv[1:])}
        atomic_write_text(a.write_trees, json.dumps({"meta": meta, **fitted}, indent=1) + "\n")
        print(f"trees written to {a.write_trees}")


if __name__ == "__main__":
    main()
