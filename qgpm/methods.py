"""The answering methods, as objects: what each needs and how its call is prepared.

One registry (:data:`METHOD_SPECS`), the only list of methods: the engine, the command line,
the evaluation harness and both framework adapters ask a :class:`MethodSpec` what a method
needs (heads, a supported rotary model, evidence, a reranker, options) instead of comparing
its name. This module is data only (no torch): :mod:`qgpm.defaults` takes the method lists
from it, and :mod:`qgpm.preparing` maps each :class:`Stage` to the function that prepares it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

__all__ = ["Stage", "MethodSpec", "METHOD_SPECS", "METHODS", "BASELINE_METHODS", "ROPE_BASELINES", "COMPARISON_METHODS", "method_spec",
           "Method"]


class Stage(enum.Enum):
    """How a method's call is prepared before generation."""

    PLAIN = "plain"  # the prompt as it is, standard RoPE
    HEADS = "heads"  # sentence relevance (the heads' pass 1 or a reranker) -> QGPM position plan
    EVIDENCE = "evidence"  # caller-given evidence -> QGPM position plan
    EDIT = "edit"  # a reranker edits the context (keep the top K chunks, or reorder them)
    COMPRESS = "compress"  # a token classifier compresses the context
    ATTENTION = "attention"  # a query-agnostic position change inside attention


@dataclass(frozen=True)
class MethodSpec:
    """What one answering method needs.

    ``stage``: how its call is prepared; ``plan``: its pass 2 runs under a QGPM position
    plan (``True``: qgpm, oracle) or a baseline's attention plan (``stage`` ATTENTION), else
    it is a plain forward over the (edited) prompt; ``config``: :class:`~qgpm.QGPMConfig`
    applies (and :meth:`~qgpm.QGPM.replan` may reshape it); ``rotary``: needs a model whose
    rotary embedding qgpm supports; ``evidence``: needs ``evidence=``; ``reranker``: uses
    ``reranker=``; ``takes_k``: keeps the ``k=`` best chunks; ``options``: takes ``options=`` (:mod:`qgpm.baselines`);
    ``shortens``: its edit may drop context, so only a character bound applies to the raw
    input; ``compared``: part of ``qgpm eval``'s default comparison.
    """

    name: str
    stage: Stage
    summary: str
    plan: bool = False
    config: bool = False
    rotary: bool = False
    evidence: bool = False
    reranker: bool = False
    takes_k: bool = False
    options: bool = False
    shortens: bool = False
    compared: bool = False

    @property
    def plain_forward(self) -> bool:
        """Whether pass 2 is always one plain forward over some token order (any engine that takes
        token ids can run it); a ``plan`` method is one only under some settings."""
        return self.stage in (Stage.PLAIN, Stage.EDIT, Stage.COMPRESS)


METHOD_SPECS: dict[str, MethodSpec] = {
    s.name: s
    for s in (
        MethodSpec("vanilla", Stage.PLAIN, "standard RoPE over the whole context", compared=True),
        MethodSpec("qgpm", Stage.HEADS, "head relevance (pass 1) -> modulated positions", plan=True, config=True, rotary=True, compared=True),
        MethodSpec("oracle", Stage.EVIDENCE, "the gold evidence -> modulated positions (QGPM's ceiling)", plan=True, config=True, rotary=True,
                   evidence=True, compared=True),
        MethodSpec("topk", Stage.EDIT, "keep the K chunks a reranker scores highest", reranker=True, takes_k=True, shortens=True,
                   compared=True),
        MethodSpec("reorder", Stage.EDIT, "every chunk, sorted by a reranker so the best comes last, next to the question", reranker=True, compared=True),
        MethodSpec("string", Stage.ATTENTION, "STRING: shifted position indices (query-agnostic)", rotary=True, options=True),
        MethodSpec("ms-poe", Stage.ATTENTION, "Ms-PoE: per-head position scaling (query-agnostic)", rotary=True, options=True),
        MethodSpec("self-extend", Stage.ATTENTION, "Self-Extend: grouped distant positions (query-agnostic)", rotary=True, options=True),
        MethodSpec("llmlingua-2", Stage.COMPRESS, "LLMLingua-2 context compression (query-agnostic)", options=True),
    )
}
"""Every answering method, by name."""

METHODS: tuple[str, ...] = tuple(METHOD_SPECS)
BASELINE_METHODS: tuple[str, ...] = tuple(n for n, s in METHOD_SPECS.items() if s.options)
ROPE_BASELINES: tuple[str, ...] = tuple(n for n, s in METHOD_SPECS.items() if s.stage is Stage.ATTENTION)
COMPARISON_METHODS: tuple[str, ...] = tuple(n for n, s in METHOD_SPECS.items() if s.compared)

Method = Literal["vanilla", "qgpm", "oracle", "topk", "reorder", "string", "ms-poe", "self-extend", "llmlingua-2"]
"""The method names as a type (checked against :data:`METHODS` by the tests)."""


def method_spec(method: object) -> MethodSpec:
    """The spec of ``method``; ``ValueError`` naming the choices for an unknown one."""
    spec = METHOD_SPECS.get(method) if isinstance(method, str) else None
    if spec is None:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    return spec
