"""Greedy identity on the real SmolLM2-135M-Instruct (fp32): every drafter's output equals AR greedy
on MT-bench first turns (10 short ones from 7 categories here, all 80 with ``-m slow``) and HumanEval prompts.

Skips unless `specjax fetch` has put the GGUF, MT-bench and HumanEval in the cache. The draft model
is SmolLM2's first 8 layers as a separate model (same vocabulary, its own cache).
"""

import pytest

from specjax import prompts
from specjax.errors import AssetsMissing
from specjax.generate import generate
from specjax.speculative import DraftModel, LayerSkip, NGram, speculative_generate

MAX_NEW = 24
METHODS = [("ngram", 4), ("layerskip", 3), ("draft", 3)]

pytestmark = pytest.mark.assets


@pytest.fixture(scope="module")
def lm():
    import specjax
    try:
        return specjax.load("smollm2-135m-instruct", dtype="float32")
    except AssetsMissing as e:
        pytest.skip(f"SmolLM2 GGUF not fetched ({e})")


def _prompt_set(lm, name: str, limit: int | None):
    try:
        if name == "mtbench":
            qs = prompts.mtbench()
            return [lm.encode(q["prompt"], chat=True) for q in (qs if limit is None else _short_turns(lm, qs, limit))]
        tasks = sorted(prompts.humaneval(), key=lambda t: len(t["prompt"]))[:limit]  # the shortest: fast on CPU
        return [lm.tokenizer.encode(t["prompt"]) for t in tasks]
    except AssetsMissing as e:
        pytest.skip(f"{name} prompts not fetched ({e})")


def _short_turns(lm, qs, n: int, width: int = 64):
    """n first turns of at most ``width`` tokens: the shortest of each category that has one (extraction's are
    188+ tokens), then the shortest of the rest. The batch's prompts stay one 64-wide bucket (the first 10
    turns padded it to 128, doubling the CPU prefill)."""
    length = {q["id"]: len(lm.encode(q["prompt"], chat=True)) for q in qs}
    fits = sorted((q for q in qs if length[q["id"]] <= width), key=lambda q: length[q["id"]])
    picked = [next(q for q in fits if q["category"] == c) for c in dict.fromkeys(q["category"] for q in fits)]
    return picked + [q for q in fits if q not in picked][:n - len(picked)]


def _drafter(lm, method):
    if method == "ngram":
        return NGram(1, 3), None
    if method == "layerskip":
        return LayerSkip(lm.cfg.n_layers // 2), None
    return DraftModel(lm.cfg.replace(n_layers=8)), {**lm.params, "layers": lm.params["layers"][:8]}


def _diverged(lm, ids) -> dict[str, list[int]]:
    """Per method, the indices of prompts whose output differs from AR greedy."""
    ar = generate(lm.params, lm.cfg, ids, max_new_tokens=MAX_NEW).output_ids
    out = {}
    for method, K in METHODS:
        drafter, dp = _drafter(lm, method)
        res = speculative_generate(lm.params, lm.cfg, ids, drafter, dp, num_draft=K, max_new_tokens=MAX_NEW)
        out[method] = [i for i, (a, b) in enumerate(zip(ar, res.output_ids)) if a != b]
    return out


@pytest.fixture(scope="module")
def mixed(lm):
    """10 short MT-bench chat prompts + the 4 shortest HumanEval prompts in one ragged batch (one compile per method)."""
    mt, he = _prompt_set(lm, "mtbench", 10), _prompt_set(lm, "humaneval", 4)
    return len(mt), _diverged(lm, mt + he)


def test_mtbench_first_turns_equal_autoregressive(mixed):
    n_mt, diverged = mixed
    assert {m: [i for i in d if i < n_mt] for m, d in diverged.items()} == {m: [] for m, _ in METHODS}


def test_humaneval_prompts_equal_autoregressive(mixed):
    n_mt, diverged = mixed
    assert {m: [i - n_mt for i in d if i >= n_mt] for m, d in diverged.items()} == {m: [] for m, _ in METHODS}


@pytest.mark.slow
def test_all_mtbench_first_turns_equal_autoregressive(lm, request):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("slow (all 80 MT-bench prompts): run with -m slow")
    ids = _prompt_set(lm, "mtbench", None)
    for start in range(0, len(ids), 16):
        diverged = _diverged(lm, ids[start:start + 16])
        assert diverged == {m: [] for m, _ in METHODS}, f"batch starting at prompt {start}"
