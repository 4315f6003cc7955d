"""Speculative decoding: draft K tokens, verify them in one target forward, accept exactly.

    from specjax.speculative import speculative_generate, drafters
    res = speculative_generate(params, cfg, prompts, drafters.NGram(1, 3), num_draft=4)
    res.output_ids, res.metrics()["mean_accepted"]
"""

from specjax.speculative import drafters
from specjax.speculative.drafters import DraftModel, Drafter, LayerSkip, NGram
from specjax.speculative.engine import MAX_NUM_DRAFT, SpecResult, run, speculative_generate

__all__ = ["DraftModel", "Drafter", "LayerSkip", "MAX_NUM_DRAFT", "NGram", "SpecResult", "drafters", "run",
           "speculative_generate"]
