"""QGPMTopKCompressor / QGPMReorder, alone and inside langchain_classic retrievers."""

from __future__ import annotations

import pytest
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever

from qgpm_integrations.langchain import QGPMReorder, QGPMTopKCompressor

DOCS = [Document(f"doc {c}", metadata={"name": c}, id=c) for c in "abcde"]
SCORES = {"doc a": 0.1, "doc b": 0.9, "doc c": 0.5, "doc d": 0.9, "doc e": 0.3}


class TableReranker:
    """Scores from a table; counts calls."""

    def __init__(self, table=SCORES):
        self.table = table
        self.calls = 0

    def score(self, query, passages):
        self.calls += 1
        return [self.table[p] for p in passages]


class ListRetriever(BaseRetriever):
    docs: list[Document]

    def _get_relevant_documents(self, query, *, run_manager=None):
        return list(self.docs)


def names(docs):
    return [d.metadata["name"] for d in docs]


def test_topk_keeps_best_k_in_original_order_with_scores():
    out = QGPMTopKCompressor(reranker=TableReranker(), k=3).compress_documents(DOCS, "q")
    assert names(out) == ["b", "c", "d"]
    assert [d.metadata["relevance_score"] for d in out] == [0.9, 0.5, 0.9]
    assert [d.id for d in out] == ["b", "c", "d"]
    assert "relevance_score" not in DOCS[1].metadata, "input documents must not be modified"


def test_topk_ties_prefer_the_earlier_document():
    out = QGPMTopKCompressor(reranker=TableReranker(), k=1).compress_documents(DOCS, "q")
    assert names(out) == ["b"]
    out = QGPMTopKCompressor(reranker=TableReranker(), k=10).compress_documents(DOCS, "q")
    assert names(out) == list("abcde")


def test_reorder_keeps_all_with_the_best_last():
    out = QGPMReorder(reranker=TableReranker()).compress_documents(DOCS, "q")
    assert names(out) == ["a", "e", "c", "b", "d"]  # ascending; tie b/d keeps original order
    assert [d.metadata["relevance_score"] for d in out] == sorted(SCORES.values())


def test_edge_cases():
    rr = TableReranker()
    assert QGPMTopKCompressor(reranker=rr).compress_documents([], "q") == []
    assert QGPMReorder(reranker=rr).compress_documents([], "q") == []
    assert rr.calls == 0
    with pytest.raises(ValueError, match="query is empty"):
        QGPMReorder(reranker=rr).compress_documents(DOCS, " ")
    with pytest.raises(Exception):
        QGPMTopKCompressor(k=0)

    class Bad:
        def score(self, query, passages):
            return [float("nan")] * len(passages)

    with pytest.raises(ValueError, match="non-finite"):
        QGPMTopKCompressor(reranker=Bad()).compress_documents(DOCS, "q")


def test_bm25_spec_works_end_to_end():
    docs = [
        Document("The bakery sells rye bread."),
        Document("The observatory telescope was made in Dundee."),
        Document("The choir sings on Sundays."),
    ]
    out = QGPMTopKCompressor(reranker="bm25", k=1).compress_documents(docs, "Where was the telescope made?")
    assert [d.page_content for d in out] == [docs[1].page_content]
    out = QGPMReorder(reranker="bm25").compress_documents(docs, "Where was the telescope made?")
    assert out[-1].page_content == docs[1].page_content


def test_in_contextual_compression_retriever_and_pipeline():
    from langchain_classic.retrievers import ContextualCompressionRetriever
    from langchain_classic.retrievers.document_compressors import DocumentCompressorPipeline

    base = ListRetriever(docs=DOCS)
    topk = ContextualCompressionRetriever(base_compressor=QGPMTopKCompressor(reranker=TableReranker(), k=2), base_retriever=base)
    assert names(topk.invoke("q")) == ["b", "d"]
    pipeline = DocumentCompressorPipeline(transformers=[QGPMTopKCompressor(reranker=TableReranker(), k=3), QGPMReorder(reranker=TableReranker())])
    both = ContextualCompressionRetriever(base_compressor=pipeline, base_retriever=base)
    assert names(both.invoke("q")) == ["c", "b", "d"]


@pytest.mark.asyncio
async def test_async_compression():
    from langchain_classic.retrievers import ContextualCompressionRetriever

    retr = ContextualCompressionRetriever(base_compressor=QGPMReorder(reranker=TableReranker()), base_retriever=ListRetriever(docs=DOCS))
    out = await retr.ainvoke("q")
    assert names(out)[-1] == "d"
    out = await QGPMTopKCompressor(reranker=TableReranker(), k=2).acompress_documents(DOCS, "q")
    assert names(out) == ["b", "d"]
