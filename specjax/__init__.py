"""specjax: exact speculative decoding in JAX.

    import specjax
    lm = specjax.load("smollm2-135m-instruct")            # after `specjax fetch`
    ids = lm.encode("Name three primes.", chat=True)
    out = specjax.generate(lm.params, lm.cfg, [ids], max_new_tokens=64)
    print(lm.decode(out.output_ids[0]))

    from specjax.speculative import drafters
    res = specjax.speculative_generate(lm.params, lm.cfg, [ids], drafters.NGram(), num_draft=4)
    print(res.metrics()["mean_accepted"])
"""

from specjax.cache import KVCache, init_cache
from specjax.config import ModelConfig
from specjax.generate import GenerateResult, generate
from specjax.model import forward, init_params
from specjax.pipeline import LoadedModel, load
from specjax.sampling import SamplingParams
from specjax.speculative.engine import SpecResult, speculative_generate

__all__ = ["KVCache", "init_cache", "ModelConfig", "GenerateResult", "generate", "forward", "init_params",
           "LoadedModel", "load", "SamplingParams", "SpecResult", "speculative_generate"]
