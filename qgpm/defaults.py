"""Defaults shared by the engine, the CLI, the evaluation harness and the adapters.

Each value is defined here once; every other module imports it from here (the test
``tests/test_defaults.py`` checks that no module carries its own copy).
"""

from __future__ import annotations

import os
from typing import Any

from .methods import BASELINE_METHODS, COMPARISON_METHODS, METHODS  # the method lists, from the one registry of method specs
from .settings import fields_of

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_MODEL_NAME",
    "DEFAULT_MODEL_ALIASES",
    "is_default_model",
    "METHODS",
    "BASELINE_METHODS",
    "COMPARISON_METHODS",
    "DEFAULT_METHOD",
    "DEFAULT_RERANKER",
    "DEFAULT_K",
    "PASS1_FIELDS",
    "ANSWER_ARGUMENTS",
]

DEFAULT_MODEL = "smollm2"
"""Alias accepted everywhere a model id is: the embedded SmolLM2-135M-Instruct."""

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
"""Readable name of the embedded default model."""

DEFAULT_MODEL_ALIASES = frozenset({DEFAULT_MODEL, DEFAULT_MODEL_NAME.lower()})
"""Spellings (lower case) that mean the embedded default model."""

DEFAULT_METHOD = "qgpm"

DEFAULT_RERANKER = "minilm"
"""Reranker of ``topk`` / ``reorder`` and of the LangChain / LlamaIndex compressors and
postprocessors: the bundled all-MiniLM-L6-v2. Chosen by measurement
(``benchmarks/results/rerank_mrr.md``): evidence-chunk MRR 0.899 overall against 0.895
for BM25, and clearly ahead on the low-overlap NoLiMa-style association task (0.646
against 0.369), at about 2 s per 1K context tokens on 2 CPU cores."""

DEFAULT_K = 5
"""Chunks (documents, nodes) kept by ``topk``."""

PASS1_FIELDS: tuple[str, ...] = fields_of(replannable=False)
"""``QGPMConfig`` fields that change pass 1 or the prompt itself (the others only
reshape a stored relevance: :meth:`qgpm.QGPM.replan` may change those): the fields of
the groups that are not replannable (:class:`qgpm.settings.Pass1Settings`)."""


ANSWER_ARGUMENTS: tuple[str, ...] = (
    "method", "evidence", "max_new_tokens", "temperature", "top_p", "stop", "system", "instruction", "answer_prefix",
    "template", "reranker", "k", "config", "seed", "options")
"""The keyword arguments of :meth:`qgpm.QGPM.answer` (a misspelt one is named with the closest)."""


def is_default_model(model: Any) -> bool:
    """Whether ``model`` (``None``, an alias, an id or a path) means the embedded default model."""
    if model is None:
        return True
    if not isinstance(model, (str, os.PathLike)):
        return False
    return str(model).strip().lower() in DEFAULT_MODEL_ALIASES
