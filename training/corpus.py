"""A self-distillation corpus made by the target itself (no dataset download).

* Chat prompts, Magpie-style: the instruct model gets only its chat template's user-turn prefix
  (e.g. ``<|im_start|>system...<|im_end|>\\n<|im_start|>user\\n``) and samples the query; with
  ``openers`` each row's prefix ends in a random request opener (``OPENERS``), which the model finishes
  into a query: more varied queries than the bare prefix gives.
* Code prompts cut from the local Python standard library (and, with ``packages``, from installed
  packages such as specjax's own dependencies): the signature + docstring of public top-level
  functions (``ast``), wrapped in a short instruction.
* Raw code completions: the same stubs as plain text (no chat template), the way HumanEval is
  usually prompted, which the target continues.
* Templated instructions across request kinds (``training/instructions.py``).
* Responses: the target answers every prompt through its chat template (raw stubs: continues
  them), greedily and at T=0.7.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import random
import sysconfig
from pathlib import Path

from specjax.config import ModelConfig
from specjax.generate import generate
from specjax.tokenizer import Tokenizer
from training.pool import DevicePool

_SENTINEL = "\ue000"  # a private-use character no template contains
_CODE_ASKS = ("Complete the following Python function:", "Implement this Python function:",
              "Write the body of this function in Python:", "Finish this Python code:")
_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "turtledemo", "ensurepip",
              "tkinter", "pydoc_data", "__pycache__"}


# Request openers for Magpie sampling, written for this file (not taken from any evaluation set).
OPENERS = ("Write a", "Can you explain", "What is the difference between", "Pretend you are", "Give me", "How do I",
           "Summarize", "Compose a", "Draft an", "List", "Compare", "Imagine", "Describe", "Why does", "Suggest",
           "Help me", "I need", "Create a", "Explain how", "What are the main", "Translate", "Rewrite", "Design a",
           "Plan a", "Solve", "Calculate", "Is it true that", "What would happen if", "Tell me about", "Analyze",
           "Generate a", "Please review", "Could you", "Act as", "Outline", "Provide", "Evaluate", "Recommend",
           "What should I", "How can", "Write a Python", "Debug", "Extract", "Classify", "Brainstorm", "Argue",
           "Discuss", "In what ways", "Which", "Develop a", "Identify", "Estimate", "Prove that", "Predict",
           "As a", "My friend", "I am writing", "Write an email", "Write a story", "Write a poem")


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
                   max_rounds: int | None = None, openers: tuple[str, ...] = (), pool: DevicePool | None = None
                   ) -> list[str]:
    """``n`` distinct user queries sampled from the user-turn prefix (only those the model ends itself);
    with ``openers``, each row starts its query with a random one of them (kept in the query's text).
    Round ``r`` samples ``batch_size`` rows with seed ``seed * 1000 + r``; with a ``pool`` (``params`` then
    unused) its devices sample consecutive rounds at once, and the queries are taken in round order, so the
    result is the one-device result. ``max_rounds`` (default: 20, or 4x the rounds ``n`` needs if more) bounds
    the sampling when too few rows end in time."""
    prefix = tok.encode(user_turn_prefix(tok), add_special_tokens=False)
    eos = set(tok.eos_token_ids)
    max_rounds = max(20, 4 * -(-n // batch_size)) if max_rounds is None else max_rounds
    pool = pool or DevicePool(params, devices=1)

    def sample(params, r: int):
        starts = random.Random(seed * 1000 + r).choices(openers, k=batch_size) if openers else [""] * batch_size
        rows = [prefix + (tok.encode(o, add_special_tokens=False) if o else []) for o in starts]
        return rows, generate(params, cfg, rows, max_new_tokens=max_new_tokens, temperature=temperature,
                              top_p=top_p, seed=seed * 1000 + r, eos_token_ids=tuple(eos))

    out, seen = [], set()
    for r0 in range(0, max_rounds, len(pool)):
        for rows, res in pool.map(sample, range(r0, min(r0 + len(pool), max_rounds))):
            for row, ids in zip(rows, res.output_ids):
                if not ids or ids[-1] not in eos:
                    continue  # ran out of budget: an unfinished query
                text = tok.decode(row[len(prefix):] + ids[:-1]).strip()
                if len(text) >= 8 and text not in seen:
                    seen.add(text)
                    out.append(text)
            if len(out) >= n:
                return out[:n]
    return out


def _signature(node) -> str:
    """``def name(args) -> ret:`` (or ``class Name(bases):``) without the body."""
    bare = (ast.ClassDef(name=node.name, bases=node.bases, keywords=node.keywords, body=[ast.Pass()], decorator_list=[],
                         type_params=[]) if isinstance(node, ast.ClassDef) else
            ast.FunctionDef(name=node.name, args=node.args, body=[ast.Pass()], decorator_list=[], returns=node.returns,
                            type_params=[]))
    return ast.unparse(ast.fix_missing_locations(bare)).split("\n")[0]


def _stub(node, doc: str, indent: str = "") -> str:
    """The signature and an indented docstring, as a person would write them (no body)."""
    pad = indent + "    "
    lines = doc.splitlines()
    body = lines[0] if len(lines) == 1 else "\n".join([lines[0]] + [pad + x if x else "" for x in lines[1:]] + [pad])
    return f'{indent}{_signature(node)}\n{pad}"""{body}"""'


def _documented(body: list, max_doc_chars: int):
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            doc = ast.get_docstring(node, clean=True)
            if doc and len(doc) <= max_doc_chars and '"""' not in doc and "\\" not in doc:
                yield node, doc


@functools.lru_cache(maxsize=4)
def stdlib_functions(root: str | None = None, max_doc_chars: int = 800) -> tuple[str, ...]:
    """Signature + docstring of every public documented function and method (under its class's
    signature) in the standard library's sources, skipping tests and GUI/demo packages."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.rglob("*.py")):
        if _SKIP_DIRS & set(path.relative_to(root).parts[:-1]):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        out += [_stub(n, d) for n, d in _documented(tree.body, max_doc_chars)]
        for cls in tree.body:
            if isinstance(cls, ast.ClassDef) and not cls.name.startswith("_"):
                out += [f"{_signature(cls)}\n\n{_stub(n, d, '    ')}" for n, d in _documented(cls.body, max_doc_chars)]
    return tuple(out)


def code_pool(root: str | None = None, packages: tuple[str, ...] = ()) -> tuple[str, ...]:
    """``stdlib_functions(root)`` and then those of each installed package (``"jax"``, ``"orbax.checkpoint"``:
    the sources under the package's folder, its tests skipped), duplicates dropped."""
    out = list(stdlib_functions(root))
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin:
            raise ValueError(f"code package {name!r} is not installed (or has no source folder); the corpus spec "
                             f"names it as a source of code prompts: install it or leave it out of code_packages")
        out += stdlib_functions(str(Path(spec.origin).parent))
    return tuple(dict.fromkeys(out))


def code_prompts(n: int, seed: int = 0, root: str | None = None, packages: tuple[str, ...] = ()) -> list[str]:
    """``n`` instructions asking to complete a function or method (``code_pool``) from its signature and docstring."""
    funcs = list(code_pool(root, packages))
    rng = random.Random(seed)
    rng.shuffle(funcs)
    return [f"{rng.choice(_CODE_ASKS)}\n\n```python\n{f}\n```" for f in funcs[:n]]


def code_completions(n: int, seed: int = 0, root: str | None = None, packages: tuple[str, ...] = ()) -> list[str]:
    """``n`` raw stubs (signature + docstring, then a newline) for plain continuation, no chat template."""
    funcs = list(code_pool(root, packages))
    random.Random(seed + 1).shuffle(funcs)  # another order than code_prompts, so other functions come first
    return [f + "\n" for f in funcs[:n]]


def chat_ids(tok: Tokenizer, prompt: str) -> list[int]:
    return tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)


def prompt_ids(tok: Tokenizer, prompts: list[str], *, max_prompt_tokens: int, chat: bool = True) -> list[list[int]]:
    """Token ids of the prompts (chat-wrapped unless ``chat=False``), too-long ones dropped, sorted by length
    (similar lengths batch well)."""
    ids = [chat_ids(tok, p) if chat else tok.encode(p) for p in prompts]
    return sorted((x for x in ids if len(x) <= max_prompt_tokens), key=len)


def respond_ids(params, cfg: ModelConfig, tok: Tokenizer, ids: list[list[int]], *, temperature: float,
                max_new_tokens: int, batch_size: int = 256, seed: int = 0, first_batch: int = 0,
                pad_to: int = 0) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) for token-id prompts (EOS kept if produced; empty responses dropped),
    ``batch_size`` at a time. Batch ``b`` of the call samples with seed ``seed + first_batch + b``, so answering
    a list in slices of whole batches (``first_batch`` = the slice's first batch) gives what one call over the
    whole list gives. ``pad_to``: every batch is padded to that prompt width and a short last batch to
    ``batch_size`` rows (repeats of its first prompt, answered and dropped), so that all batches of one
    temperature run one compiled program instead of one per prompt-width bucket and row count (greedy
    answers are the same either way; sampled ones are other draws of the same distribution)."""
    out = []
    for b, chunk in enumerate(_batches(ids, batch_size)):
        rows = chunk + [chunk[0]] * (batch_size - len(chunk)) if pad_to else chunk
        res = generate(params, cfg, rows, max_new_tokens=max_new_tokens, temperature=temperature,
                       seed=seed + first_batch + b, eos_token_ids=tuple(tok.eos_token_ids), pad_to=pad_to)
        out += [(p, r) for p, r in zip(chunk, res.output_ids) if r]
    return out
