"""Draft heads as pure functions over params pytrees, and their on-disk formats.

``eagle3`` (EAGLE-3 head) and ``medusa`` (Medusa-1 heads): forward functions; ``eagle3_io`` /
``medusa_io`` / ``draft_io``: export and import (vLLM/SGLang, Medusa repository, HF folders);
``shipped``: the trained artifacts inside the package. Training lives in ``training/``.
"""
