"""Keep the evaluation sets (MT-bench, HumanEval) out of the training data.

Texts are compared as lower-cased word sequences: a training text overlaps an eval text if they share
a run of ``n`` words (13 by default, as in GPT-3's contamination study), or if it contains the whole
eval text when that is shorter than ``n`` words. ``filter_overlap`` drops such training texts;
``assert_no_overlap`` is the final check on a corpus.
"""

from __future__ import annotations

import re

from specjax import prompts

_WORD = re.compile(r"\w+")


def words(text: str) -> tuple[str, ...]:
    return tuple(w.lower() for w in _WORD.findall(text))


def eval_texts() -> list[str]:
    """Every MT-bench turn and every HumanEval prompt and canonical solution (needs `specjax fetch`)."""
    out = [turn for q in prompts.mtbench(first_turn_only=False) for turn in q["turns"]]
    out += [t["prompt"] for t in prompts.humaneval()] + [t["canonical_solution"] for t in prompts.humaneval()]
    return out


class OverlapIndex:
    """All n-grams of the eval texts (shorter eval texts are indexed whole), and the grams' first two words, so
    that ``overlaps`` looks up only the windows that start like some gram (4.3x faster than trying every gram
    length at every word on corpus-like text, benchmarks/corpus_tail_probe.py; a corpus of 122k texts is checked
    twice)."""

    def __init__(self, texts: list[str], n: int = 13):
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.n = n
        self.grams: dict[int, set[tuple[str, ...]]] = {}
        for text in texts:
            w = words(text)
            if not w:
                continue
            k = min(n, len(w))
            self.grams.setdefault(k, set()).update(w[i:i + k] for i in range(len(w) - k + 1))
        starts: dict[tuple[str, ...], set[int]] = {}  # a gram's first two words (one for 1-word grams) -> lengths
        for k, grams in self.grams.items():
            for g in grams:
                starts.setdefault(g[:2], set()).add(k)
        self._starts = {head: tuple(sorted(ks)) for head, ks in starts.items()}
        self._heads = (1, 2) if 1 in self.grams else (2,)

    def overlaps(self, text: str) -> bool:
        w = words(text)
        for i in range(len(w)):
            for h in self._heads:
                for k in self._starts.get(w[i:i + h], ()):
                    if w[i:i + k] in self.grams[k]:
                        return True
        return False

    def overlaps_naive(self, text: str) -> bool:
        """The definition, every gram length at every word (the reference ``overlaps`` is tested against)."""
        w = words(text)
        return any(w[i:i + k] in grams for k, grams in self.grams.items() for i in range(len(w) - k + 1))


def filter_overlap(texts: list[str], index: OverlapIndex) -> tuple[list[int], list[int]]:
    """(indices kept, indices dropped) of ``texts``."""
    kept, dropped = [], []
    for i, t in enumerate(texts):
        (dropped if index.overlaps(t) else kept).append(i)
    return kept, dropped


def assert_no_overlap(texts: list[str], index: OverlapIndex) -> None:
    bad = [i for i, t in enumerate(texts) if index.overlaps(t)]
    if bad:
        raise AssertionError(f"{len(bad)} training text(s) share a {index.n}-word run with MT-bench/HumanEval, "
                             f"e.g. {texts[bad[0]][:200]!r}")
