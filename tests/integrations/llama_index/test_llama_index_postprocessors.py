"""QGPMTopKPostprocessor / QGPMReorderPostprocessor on hand-made nodes (BM25, fast)."""

from __future__ import annotations

import pytest

import llama_index.core
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from qgpm.rerank import get_reranker
from qgpm_integrations.llama_index import QGPMLLM, QGPMReorderPostprocessor, QGPMTopKPostprocessor

QUESTION = "How many beds does the Fernside Wing have?"
TEXTS = [
    "The bakery on Mill Street sells rye bread.",  # 0: no overlap
    "Visitors to the Fernside Wing may come at noon.",  # 1: some overlap
    "The choir sings on Sunday evenings.",  # 2: no overlap
    "New beds arrived last spring.",  # 3: a little overlap
    "The Fernside Wing has 36 beds in single rooms.",  # 4: best
    "The rail line opened in 1890.",  # 5: no overlap
]


def _nodes():
    return [NodeWithScore(node=TextNode(text=t, id_=f"n{i}"), score=1.0 - i / 10) for i, t in enumerate(TEXTS)]


def _ids(nodes):
    return [n.node.node_id for n in nodes]


def test_topk_keeps_best_in_original_order_with_reranker_scores():
    nodes = _nodes()
    scores = get_reranker("bm25").score(QUESTION, TEXTS)
    best3 = sorted(sorted(range(len(TEXTS)), key=lambda i: (-scores[i], i))[:3])
    assert best3 == [1, 3, 4]  # original order; score order would be 4, 1, 3
    assert sorted(best3, key=lambda i: -scores[i]) == [4, 1, 3]
    out = QGPMTopKPostprocessor(reranker="bm25", top_n=3).postprocess_nodes(nodes, QueryBundle(QUESTION))
    assert _ids(out) == [f"n{i}" for i in best3]
    assert [n.score for n in out] == pytest.approx([scores[i] for i in best3])
    assert [n.score for n in nodes] == pytest.approx([1.0 - i / 10 for i in range(6)])  # input untouched


def test_topk_with_more_room_than_nodes_keeps_all_in_order():
    out = QGPMTopKPostprocessor(reranker="bm25", top_n=10).postprocess_nodes(_nodes(), query_str=QUESTION)
    assert _ids(out) == [f"n{i}" for i in range(6)]


def test_reorder_keeps_all_best_last():
    nodes = _nodes()
    scores = get_reranker("bm25").score(QUESTION, TEXTS)
    out = QGPMReorderPostprocessor(reranker="bm25", keep_retrieval_score=True).postprocess_nodes(nodes, QueryBundle(QUESTION))
    assert sorted(_ids(out)) == sorted(_ids(nodes))
    assert _ids(out) == ["n0", "n2", "n5", "n3", "n1", "n4"]  # the best node sits next to the question
    got = [n.score for n in out]
    assert got == sorted(got)  # ascending: best last
    assert got == pytest.approx(sorted(scores))
    # ties (the zero-overlap nodes) keep their original relative order
    assert [i for i in _ids(out) if scores[int(i[1:])] == 0.0] == ["n0", "n2", "n5"]
    assert out[-1].node.metadata["retrieval_score"] == pytest.approx(0.6)
    assert "retrieval_score" not in nodes[4].node.metadata


def test_empty_and_missing_query():
    assert QGPMTopKPostprocessor().postprocess_nodes([], query_str=QUESTION) == []
    with pytest.raises(ValueError):
        QGPMReorderPostprocessor().postprocess_nodes(_nodes())


def test_class_names_and_reranker_object():
    class Fixed:
        name = "fixed"

        def score(self, query, passages):
            return [float(len(p)) for p in passages]

    assert QGPMTopKPostprocessor.class_name() == "QGPMTopKPostprocessor"
    assert QGPMReorderPostprocessor.class_name() == "QGPMReorderPostprocessor"
    out = QGPMTopKPostprocessor(reranker=Fixed(), top_n=1).postprocess_nodes(_nodes(), query_str="q")
    assert _ids(out) == ["n1"] and out[0].score == len(TEXTS[1])


def test_unknown_arguments_raise_and_name_the_field_meant():
    with pytest.raises(TypeError, match=r"QGPMTopKPostprocessor got unexpected arguments \['top_k'\] \(top_k: the number of nodes kept is top_n="):
        QGPMTopKPostprocessor(top_k=1)
    with pytest.raises(TypeError, match=r"QGPMReorderPostprocessor got unexpected arguments \['foo'\]; it takes callback_manager"):
        QGPMReorderPostprocessor(foo=1)
    with pytest.raises(TypeError, match=r"Reorder keeps every node; to keep the best ones use QGPMTopKPostprocessor\(top_n="):
        QGPMReorderPostprocessor(top_n=2)
    with pytest.raises(ValueError, match="unknown reranker 'nope'"):
        QGPMTopKPostprocessor(reranker="nope")
    kept = QGPMTopKPostprocessor(reranker="bm25", top_n=2)
    assert QGPMTopKPostprocessor.from_dict(kept.to_dict()).top_n == 2  # LlamaIndex's own round trip still works
    assert QGPMTopKPostprocessor.model_validate(kept.to_dict()).top_n == 2  # to_dict() holds class_name, which is no argument


def test_postprocessors_in_a_query_engine(stub_engine, monkeypatch):
    from llama_index.core import VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding

    monkeypatch.setattr(llama_index.core, "global_tokenizer", str.split)
    # the query embeds as (0.5, 0.5): retrieval order n1, n3, n4, n0, n2, n5
    second = {1: 1.0, 3: 0.8, 4: 0.6, 0: 0.4, 2: 0.2, 5: 0.0}
    nodes = [TextNode(text=t, id_=f"n{i}", embedding=[1.0, second[i]]) for i, t in enumerate(TEXTS)]
    index = VectorStoreIndex(nodes, embed_model=MockEmbedding(embed_dim=2))
    llm = QGPMLLM(engine=stub_engine, method="vanilla")
    base = index.as_query_engine(llm=llm, similarity_top_k=6)
    assert [n.node.node_id for n in base.retrieve(QUESTION)] == ["n1", "n3", "n4", "n0", "n2", "n5"]

    qe = index.as_query_engine(llm=llm, similarity_top_k=6, node_postprocessors=[QGPMReorderPostprocessor(reranker="bm25")])
    response = qe.query(QUESTION)
    assert [n.node.node_id for n in response.source_nodes] == ["n0", "n2", "n5", "n3", "n1", "n4"]
    context = stub_engine.calls[-1][1]
    assert context == [TEXTS[i] for i in (0, 2, 5, 3, 1, 4)]  # best node last, next to the question

    qe = index.as_query_engine(llm=llm, similarity_top_k=6, node_postprocessors=[QGPMTopKPostprocessor(reranker="bm25", top_n=2)])
    response = qe.query(QUESTION)
    assert [n.node.node_id for n in response.source_nodes] == ["n1", "n4"]  # retrieval order, not score order
    assert stub_engine.calls[-1][1] == [TEXTS[1], TEXTS[4]]
