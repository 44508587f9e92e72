"""Where the sentence relevance ``z`` comes from: the model's heads, a reranker, or both.

The QGPM plan needs one relevance value per context sentence (``z_i``, Eq. 5). The paper
reads it from the model's own retrieval heads in pass 1 (:mod:`qgpm.relevance`); this
module also lets a reranker of :mod:`qgpm.rerank` score the sentences against the
question instead, with no pass 1, or both, fused:

* ``"heads"`` (default): Eq. 4-5 over the selected heads;
* ``"<reranker>"`` (``"minilm"``, ``"bm25"``, ``"cross-encoder:<path>"``, ...): the
  reranker's score of each sentence for the question, standardized over the sentences
  like one head of Eq. 5;
* ``"heads+<reranker>"``: the mean of the two standardized signals (each weighs half).

Everything after ``z`` (ranks, shaping, the confidence rules, positions) is the same for
every source; the flat-relevance threshold is on each source's own z scale
(:mod:`qgpm.thresholds`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from .shaping import fuse_heads

__all__ = ["HEADS", "RERANKER_CHOICES", "RelevanceSource", "check_reranker_name", "parse_source", "reranker_relevance", "fuse_sources"]

HEADS = "heads"

RERANKER_CHOICES: tuple[str, ...] = (
    "bm25",
    "minilm",
    "embedding",
    "embedding:<path-or-id>",
    "judge",
    "llm-judge",
    "judge:<path-or-id>",
    "cross-encoder:<path-or-id>",
)
"""Spec strings accepted by :func:`qgpm.rerank.get_reranker`."""


def check_reranker_name(spec: str) -> None:
    """Refuse (``ValueError`` listing the choices) a reranker spec of no known kind. Loads
    nothing: whether a ``<path-or-id>`` exists is checked when the reranker is built."""
    kind, sep, arg = spec.strip().partition(":")
    kind, arg = kind.strip().lower(), arg.strip()
    kind = {"embedding": "minilm", "llm-judge": "judge"}.get(kind, kind)
    if kind in {"minilm", "judge"} or (kind == "bm25" and not sep) or (kind == "cross-encoder" and arg):
        return
    raise ValueError(f"unknown reranker {spec!r}; choose one of: {', '.join(RERANKER_CHOICES)}")


@dataclass(frozen=True)
class RelevanceSource:
    """A parsed ``QGPMConfig.relevance``: whether pass 1 runs, and which reranker (if any) scores."""

    spec: str
    heads: bool
    reranker: str | None

    @property
    def needs_pass1(self) -> bool:
        return self.heads


def parse_source(spec: Any) -> RelevanceSource:
    """Parse ``"heads"``, ``"<reranker>"`` or ``"heads+<reranker>"``; raise ``ValueError`` on other
    forms and on a reranker spec of no known kind (:func:`check_reranker_name`; whether a
    ``<path-or-id>`` exists is checked when the engine builds the reranker, before pass 1).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"relevance must be 'heads', a reranker spec (e.g. 'minilm', 'bm25') or 'heads+<reranker>', got {spec!r}")
    text = spec.strip()
    if text.lower() == HEADS:
        return RelevanceSource(HEADS, True, None)
    head, plus, rest = text.partition("+")
    if plus:
        if head.strip().lower() != HEADS or not rest.strip() or "+" in rest or rest.strip().lower() == HEADS:
            raise ValueError(f"relevance {spec!r}: a fused source is written 'heads+<reranker>', e.g. 'heads+bm25'")
        _check_part(spec, rest.strip())
        return RelevanceSource(f"{HEADS}+{rest.strip()}", True, rest.strip())
    _check_part(spec, text)
    return RelevanceSource(text, False, text)


def _check_part(spec: str, reranker: str) -> None:
    try:
        check_reranker_name(reranker)
    except ValueError:
        raise ValueError(f"relevance {spec!r}: {reranker!r} is not a relevance source; use 'heads', a reranker "
                         f"({', '.join(RERANKER_CHOICES)}) or 'heads+<reranker>'") from None


def reranker_relevance(reranker: Any, question: str, sentences: Sequence[str]) -> torch.Tensor:
    """``z`` of each sentence from ``reranker.score(question, sentences)``, standardized over the
    sentences as one head of Eq. 5 (all equal scores give 0)."""
    if not sentences:
        return torch.zeros(0, dtype=torch.float64)
    scores = torch.tensor(reranker.score(question, list(sentences)), dtype=torch.float64)
    if scores.numel() != len(sentences):
        raise ValueError(f"reranker {getattr(reranker, 'name', reranker)!r} returned {scores.numel()} scores for {len(sentences)} sentences")
    return fuse_heads(scores[None, :])


def fuse_sources(z_heads: torch.Tensor, z_reranker: torch.Tensor) -> torch.Tensor:
    """The fused ``z``: the mean of the heads' and the reranker's standardized signals.

    A sentence the heads cannot score (``-inf``: only newline tokens) stays ``-inf``.
    """
    if z_heads.shape != z_reranker.shape:
        raise ValueError(f"cannot fuse relevance of {z_heads.numel()} and {z_reranker.numel()} sentences")
    return (z_heads.to(torch.float64) + z_reranker.to(torch.float64)) / 2.0
