"""The corpus build's CPU tail (``training/make_corpus.py`` after generation), on this host's CPU: decoding every
example one text at a time (as ``Tokenizer.decode`` did before session 19, with a ``vocab_size`` lookup per id,
and as it does now) vs ``Tokenizer.decode_batch``, and the MT-bench/HumanEval overlap filter (the index's first-words lookup and the plain definition). Median of 3 runs.

    python benchmarks/corpus_tail_probe.py [--texts 12000]     # needs `specjax fetch` (SmolLM2's tokenizer)

The texts are slices of 100-380 tokens of this repository's README (the corpus's examples are ~190 tokens).
Writes results/corpus_tail_<host>_<date>.{json,md}.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from common import header, md_table, write_results
from specjax import assets
from specjax.tokenizer import Tokenizer
from training import decontam


def timed(fn, repeats: int = 3):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times)


def former_decode(tok: Tokenizer, ids: list[int]) -> str:
    """``Tokenizer.decode`` as it was: the range check asked the backend for the vocabulary size once per id."""
    if bad := [i for i in ids if not 0 <= i < tok.vocab_size]:
        raise ValueError(f"token ids {bad[:5]} are outside the vocabulary")
    return tok.backend.decode(ids, skip_special_tokens=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--texts", type=int, default=12000)
    args = p.parse_args(argv)
    tok = Tokenizer.from_gguf(assets.home() / assets.MODELS["smollm2-135m-instruct"].dest)
    readme = tok.encode((Path(__file__).resolve().parents[1] / "README.md").read_text())
    rng = random.Random(0)
    seqs = []
    for _ in range(args.texts):
        a = rng.randrange(len(readme) - 400)
        seqs.append(readme[a:a + rng.randrange(100, 380)])
    former, t_former = timed(lambda: [former_decode(tok, s) for s in seqs])
    one, t_one = timed(lambda: [tok.decode(s) for s in seqs])
    batch, t_batch = timed(lambda: tok.decode_batch(seqs))
    assert batch == one == former, "the three decodes differ"
    index = decontam.OverlapIndex(decontam.eval_texts())
    _, t_filter = timed(lambda: decontam.filter_overlap(batch, index))
    _, t_naive = timed(lambda: [t for t in batch if index.overlaps_naive(t)])
    rows = [{"step": "former decode (vocab_size per id), one text at a time", "seconds": t_former},
            {"step": "decode, one text at a time", "seconds": t_one},
            {"step": "Tokenizer.decode_batch", "seconds": t_batch},
            {"step": "decontam.filter_overlap", "seconds": t_filter},
            {"step": "the same with OverlapIndex.overlaps_naive (every gram length at every word)", "seconds": t_naive}]
    h = {**header(), "device": "cpu", "texts": len(seqs), "tokens": sum(map(len, seqs))}
    md = (f"# Corpus CPU tail, {h['texts']} texts / {h['tokens']} tokens, {h['device_kind']}, jax {h['jax']}, "
          f"{h['date']}\n\n`{h['command']}`\n\n" + md_table(rows, ["step", "seconds"]))
    print(md)
    write_results(f"corpus_tail_cpu_{h['date']}", {**h, "rows": rows}, md)


if __name__ == "__main__":
    main()
