"""Settings of ``train_smollm2.py``: the real run (one Hopper GPU, ~15 minutes over device calls) and two
CPU smoke runs."""

from __future__ import annotations

import dataclasses

from training.loop import TrainConfig
from training.make_corpus import CorpusSpec


@dataclasses.dataclass(frozen=True)
class Preset:
    target: str  # "smollm2" (the fetched GGUF) or "tiny" (random, training/tiny.py)
    dtype: str  # target weights and compute: "bfloat16" on GPU, "float32" on CPU
    corpus: CorpusSpec
    eagle3: TrainConfig
    medusa: TrainConfig
    draft: TrainConfig
    draft_vocab: int = 8192  # EAGLE-3 draft vocabulary (h100: 12288, a 24.5 MB bf16 head, under the 25 MB cap)
    ttt_steps: int = 7
    medusa_heads: int = 4
    draft_layers: int = 2
    draft_teacher_cache: bool = False  # draft model: the target's hidden states computed once (teacher_cache.py)
    eval_mtbench: int = 80
    eval_humaneval: int = 80
    eval_max_prompt: int = 512
    eval_max_new: int = 128
    num_draft: int = 4  # K of the tau check (Medusa: at most its head count)
    heldout_rows: int = 512  # corpus rows kept out of training, scored at the end of each stage


def _tc(steps, batch, lr, warmup, dtype, log_every=25, ckpt_every=500, clip=0.5, max_seconds=None):
    return TrainConfig(steps=steps, batch_size=batch, lr=lr, warmup_steps=warmup, clip_norm=clip, compute_dtype=dtype,
                       log_every=log_every, ckpt_every=ckpt_every, max_seconds=max_seconds)


PRESETS = {
    # One Hopper GPU, 10-minute device calls with --time-budget (benchmarks/device_heads.sh): corpus (~210 s on an
    # H200, ~430 s on an H100, which leaves that call little else) + EAGLE-3 in the first, the rest of EAGLE-3 in the
    # second, Medusa / the draft model in further calls (a stage cut by its cap resumes from its checkpoint).
    "h100": Preset(
        target="smollm2", dtype="bfloat16",
        corpus=CorpusSpec(n_chat=8192, n_code=4096, n_templated=12288, n_code_raw=4096, temperatures=(0.0, 0.7),
                          max_new_tokens=256, max_prompt_tokens=256, seq_len=512, gen_batch=1024),
        eagle3=_tc(7500, 32, 8e-4, 200, "bfloat16"),
        # medusa-own (one full-vocabulary LM head per head, measured, not shipped) trains with the same settings; its
        # steps cost more than the shared head's 65 ms (H200), hence a cap above the shared head's ~130 s
        medusa=_tc(2000, 32, 1e-3, 80, "bfloat16", max_seconds=300),
        draft=_tc(6000, 32, 5e-4, 200, "bfloat16"),  # alone in a call after the corpus: ~250 s of --time-budget
        draft_vocab=12288, eval_max_new=128, num_draft=7),
    # The real target on CPU with tiny settings: the same code path, minutes.
    "cpu-smollm2": Preset(
        target="smollm2", dtype="float32",
        corpus=CorpusSpec(n_chat=4, n_code=4, n_templated=4, n_code_raw=4, temperatures=(0.0, 0.7), max_new_tokens=24,
                          max_prompt_tokens=160,
                          seq_len=192, gen_batch=8, magpie_max_new=48),
        eagle3=_tc(4, 2, 1e-3, 1, "float32", log_every=1, ckpt_every=2),
        medusa=_tc(4, 2, 1e-3, 1, "float32", log_every=1, ckpt_every=2),
        draft=_tc(4, 2, 1e-3, 1, "float32", log_every=1, ckpt_every=2),
        eval_mtbench=2, eval_humaneval=2, eval_max_prompt=256, eval_max_new=16, num_draft=3, heldout_rows=4),
    # A random tiny target and a byte tokenizer: everything end to end in well under a minute (tests).
    "cpu-tiny": Preset(
        target="tiny", dtype="float32",
        corpus=CorpusSpec(n_chat=12, n_code=12, temperatures=(0.0, 0.7), max_new_tokens=24, max_prompt_tokens=320,
                          seq_len=352, gen_batch=16, magpie_max_new=32),
        eagle3=_tc(6, 4, 3e-3, 1, "float32", log_every=1, ckpt_every=3),
        medusa=_tc(6, 4, 3e-3, 1, "float32", log_every=1, ckpt_every=3),
        draft=_tc(6, 4, 3e-3, 1, "float32", log_every=1, ckpt_every=3),
        draft_vocab=64, ttt_steps=3, medusa_heads=3, eval_mtbench=2, eval_humaneval=2, eval_max_prompt=1024,
        eval_max_new=16, num_draft=3, heldout_rows=4),
}

# "h100" with more varied prompts (benchmarks/NOTES.md item 24): Magpie queries started by random request openers, a
# third of the templated instructions (a new draw repeats trained templates and topics, which the head learns by
# heart), and code prompts from specjax's dependencies' functions besides the standard library's.
PRESETS["h100-diverse"] = dataclasses.replace(PRESETS["h100"], corpus=dataclasses.replace(
    PRESETS["h100"].corpus, n_chat=16384, n_code=8192, n_templated=4096, n_code_raw=8192, magpie_openers=True,
    code_packages=("jax", "flax", "optax", "orbax.checkpoint", "chex", "matplotlib", "jinja2", "tqdm")))

# "h100-diverse" scaled for a machine of two Hopper GPUs (benchmarks/NOTES.md item 29): 2.5x the Magpie queries (the
# other prompt kinds are near their pools' sizes), responses in fixed-width batches (one compiled program per
# temperature), and 13000 EAGLE-3 steps instead of 7500, so that the epochs stay ~3.4 on the ~1.7x larger corpus. The
# corpus generates on every local GPU (training/pool.py) and training splits each batch over them (TrainConfig.devices).
# Item 29's run of it (cut to --steps 6500) gave a head equal to the h100-diverse one; the full 13000 steps (item 31,
# two H200s, ~12 min of training) gave the shipped head, +0.2 tau on MT-bench and HumanEval.
PRESETS["large"] = dataclasses.replace(PRESETS["h100-diverse"], corpus=dataclasses.replace(
    PRESETS["h100-diverse"].corpus, n_chat=40960, fixed_width=True), eagle3=_tc(13000, 32, 8e-4, 200, "bfloat16"),
    # the draft model at the same passes per example as h100's 6000 steps on its 54.6k examples (benchmarks/NOTES.md
    # item 40; one H200: ~33 steps/s, so corpus + 13000 steps take two device calls). The shipped draft model is this
    # preset's draft stage at --steps 22000 --teacher-cache (~54 steps/s), in two calls on one machine (corpus + 1300
    # steps, then the rest; its card has the tau)
    draft=_tc(13000, 32, 5e-4, 200, "bfloat16"))
