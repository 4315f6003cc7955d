"""metrics.py: vLLM's definitions on hand-made counters."""

import numpy as np
import pytest

from specjax import metrics


def test_acceptance_metrics_follow_vllm_definitions():
    # two sequences, K = 2: 2 + 3 cycles; position 0 accepted in 2 + 1 cycles, position 1 in 1 + 0
    stats = metrics.SpecStats(num_draft=2, cycles_B=np.array([2, 3]), accepted_BK=np.array([[2, 1], [1, 0]]),
                              new_tokens_B=np.array([5, 3]))
    m = metrics.summarize(stats, ttft_s=1.0, seconds=3.0)
    assert m["num_cycles"] == 5 and m["num_accepted"] == 4 and m["num_drafted"] == 10
    assert m["acceptance_per_position"] == pytest.approx([3 / 5, 1 / 5])
    assert m["mean_accepted"] == pytest.approx(1 + 4 / 5)  # tau: bonus included
    assert m["draft_acceptance_rate"] == pytest.approx(4 / 10)
    first, second = m["per_sequence"]
    assert first["mean_accepted"] == pytest.approx(1 + 3 / 2) and first["acceptance_per_position"] == [1.0, 0.5]
    assert second["acceptance_per_position"] == pytest.approx([1 / 3, 0.0])
    # latency: decode time (2 s) apportioned by cycles: sequence 0 was live 2 of 3 loop iterations
    assert m["ttft_s"] == 1.0 and m["tokens_per_s"] == pytest.approx(8 / 3)
    assert first["itl_s"] == pytest.approx(2.0 * 2 / 3 / 4) and second["itl_s"] == pytest.approx(2.0 / 2)
    assert m["itl_s"] == pytest.approx((first["itl_s"] + second["itl_s"]) / 2)


def test_drafts_proposed_when_a_drafter_stops_early():
    # K = 3, but the drafter proposed 4 of 6 and 2 of 3 possible drafts (min_confidence)
    stats = metrics.SpecStats(num_draft=3, cycles_B=np.array([2, 1]), accepted_BK=np.array([[2, 1, 0], [1, 0, 0]]),
                              new_tokens_B=np.array([5, 2]), drafted_B=np.array([4, 2]))
    m = metrics.summarize(stats, ttft_s=None, seconds=1.0)
    assert m["num_drafted"] == 6 and m["mean_drafted"] == pytest.approx(2.0)
    assert m["draft_acceptance_rate"] == pytest.approx(4 / 6) and m["mean_accepted"] == pytest.approx(1 + 4 / 3)
    assert [r["num_drafted"] for r in m["per_sequence"]] == [4, 2]
    assert [r["draft_acceptance_rate"] for r in m["per_sequence"]] == pytest.approx([3 / 4, 1 / 2])


def test_no_cycles_and_single_tokens():
    stats = metrics.SpecStats(num_draft=3, cycles_B=np.array([0]), accepted_BK=np.zeros((1, 3), int),
                              new_tokens_B=np.array([1]))
    m = metrics.summarize(stats, ttft_s=0.5, seconds=0.5)
    assert m["num_cycles"] == 0 and m["mean_accepted"] == 0.0 and m["acceptance_per_position"] == [0.0] * 3
    assert m["itl_s"] == 0.0 and m["tokens_per_s"] == pytest.approx(2.0)


def test_untimed_prefill_reports_no_ttft_or_itl():
    # prefill and loop in one program (speculative_generate's default): only the call's wall time is known
    stats = metrics.SpecStats(num_draft=2, cycles_B=np.array([2, 4]), accepted_BK=np.array([[2, 1], [1, 0]]),
                              new_tokens_B=np.array([5, 3]))
    m = metrics.summarize(stats, ttft_s=None, seconds=2.0)
    assert m["ttft_s"] is None and m["itl_s"] is None and m["tokens_per_s"] == pytest.approx(4.0)
    first, second = m["per_sequence"]
    assert first["itl_s"] is None and first["tokens_per_s"] == pytest.approx(5 / (2.0 * 2 / 4))
    assert second["tokens_per_s"] == pytest.approx(3 / 2.0)


def test_per_sequence_rows_follow_the_definitions():
    """``summarize``'s per-sequence rows, computed over the batch at once, row by row against the
    definitions in the module doc (sequences with 0 cycles and 1 token included)."""
    rng = np.random.default_rng(0)
    cycles = rng.integers(0, 9, 64)
    cycles[:3] = 0
    accepted = np.minimum(rng.integers(0, 9, (64, 3)), cycles[:, None])
    new = np.maximum(1, cycles * 2 + rng.integers(0, 3, 64))
    for ttft in (0.25, None):
        m = metrics.summarize(metrics.SpecStats(3, cycles, accepted, new), ttft_s=ttft, seconds=1.5)
        for b, row in enumerate(m["per_sequence"]):
            c, a, n = int(cycles[b]), [int(x) for x in accepted[b]], int(new[b])
            decode = (1.5 - (ttft or 0.0)) * (c / cycles.max())
            assert row == {"num_cycles": c, "mean_accepted": 1 + sum(a) / c if c else 0.0,
                           "acceptance_per_position": [x / max(c, 1) for x in a],
                           "draft_acceptance_rate": sum(a) / max(3 * c, 1), "num_accepted": sum(a),
                           "num_drafted": 3 * c, "mean_drafted": 3.0 if c else 0.0,
                           "new_tokens": n, "itl_s": decode / max(n - 1, 1) if ttft else None,
                           "tokens_per_s": n / max((ttft or 0.0) + decode, 1e-9)}, b
