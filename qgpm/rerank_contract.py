"""The contract every reranker keeps, and the checks behind it.

:class:`Reranker` is the protocol of :mod:`qgpm.rerank` and :mod:`qgpm.judge`: one float per
passage, in passage order; an empty passage list gives ``[]``; an empty or whitespace-only
query raises ``ValueError``; a bare ``str`` instead of a sequence of passages raises
``TypeError``; a non-finite score raises ``FloatingPointError``.
"""

from __future__ import annotations

import math
from typing import Any, Protocol, Sequence, runtime_checkable

__all__ = ["Reranker", "check_inputs", "finite_scores", "require_package", "INSTALL_HINT"]

INSTALL_HINT = "It is one of qgpm's own dependencies: reinstall qgpm (`pip install -e .`) or run `pip install 'sentence-transformers>=5,<7'`."
"""What to do when a reranker's package (sentence-transformers) cannot be imported."""


@runtime_checkable
class Reranker(Protocol):
    """Anything that scores passages against a query.

    Attributes:
        name: Short identifier of the reranker (e.g. ``"bm25"``, ``"minilm"``).
    """

    name: str

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """Score ``passages`` against ``query``.

        Args:
            query: The question; must contain non-whitespace text.
            passages: Passages to score.

        Returns:
            One float per passage (higher = more relevant), in passage order; ``[]`` for
            an empty passage list.

        Raises:
            ValueError: If ``query`` is empty or whitespace only.
        """
        ...


def check_inputs(query: str, passages: Sequence[str]) -> list[str]:
    """Validate a ``score`` call; returns the passages as a list."""
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, got {type(query).__name__}")
    if not query.strip():
        raise ValueError("query is empty or whitespace only: a reranker needs a question to score passages against")
    if isinstance(passages, str):
        raise TypeError("passages must be a sequence of strings, not a single str (wrap it in a list)")
    out = list(passages)
    for i, p in enumerate(out):
        if not isinstance(p, str):
            raise TypeError(f"passage {i} is {type(p).__name__}, expected str")
    return out


def finite_scores(values: Sequence[float], who: str) -> list[float]:
    """``values`` as floats; ``FloatingPointError`` naming ``who`` when one is NaN or infinite."""
    out = [float(v) for v in values]
    if not all(math.isfinite(v) for v in out):
        raise FloatingPointError(f"{who} produced non-finite scores: {out}")
    return out


def require_package(module: str, what: str, hint: str = INSTALL_HINT) -> Any:
    """Import ``module`` for ``what``; an ``ImportError`` that says what needs it and how to install it."""
    try:
        return __import__(module)
    except ImportError as exc:
        raise ImportError(f"{what} needs the package '{module}'. {hint}") from exc
