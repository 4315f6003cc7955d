"""Why does the shipped EAGLE-3 head draft MT-bench worse than its training kinds of text?

The head's step-0 accuracy on the target's greedy MT-bench responses (0.52) sits far under its held-out
corpus figure (0.74). Two explanations predict different things:
  * the text is harder for any drafter: the target is less sure of its own next token there, so at equal
    target confidence the head is as accurate on MT-bench as on training-like text, and MT-bench just
    has more low-confidence positions; more training data of the same kinds would not close the gap;
  * the head has not learnt MT-bench's kinds of text: at equal target confidence it is less accurate
    there, and data closer to them would help.
So, for MT-bench prompts and for unseen prompts of the corpus's kinds, all answered greedily by the target:
Magpie chat queries sampled with another seed, and code requests built like the corpus's stdlib ones but
from numpy's functions (the corpus used every stdlib function, and the h100-diverse preset's package
list leaves numpy out); a fresh draw of templated instructions is shown apart and not used for the
comparison, since it can repeat a trained template and topic. Per response position: the
target confidence (the target's probability of its own greedy token) and whether the head's step-0
draft is that token, bucketed by confidence. Float32, any backend.

    PYTHONPATH=. python3 benchmarks/eagle3_gap_probe.py [--n 24] [--new 128] [--head shipped --head EXPORT_DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax import model
from specjax.heads import eagle3_io, shipped
from training import corpus, instructions
from training.eagle3_ttt import greedy_drafts
from training.evaluate import heldout_prompts

EDGES = (0.0, 0.3, 0.5, 0.7, 0.9, 0.98, 1.01)


def measure(tp, cfg, heads: dict, prompts, new: int) -> tuple[np.ndarray, dict, dict]:
    """Per new-token position: target confidence, and per head its step-0 hits and the token's draft-vocabulary
    membership."""
    ref = specjax.generate(tp, cfg, prompts, max_new_tokens=new, eos_token_ids=()).output_ids
    in_vocab = {h: np.zeros(cfg.vocab_size, bool) for h in heads}
    for h, (_, dp) in heads.items():
        in_vocab[h][np.asarray(dp["draft_ids"])] = True
    conf, hit, inv = [], {h: [] for h in heads}, {h: [] for h in heads}
    for p, out in zip(prompts, ref):
        text = np.asarray(list(p) + list(out), np.int32)
        logits, _, _ = model.forward(tp, cfg, jnp.asarray(text)[None])
        probs = np.asarray(jax.nn.softmax(logits[0], -1))
        rows = np.arange(len(p) - 1, len(text) - 2)  # step 0 at row t guesses text[t + 2], the target's argmax at t + 1
        conf.append(probs[rows + 1, text[rows + 2]])
        for h, (ecfg, dp) in heads.items():
            hit[h].append(greedy_drafts(tp, ecfg, dp, text, 1)[0][rows] == text[rows + 2])
            inv[h].append(in_vocab[h][text[rows + 2]])
    cat = lambda d: {h: np.concatenate(v) for h, v in d.items()}
    return np.concatenate(conf), cat(hit), cat(inv)


def load_head(spec: str, cfg, tp):
    if spec == "shipped":
        return shipped.load("smollm2-135m-instruct", "eagle3", cfg, tp, dtype=jnp.float32)
    ecfg, params, ids = eagle3_io.load_eagle3(spec, target=cfg, dtype=jnp.float32)
    return ecfg, {"params": params, "draft_ids": ids}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=24, help="prompts per set")
    ap.add_argument("--new", type=int, default=128, help="new tokens per prompt")
    ap.add_argument("--seed", type=int, default=12345, help="seed of the Magpie queries (the corpus used 0)")
    ap.add_argument("--code-root", default=str(Path(np.__file__).parent), help="sources of the code requests")
    ap.add_argument("--head", action="append", help="'shipped' (default) or an exported EAGLE-3 folder; repeatable")
    a = ap.parse_args(argv)
    lm = specjax.load("smollm2-135m-instruct", dtype="float32")
    tok, cfg, tp = lm.tokenizer, lm.cfg, lm.params
    heads = {h: load_head(h, cfg, tp) for h in a.head or ["shipped"]}
    mt = heldout_prompts(tok, 80, 0, 512)["mtbench"]
    half = a.n // 2
    like = corpus.magpie_prompts(tp, cfg, tok, half, batch_size=4 * half, seed=a.seed)
    like += corpus.code_prompts(a.n - half, seed=a.seed, root=a.code_root)
    sets = {"mtbench": mt[::max(1, len(mt) // a.n)][:a.n],  # every k-th: all eight categories
            "corpus-kinds": [corpus.chat_ids(tok, t) for t in like],
            # a fresh draw of templated instructions: may repeat a trained template + topic, so the head may have
            # seen these very responses; shown to read the held-out corpus figure, not used for the reweighting
            "templated": [corpus.chat_ids(tok, t) for t in instructions.instructions(a.n, seed=a.seed)]}
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}; {a.n} prompts per set, {a.new} greedy new tokens, "
          f"float32; EAGLE-3 step 0 (the draft right after the target's features)")
    measured = {name: measure(tp, cfg, heads, prompts, a.new) for name, prompts in sets.items()}
    buckets = list(zip(EDGES[:-1], EDGES[1:]))
    in_bucket = {name: [(conf >= lo) & (conf < hi) for lo, hi in buckets] for name, (conf, _, _) in measured.items()}
    for h in heads:
        print(f"\n== head: {h}")
        for name, (conf, hit, inv) in measured.items():
            print(f"[{name}] {len(conf)} positions: step-0 accuracy {hit[h].mean():.3f}, mean target confidence "
                  f"{conf.mean():.3f}, outside the draft vocabulary {1 - inv[h].mean():.3f}")
        print("target confidence | " + " | ".join(f"{n}: share, head accuracy" for n in measured))
        for b, (lo, hi) in enumerate(buckets):
            cells = [f"{m[b].mean():.3f}, {measured[n][1][h][m[b]].mean():.3f} (n={m[b].sum()})" if m[b].any() else "-"
                     for n, m in in_bucket.items()]
            print(f"[{lo:.2f}, {min(hi, 1.0):.2f}) | " + " | ".join(cells))
        # MT-bench accuracy if its positions had the corpus kinds' accuracy at each confidence level (reweighting)
        m_mt, m_co, h_co = in_bucket["mtbench"], in_bucket["corpus-kinds"], measured["corpus-kinds"][1][h]
        expect = sum(m_mt[b].mean() * h_co[m_co[b]].mean()
                     for b in range(len(buckets)) if m_mt[b].any() and m_co[b].any())
        print(f"MT-bench step-0 accuracy {measured['mtbench'][1][h].mean():.3f}; with the corpus kinds' accuracy at "
              f"each confidence level it would be {expect:.3f}; corpus kinds {h_co.mean():.3f}", flush=True)

if __name__ == "__main__":
    main()
