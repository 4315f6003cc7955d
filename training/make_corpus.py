"""Build (or reuse) the self-distillation corpus: prompts -> eval-overlap filter -> target responses
(greedy and sampled) -> filter again -> token shards + manifest (+ ``prompts.jsonl`` for audit)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from specjax.config import ModelConfig
from specjax.files import atomic_write_text
from specjax.tokenizer import Tokenizer
from training import corpus, data, decontam, instructions, parts
from training.pool import DevicePool


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
    n_chat: int = 2048  # Magpie-style chat prompts
    n_code: int = 1024  # stdlib signature + docstring prompts (chat)
    n_templated: int = 0  # templated instructions (training/instructions.py)
    n_code_raw: int = 0  # stdlib stubs continued as plain text (no chat template)
    temperatures: tuple[float, ...] = (0.0, 0.7)  # one response per prompt per temperature
    max_new_tokens: int = 256
    max_prompt_tokens: int = 256
    seq_len: int = 512
    gen_batch: int = 256
    magpie_max_new: int = 96
    magpie_openers: bool = False  # each Magpie row starts its query with a random ``corpus.OPENERS`` entry
    code_packages: tuple[str, ...] = ()  # installed packages whose functions join the stdlib's as code prompts
    seed: int = 0
    fixed_width: bool = False  # answer prompts padded to max_prompt_tokens in full batches: one compile per temperature

    def to_json(self) -> dict:
        """The spec as JSON (a corpus on disk records it); fields added later are left out while they
        hold their default, so specs written before them still match."""
        later = {"fixed_width": False}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()
                if k not in later or v != later[k]}


def build_corpus(tp: dict, cfg: ModelConfig, tok: Tokenizer, spec: CorpusSpec, folder: str | Path,
                 eval_texts: list[str] | None, log=print, devices: int | None = None) -> tuple[data.TokenDataset, dict]:
    """Generate the corpus into ``folder`` unless a complete one with the same spec is already there.

    ``devices``: how many local devices generate at once (default: all; ``training/pool.py``). The pieces'
    seeds do not depend on it, so neither does the corpus.

    ``eval_texts`` (MT-bench + HumanEval, see ``decontam.eval_texts``) are kept out: overlapping
    prompts and examples are dropped and the result is asserted clean. ``None`` skips the check
    (tiny synthetic runs only); the manifest records which happened.
    """
    folder = Path(folder)
    if (folder / "manifest.json").is_file():
        ds, manifest = data.load_shards(folder)
        if manifest["meta"].get("spec") == spec.to_json():
            log(f"corpus: reusing {folder} ({len(ds)} examples)")
            return ds, manifest
    t0 = time.perf_counter()
    pool = DevicePool(tp, devices)
    store = parts.PartStore(folder / "parts", spec.to_json(), log=log)  # finished pieces of an earlier, cut-off run
    chat = store.texts("magpie", corpus.magpie_prompts, tp, cfg, tok, spec.n_chat, max_new_tokens=spec.magpie_max_new,
                       batch_size=spec.gen_batch, seed=spec.seed,
                       openers=corpus.OPENERS if spec.magpie_openers else (), pool=pool)
    code = corpus.code_prompts(spec.n_code, seed=spec.seed, packages=spec.code_packages)
    templated = instructions.instructions(spec.n_templated, seed=spec.seed)
    raw = corpus.code_completions(spec.n_code_raw, seed=spec.seed, packages=spec.code_packages)
    log(f"corpus: {len(chat)} Magpie + {len(templated)} templated + {len(code)} code chat prompts, {len(raw)} raw code "
        f"stubs in {time.perf_counter() - t0:.0f}s")
    index = decontam.OverlapIndex(eval_texts or [])
    prompts, dropped_prompts = {}, []
    for name, texts in (("chat", chat + templated + code), ("raw", raw)):
        kept, dropped = decontam.filter_overlap(texts, index)
        prompts[name], dropped_prompts = [texts[i] for i in kept], dropped_prompts + dropped
    jobs, step = [], spec.gen_batch * parts.PART_BATCHES  # (piece name, respond_ids arguments)
    for i, temperature in enumerate(spec.temperatures):
        for name, ps in prompts.items():
            ids = corpus.prompt_ids(tok, ps, max_prompt_tokens=spec.max_prompt_tokens, chat=name == "chat")
            seed = spec.seed + 1000 * (i + 1) + (name == "raw") * 500
            jobs += [(f"t{i}_{name}_{j:04d}", dict(ids=ids[a:a + step], temperature=temperature, seed=seed,
                                                   first_batch=j * parts.PART_BATCHES))
                     for j, a in enumerate(range(0, len(ids), step))]
    pad_to = spec.max_prompt_tokens if spec.fixed_width else 0
    pieces = pool.map(lambda params, job: store.pairs(
        job[0], corpus.respond_ids, params, cfg, tok, max_new_tokens=spec.max_new_tokens, batch_size=spec.gen_batch,
        pad_to=pad_to, **job[1]), jobs)
    n_devices = len(pool)
    del pool  # its copies of the target's params
    examples = [pair for piece in pieces for pair in piece]
    texts = tok.decode_batch([p + r for p, r in examples])
    kept, dropped_examples = decontam.filter_overlap(texts, index)
    examples = [examples[i] for i in kept]
    decontam.assert_no_overlap([texts[i] for i in kept], index)
    ds = data.pack_examples(examples, spec.seq_len)
    meta = {"spec": spec.to_json(), "num_chat_prompts": len(chat), "num_code_prompts": len(code),
            "num_templated_prompts": len(templated), "num_raw_code_prompts": len(raw),
            "code_pool": len(corpus.code_pool(packages=spec.code_packages)),
            "num_examples": len(examples), "response_tokens": int(ds.weight_NT.sum()),
            "eval_overlap": {"checked": eval_texts is not None, "method": f"{index.n}-word overlap",
                             "num_eval_texts": len(eval_texts or []), "dropped_prompts": len(dropped_prompts),
                             "dropped_examples": len(dropped_examples)},
            "seconds": round(time.perf_counter() - t0, 1),  # this invocation's
            "generate_seconds": round(store.generate_seconds, 1),  # summed over pieces (so over devices too),
            #                                                         across resumed invocations
            "devices": n_devices,
            "pieces": {"made": store.made, "reused": store.reused}}
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"kind": kind, "prompt": p} for kind, ps in (("chat", chat), ("templated", templated), ("code", code),
                                                          ("code-raw", raw)) for p in ps]
    atomic_write_text(folder / "prompts.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    data.write_shards(folder, ds, meta=meta)
    log(f"corpus: {len(examples)} examples, {meta['response_tokens']} response tokens in {meta['seconds']}s")
    return data.load_shards(folder)
