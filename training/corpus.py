"""A self-distillation corpus made by the target itself (no dataset download).

* Chat prompts, Magpie-style: the instruct model gets only its chat template's user-turn prefix
  (e.g. ``<|im_start|>system...<|im_end|>\\n<|im_start|>user\\n``) and samples the query.
* Code prompts cut from the local Python standard library: the signature + docstring of public
  top-level functions (``ast``), wrapped in a short instruction.
* Responses: the target answers every prompt through its chat template, greedily and at T=0.7.
"""

from __future__ import annotations

import ast
import functools
import random
import sysconfig
from pathlib import Path

from specjax.config import ModelConfig
from specjax.generate import generate
from specjax.tokenizer import Tokenizer

_SENTINEL = "\ue000"  # a private-use character no template contains
_CODE_ASKS = ("Complete the following Python function:", "Implement this Python function:",
              "Write the body of this function in Python:", "Finish this Python code:")
_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "turtledemo", "ensurepip",
              "tkinter", "pydoc_data", "__pycache__"}


def user_turn_prefix(tok: Tokenizer) -> str:
    """The rendered chat text up to where the user's message would start."""
    text = tok.render_chat([{"role": "user", "content": _SENTINEL}], add_generation_prompt=False)
    if _SENTINEL not in text:
        raise ValueError("the chat template does not place the user message verbatim; cannot build a Magpie prefix")
    return text[:text.index(_SENTINEL)]


def _batches(items: list, size: int):
    for a in range(0, len(items), size):
        yield items[a:a + size]


def magpie_prompts(params, cfg: ModelConfig, tok: Tokenizer, n: int, *, max_new_tokens: int = 96,
                   temperature: float = 1.0, top_p: float = 0.95, batch_size: int = 256, seed: int = 0,
                   max_rounds: int = 20) -> list[str]:
    """``n`` distinct user queries sampled from the user-turn prefix (only those the model ends itself)."""
    prefix = tok.encode(user_turn_prefix(tok), add_special_tokens=False)
    eos = set(tok.eos_token_ids)
    out, seen = [], set()
    for r in range(max_rounds):
        res = generate(params, cfg, [prefix] * batch_size, max_new_tokens=max_new_tokens, temperature=temperature,
                       top_p=top_p, seed=seed * 1000 + r, eos_token_ids=tuple(eos))
        for ids in res.output_ids:
            if not ids or ids[-1] not in eos:
                continue  # ran out of budget: an unfinished query
            text = tok.decode(ids[:-1]).strip()
            if len(text) >= 8 and text not in seen:
                seen.add(text)
                out.append(text)
        if len(out) >= n:
            return out[:n]
    return out


def _stub(node: ast.FunctionDef | ast.AsyncFunctionDef, doc: str) -> ast.FunctionDef:
    return ast.FunctionDef(name=node.name, args=node.args, body=[ast.Expr(ast.Constant(doc))], decorator_list=[],
                           returns=node.returns, type_params=[])


def _documented(body: list, max_doc_chars: int):
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            doc = ast.get_docstring(node, clean=True)
            if doc and len(doc) <= max_doc_chars:
                yield node, doc


@functools.lru_cache(maxsize=4)
def stdlib_functions(root: str | None = None, max_doc_chars: int = 800) -> tuple[str, ...]:
    """Signature + docstring of every public documented function and method (inside a stub of its
    class) in the standard library's sources, skipping tests and GUI/demo packages."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.rglob("*.py")):
        if _SKIP_DIRS & set(path.relative_to(root).parts[:-1]):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        out += [ast.unparse(ast.fix_missing_locations(_stub(n, d))) for n, d in _documented(tree.body, max_doc_chars)]
        for cls in tree.body:
            if isinstance(cls, ast.ClassDef) and not cls.name.startswith("_"):
                for n, d in _documented(cls.body, max_doc_chars):
                    stub = ast.ClassDef(name=cls.name, bases=cls.bases, keywords=[], body=[_stub(n, d)],
                                        decorator_list=[], type_params=[])
                    out.append(ast.unparse(ast.fix_missing_locations(stub)))
    return tuple(out)


def code_prompts(n: int, seed: int = 0, root: str | None = None) -> list[str]:
    """``n`` instructions asking to complete a stdlib function or method from its signature and docstring."""
    funcs = list(stdlib_functions(root))
    rng = random.Random(seed)
    rng.shuffle(funcs)
    return [f"{rng.choice(_CODE_ASKS)}\n\n```python\n{f}\n```" for f in funcs[:n]]


def chat_ids(tok: Tokenizer, prompt: str) -> list[int]:
    return tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)


def respond(params, cfg: ModelConfig, tok: Tokenizer, prompts: list[str], *, temperature: float, max_new_tokens: int,
            max_prompt_tokens: int, batch_size: int = 256, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) for every prompt (too-long prompts are skipped); EOS kept if produced."""
    ids = [chat_ids(tok, p) for p in prompts]
    ids = sorted((x for x in ids if len(x) <= max_prompt_tokens), key=len)  # similar lengths batch well
    out = []
    for b, chunk in enumerate(_batches(ids, batch_size)):
        res = generate(params, cfg, chunk, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed + b,
                       eos_token_ids=tuple(tok.eos_token_ids))
        out += [(p, r) for p, r in zip(chunk, res.output_ids) if r]
    return out
