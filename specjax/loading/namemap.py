"""The declarative map between checkpoint tensor names and our params layout.

``RULES`` say how each of our params is built from checkpoint *roles* (which combine, which roles);
``TABLES[(format, arch)]`` say which tensor name plays each role (and which role transform from
``transforms.py`` it needs). ``plan`` expands both for one config into concrete names and shapes;
``check`` asserts that a checkpoint holds exactly those tensors with those shapes.
Shapes are numpy order ``[out, in]`` (HF's; GGUF's reversed dims are flipped by the reader).
"""

from __future__ import annotations

import dataclasses

from specjax.config import ModelConfig
from specjax.errors import CheckpointError

# role -> checkpoint shape, as ModelConfig attribute names
ROLE_SHAPES: dict[str, tuple[str, ...]] = {
    "embed": ("vocab_size", "d_model"), "final_norm": ("d_model",), "lm_head": ("vocab_size", "d_model"),
    "attn_norm": ("d_model",), "q": ("q_dim", "d_model"), "k": ("kv_dim", "d_model"),
    "v": ("kv_dim", "d_model"), "q_bias": ("q_dim",), "k_bias": ("kv_dim",), "v_bias": ("kv_dim",),
    "o": ("d_model", "q_dim"), "mlp_norm": ("d_model",), "gate": ("ffn_dim", "d_model"),
    "up": ("ffn_dim", "d_model"), "down": ("d_model", "ffn_dim"),
}


@dataclasses.dataclass(frozen=True)
class Rule:
    target: str  # path in params; "layers.{i}.x" is params["layers"][i]["x"]
    combine: str  # key of transforms.COMBINES
    roles: tuple[str, ...]
    when: str = "always"  # "always" | "untied" | "qkv_bias"


RULES: tuple[Rule, ...] = (
    Rule("embed", "copy", ("embed",)),
    Rule("final_norm", "copy", ("final_norm",)),
    Rule("lm_head", "copy", ("lm_head",), when="untied"),
    Rule("layers.{i}.attn_norm", "copy", ("attn_norm",)),
    Rule("layers.{i}.wqkv", "concat", ("q", "k", "v")),
    Rule("layers.{i}.bqkv", "concat", ("q_bias", "k_bias", "v_bias"), when="qkv_bias"),
    Rule("layers.{i}.wo", "copy", ("o",)),
    Rule("layers.{i}.mlp_norm", "copy", ("mlp_norm",)),
    Rule("layers.{i}.w_gate_up", "concat", ("gate", "up")),
    Rule("layers.{i}.w_down", "copy", ("down",)),
)

_HF = {
    "embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight", "lm_head": "lm_head.weight",
    "attn_norm": "model.layers.{i}.input_layernorm.weight",
    "q": "model.layers.{i}.self_attn.q_proj.weight", "k": "model.layers.{i}.self_attn.k_proj.weight",
    "v": "model.layers.{i}.self_attn.v_proj.weight", "o": "model.layers.{i}.self_attn.o_proj.weight",
    "mlp_norm": "model.layers.{i}.post_attention_layernorm.weight",
    "gate": "model.layers.{i}.mlp.gate_proj.weight", "up": "model.layers.{i}.mlp.up_proj.weight",
    "down": "model.layers.{i}.mlp.down_proj.weight",
}
_HF_BIAS = {f"{r}_bias": _HF[r].replace(".weight", ".bias") for r in ("q", "k", "v")}
_GGUF = {
    "embed": "token_embd.weight", "final_norm": "output_norm.weight", "lm_head": "output.weight",
    "attn_norm": "blk.{i}.attn_norm.weight", "q": "blk.{i}.attn_q.weight", "k": "blk.{i}.attn_k.weight",
    "v": "blk.{i}.attn_v.weight", "o": "blk.{i}.attn_output.weight", "mlp_norm": "blk.{i}.ffn_norm.weight",
    "gate": "blk.{i}.ffn_gate.weight", "up": "blk.{i}.ffn_up.weight", "down": "blk.{i}.ffn_down.weight",
}
_GGUF_BIAS = {f"{r}_bias": _GGUF[r].replace(".weight", ".bias") for r in ("q", "k", "v")}

# (format, arch) -> role -> (tensor name template, role transform)
TABLES: dict[tuple[str, str], dict[str, tuple[str, str]]] = {
    ("hf", "llama"): {r: (n, "none") for r, n in _HF.items()},
    ("hf", "qwen2"): {r: (n, "none") for r, n in {**_HF, **_HF_BIAS}.items()},
    # llama.cpp permutes Llama's Q/K rows for adjacent-pair RoPE; Qwen2 GGUFs keep HF order.
    ("gguf", "llama"): {r: (n, {"q": "unpermute_q", "k": "unpermute_k"}.get(r, "none")) for r, n in _GGUF.items()},
    ("gguf", "qwen2"): {r: (n, "none") for r, n in {**_GGUF, **_GGUF_BIAS}.items()},
}

# Tensors a checkpoint may hold that we knowingly drop (name templates; "tied" only when tied).
IGNORED: dict[str, dict[str, tuple[str, ...]]] = {
    "hf": {"always": ("model.layers.{i}.self_attn.rotary_emb.inv_freq",), "tied": ("lm_head.weight",)},
    "gguf": {"always": (), "tied": ()},
}


@dataclasses.dataclass(frozen=True)
class Source:
    name: str
    transform: str  # key of transforms.ROLE_TRANSFORMS
    shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Step:
    target: tuple[str | int, ...]  # e.g. ("layers", 3, "wqkv")
    combine: str
    sources: tuple[Source, ...]


def _applies(rule: Rule, cfg: ModelConfig) -> bool:
    return {"always": True, "untied": not cfg.tie_embeddings, "qkv_bias": cfg.qkv_bias}[rule.when]


def plan(fmt: str, cfg: ModelConfig) -> list[Step]:
    """Every param of ``cfg`` with the checkpoint tensors (names, transforms, shapes) it is built from."""
    if (fmt, cfg.arch) not in TABLES:
        raise CheckpointError(f"no name map for format {fmt!r} and architecture {cfg.arch!r}; "
                              f"known: {sorted(TABLES)}")
    table = TABLES[(fmt, cfg.arch)]
    steps = []
    for rule in RULES:
        if not _applies(rule, cfg):
            continue
        layer_ids = range(cfg.n_layers) if "{i}" in rule.target else [None]
        for i in layer_ids:
            sources = []
            for role in rule.roles:
                template, transform = table[role]
                shape = tuple(getattr(cfg, a) for a in ROLE_SHAPES[role])
                sources.append(Source(template.format(i=i), transform, shape))
            path = tuple(int(p) if p.isdigit() else p for p in rule.target.format(i=i).split("."))
            steps.append(Step(path, rule.combine, tuple(sources)))
    return steps


def ignored_names(fmt: str, cfg: ModelConfig) -> set[str]:
    groups = IGNORED[fmt]["always"] + (IGNORED[fmt]["tied"] if cfg.tie_embeddings else ())
    return {t.format(i=i) for t in groups for i in range(cfg.n_layers)}


def _listing(names, limit: int = 8) -> str:
    names = sorted(names)
    more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def check(steps: list[Step], shapes: dict[str, tuple[int, ...]], ignored: set[str], where: str) -> None:
    """Raise CheckpointError unless ``shapes`` (name -> shape) holds exactly the planned tensors."""
    wanted = {s.name: s.shape for step in steps for s in step.sources}
    missing = wanted.keys() - shapes.keys()
    unexpected = shapes.keys() - wanted.keys() - ignored
    wrong = {n: (shapes[n], wanted[n]) for n in wanted.keys() & shapes.keys() if tuple(shapes[n]) != wanted[n]}
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing tensor(s): {_listing(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected tensor(s) (not in the name map): {_listing(unexpected)}")
    if wrong:
        problems.append("wrong shape(s): " + _listing(f"{n} has {tuple(g)}, config expects {e}"
                                                      for n, (g, e) in wrong.items()))
    if problems:
        raise CheckpointError(f"{where} does not match its config: " + "; ".join(problems))
