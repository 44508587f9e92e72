"""Reranker-based document compressors: QGPM's Top-K and Reorder baselines for retrievers.

Both score each retrieved ``Document`` against the query with a :mod:`qgpm.rerank`
reranker (a spec such as ``"bm25"``, ``"minilm"``, ``"judge"``,
``"cross-encoder:<id>"``, or any object with ``score(query, passages) -> list[float]``)
and write the score to ``metadata["relevance_score"]`` (on copies: the input documents
are not modified).

* :class:`QGPMTopKCompressor` keeps the ``k`` best documents **in their original order**
  (ties: the earlier document wins).
* :class:`QGPMReorder` keeps every document, sorted by ascending score, so the best
  document comes **last**, right before the question in a standard RAG prompt (ties
  keep their original relative order). LangChain's ``LongContextReorder`` instead puts
  the best documents at both ends and ignores scores.

Both work in ``ContextualCompressionRetriever`` and ``DocumentCompressorPipeline``
(``langchain_classic``).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from pydantic import ConfigDict, Field

from qgpm.defaults import DEFAULT_K, DEFAULT_RERANKER
from qgpm.editing import reorder_order, topk_order

__all__ = ["QGPMTopKCompressor", "QGPMReorder", "score_documents"]


def score_documents(reranker: Any, documents: Sequence[Document], query: str) -> list[float]:
    """Reranker scores of ``documents`` for ``query`` (one finite float per document)."""
    if not isinstance(query, str) or not query.strip():
        raise ValueError("query is empty: the reranker needs a query to score documents against")
    if isinstance(reranker, str):
        from qgpm.rerank import get_reranker

        reranker = get_reranker(reranker)  # cached per process
    elif not callable(getattr(reranker, "score", None)):
        raise TypeError(f"reranker must be a qgpm.rerank spec string or have score(query, passages); got {type(reranker).__name__}")
    scores = [float(s) for s in reranker.score(query, [d.page_content for d in documents])]
    if len(scores) != len(documents):
        raise ValueError(f"reranker returned {len(scores)} scores for {len(documents)} documents")
    if not all(math.isfinite(s) for s in scores):
        raise ValueError("reranker returned non-finite scores")
    return scores


def _with_score(doc: Document, score: float) -> Document:
    return Document(page_content=doc.page_content, metadata={**doc.metadata, "relevance_score": score}, id=doc.id)


class QGPMTopKCompressor(BaseDocumentCompressor):
    """Keep the ``k`` highest-scoring documents, in their original order."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    reranker: Any = Field(default=DEFAULT_RERANKER, description="qgpm.rerank spec or a reranker instance.")
    k: int = Field(default=DEFAULT_K, ge=1, description="Number of documents to keep.")

    def compress_documents(self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None) -> Sequence[Document]:
        docs = list(documents)
        if not docs:
            return []
        scores = score_documents(self.reranker, docs, query)
        return [_with_score(docs[i], scores[i]) for i in topk_order(scores, self.k)]


class QGPMReorder(BaseDocumentCompressor):
    """Keep every document, sorted by ascending score: the best document comes last."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    reranker: Any = Field(default=DEFAULT_RERANKER, description="qgpm.rerank spec or a reranker instance.")

    def compress_documents(self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None) -> Sequence[Document]:
        docs = list(documents)
        if not docs:
            return []
        scores = score_documents(self.reranker, docs, query)
        return [_with_score(docs[i], scores[i]) for i in reorder_order(scores)]
