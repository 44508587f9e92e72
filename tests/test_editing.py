"""Tests for qgpm.editing: sentence-aligned chunking, Top-K and Reorder edits."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qgpm.editing import (
    CHUNK_SEPARATOR,
    Chunk,
    EditedContext,
    chunk_sentences,
    edit_context,
    reorder_edit,
    reorder_order,
    topk_edit,
    topk_order,
)
from qgpm.segment import split_documents, split_sentences


class FixedReranker:
    """Scores passages from a lookup (by substring), recording the calls."""

    name = "fixed"

    def __init__(self, table: dict[str, float], default: float = 0.0) -> None:
        self.table = table
        self.default = default
        self.calls: list[tuple[str, list[str]]] = []

    def score(self, query: str, passages):
        self.calls.append((query, list(passages)))
        out = []
        for p in passages:
            out.append(next((v for k, v in self.table.items() if k in p), self.default))
        return out


def _chunks(n: int) -> tuple[str, list[Chunk]]:
    text = " ".join(f"Sentence number {i}." for i in range(n))
    sents = split_sentences(text)
    chunks = chunk_sentences(text, sents, chunk_tokens=1)  # one sentence per chunk
    assert len(chunks) == n
    return text, chunks


def _assert_tiles(chunks: list[Chunk], text: str) -> None:
    assert chunks[0].start == 0 and chunks[-1].end == len(text)
    for a, b in zip(chunks, chunks[1:]):
        assert a.end == b.start
    for i, c in enumerate(chunks):
        assert c.index == i
        assert c.text == text[c.start : c.end].strip() and c.text


# ----------------------------------------------------------------- chunking


def test_chunks_respect_budget_and_tile_text():
    text = " ".join(f"This is sentence {i} with exactly eight words." for i in range(20))
    sents = split_sentences(text)
    chunks = chunk_sentences(text, sents, chunk_tokens=20)
    _assert_tiles(chunks, text)
    assert [len(c.text.split()) for c in chunks] == [16] * 10  # two 8-word sentences per chunk


def test_long_sentence_is_its_own_chunk():
    long = " ".join(["word"] * 50) + "."
    text = f"Short one. {long} Short two. Short three."
    chunks = chunk_sentences(text, split_sentences(text), chunk_tokens=10)
    _assert_tiles(chunks, text)
    assert [c.text for c in chunks] == ["Short one.", long, "Short two. Short three."]


def test_chunks_never_cross_documents():
    docs = ["Alpha one. Alpha two.", "Beta one.", "", "Gamma one. Gamma two. Gamma three."]
    text, sents, _ = split_documents(docs)
    chunks = chunk_sentences(text, sents, chunk_tokens=1000)
    _assert_tiles(chunks, text)
    assert [c.doc for c in chunks] == [0, 1, 3]
    assert [c.text for c in chunks] == ["Alpha one. Alpha two.", "Beta one.", "Gamma one. Gamma two. Gamma three."]


def test_custom_token_counter():
    text = "aaaa bb. cc dd. ee ff."
    sents = split_sentences(text)
    # Counter = non-space characters: 7, 5, 5. Budget 10: 7 + 5 > 10, 5 + 5 fits.
    chunks = chunk_sentences(text, sents, chunk_tokens=10, count_tokens=lambda s: len(s.replace(" ", "")))
    assert [c.text for c in chunks] == ["aaaa bb.", "cc dd. ee ff."]
    chunks = chunk_sentences(text, sents, chunk_tokens=9, count_tokens=lambda s: len(s.replace(" ", "")))
    assert [c.text for c in chunks] == ["aaaa bb.", "cc dd.", "ee ff."]


def test_chunking_validates_inputs():
    text = "One. Two."
    sents = split_sentences(text)
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunk_sentences(text, sents, chunk_tokens=0)
    with pytest.raises(ValueError, match="outside the text"):
        chunk_sentences("One.", sents)
    assert chunk_sentences("", []) == []


_WORD = st.sampled_from(["alpha", "beta", "Dr.", "gamma", "x", "end.", "stop!", "why?", "e.g.", "\n", "ok"])
_DOC = st.lists(_WORD, max_size=30).map(" ".join)


@settings(max_examples=60, deadline=None)
@given(docs=st.lists(_DOC, min_size=1, max_size=5), budget=st.integers(1, 12))
def test_chunk_property_tiling_and_documents(docs, budget):
    text, sents, spans = split_documents(docs)
    chunks = chunk_sentences(text, sents, chunk_tokens=budget)
    if not sents:
        assert chunks == []
        return
    _assert_tiles(chunks, text)
    by_start = {s.start: s for s in sents}
    by_end = {s.end: s for s in sents}
    for c in chunks:
        assert c.start in by_start and c.end in by_end  # sentence-aligned
        inside = [s for s in sents if c.start <= s.start and s.end <= c.end]
        assert {s.doc for s in inside} == {c.doc}  # never crosses a document
        words = sum(len(s.text.split()) for s in inside)
        assert words <= budget or len(inside) == 1


# ----------------------------------------------------------------- Top-K


def test_topk_keeps_exactly_k_in_original_order():
    text, chunks = _chunks(8)
    scores = [0.1, 0.9, 0.3, 0.8, 0.2, 0.7, 0.0, 0.6]
    ed = topk_edit(text, chunks, scores, k=3)
    assert ed.mode == "topk"
    assert ed.kept == ed.order == [1, 3, 5]
    assert ed.text == CHUNK_SEPARATOR.join(chunks[i].text for i in [1, 3, 5])
    assert ed.dropped == [0, 2, 4, 6, 7]
    assert ed.scores == scores and ed.chunks == chunks


def test_topk_default_k_is_five():
    text, chunks = _chunks(9)
    ed = topk_edit(text, chunks, [float(i % 4) for i in range(9)])
    assert len(ed.kept) == 5 and ed.kept == sorted(ed.kept)
    assert ed.kept == [1, 2, 3, 6, 7]  # the two 3s, the two 2s, then the first 1


def test_topk_ties_prefer_earlier_chunks():
    text, chunks = _chunks(6)
    ed = topk_edit(text, chunks, [1.0, 2.0, 1.0, 2.0, 1.0, 2.0], k=4)
    assert ed.kept == [0, 1, 3, 5]
    ed = topk_edit(text, chunks, [0.0] * 6, k=2)
    assert ed.kept == [0, 1]


@pytest.mark.parametrize("k", [6, 7, 100])
def test_topk_k_at_least_n_keeps_all_in_order(k):
    text, chunks = _chunks(6)
    ed = topk_edit(text, chunks, [5, 4, 3, 2, 1, 0], k=k)
    assert ed.kept == list(range(6))
    assert ed.text == CHUNK_SEPARATOR.join(c.text for c in chunks)


@pytest.mark.parametrize("k", [0, -1])
def test_topk_bad_k_raises(k):
    text, chunks = _chunks(3)
    with pytest.raises(ValueError, match="k must be >= 1"):
        topk_edit(text, chunks, [1.0, 2.0, 3.0], k=k)


@pytest.mark.parametrize("k", [2.5, True, "3"])
def test_topk_non_integer_k_raises(k):
    text, chunks = _chunks(3)
    with pytest.raises(TypeError):
        topk_edit(text, chunks, [1.0, 2.0, 3.0], k=k)


def test_scores_must_match_chunks_and_be_finite():
    text, chunks = _chunks(3)
    with pytest.raises(ValueError, match="3 chunks"):
        topk_edit(text, chunks, [1.0, 2.0], k=1)
    with pytest.raises(ValueError, match="non-finite"):
        reorder_edit(text, chunks, [1.0, math.nan, 0.0])


def test_topk_order_is_the_topk_rule_on_bare_scores():
    assert topk_order([0.1, 0.9, 0.3, 0.8, 0.2, 0.7, 0.0, 0.6], 3) == [1, 3, 5]
    assert topk_order([1.0, 2.0, 1.0, 2.0, 1.0, 2.0], 4) == [0, 1, 3, 5]  # ties: the earlier wins
    assert topk_order([5, 4, 3], 10) == [0, 1, 2]
    assert topk_order([], 2) == []
    with pytest.raises(ValueError, match="k must be >= 1"):
        topk_order([1.0], 0)
    with pytest.raises(TypeError):
        topk_order([1.0], True)
    with pytest.raises(ValueError, match="non-finite"):
        topk_order([1.0, math.inf], 1)


def test_reorder_order_is_the_reorder_rule_on_bare_scores():
    assert reorder_order([0.5, 0.9, 0.1, 0.7, 0.3, 0.2]) == [2, 5, 4, 0, 3, 1]
    assert reorder_order([1.0, 0.0, 1.0, 0.0, 2.0]) == [1, 3, 0, 2, 4]  # stable for ties
    assert reorder_order([]) == []
    with pytest.raises(ValueError, match="non-finite"):
        reorder_order([math.nan])


@given(st.lists(st.integers(-3, 3), max_size=12), st.integers(1, 14))
@settings(max_examples=60, deadline=None)
def test_edits_follow_the_order_helpers(scores, k):
    text, chunks = _chunks(len(scores))
    assert topk_edit(text, chunks, scores, k=k).order == topk_order(scores, k)
    assert reorder_edit(text, chunks, scores).order == reorder_order(scores)


# ----------------------------------------------------------------- Reorder


def test_reorder_puts_best_last_and_keeps_all():
    text, chunks = _chunks(6)
    scores = [0.5, 0.9, 0.1, 0.7, 0.3, 0.2]
    ed = reorder_edit(text, chunks, scores)
    assert ed.mode == "reorder"
    assert ed.order[-1] == 1  # best chunk right before the question
    assert ed.order == [2, 5, 4, 0, 3, 1]  # ascending by score
    assert sorted(ed.kept) == list(range(6)) and ed.dropped == []
    assert ed.text.endswith(chunks[1].text)
    assert ed.text == CHUNK_SEPARATOR.join(chunks[i].text for i in ed.order)


def test_reorder_is_stable_for_ties():
    text, chunks = _chunks(5)
    assert reorder_edit(text, chunks, [0.0] * 5).order == [0, 1, 2, 3, 4]
    assert reorder_edit(text, chunks, [1.0, 0.0, 1.0, 0.0, 2.0]).order == [1, 3, 0, 2, 4]


def test_edited_spans_locate_chunks_in_edited_text():
    text, chunks = _chunks(4)
    ed = reorder_edit(text, chunks, [3.0, 1.0, 2.0, 0.0])
    assert len(ed.spans) == 4
    for i, (a, b) in zip(ed.order, ed.spans):
        assert ed.text[a:b] == chunks[i].text


# ----------------------------------------------------------------- edit_context


def test_edit_context_topk_with_bm25_string():
    sentences = [f"Filler sentence {i} talks about the weather in spring." for i in range(12)]
    sentences[7] = "The lighthouse keeper's cat is named Marmalade."
    context = " ".join(sentences)
    ed = edit_context(context, "What is the name of the lighthouse keeper's cat?", mode="topk", reranker="bm25", k=2, chunk_tokens=10)
    assert len(ed.chunks) == 12 and len(ed.kept) == 2 and ed.kept == sorted(ed.kept)
    assert 7 in ed.kept and "Marmalade" in ed.text


def test_edit_context_reorder_documents_with_custom_reranker():
    docs = ["Red apples grow here. They are sweet.", "The answer is forty-two.", "Blue sky today."]
    rr = FixedReranker({"forty-two": 5.0, "apples": 1.0})
    ed = edit_context(docs, "What is the answer?", mode="reorder", reranker=rr, chunk_tokens=50)
    assert [c.doc for c in ed.chunks] == [0, 1, 2]
    assert rr.calls == [("What is the answer?", [c.text for c in ed.chunks])]
    assert ed.order == [2, 0, 1] and ed.text.endswith("The answer is forty-two.")
    assert ed.text == "Blue sky today.\n\nRed apples grow here. They are sweet.\n\nThe answer is forty-two."


def test_edit_context_counts_tokens_with_given_counter():
    context = "One two three. Four five six. Seven eight nine."
    ed = edit_context(context, "six?", mode="reorder", reranker=FixedReranker({}), chunk_tokens=2, count_tokens=lambda s: 1)
    assert [c.text for c in ed.chunks] == ["One two three. Four five six.", "Seven eight nine."]


def test_edit_context_empty_context_skips_reranker():
    rr = FixedReranker({})
    ed = edit_context("   ", "anything?", mode="topk", reranker=rr)
    assert isinstance(ed, EditedContext) and ed.text == "" and ed.chunks == [] and ed.kept == []
    assert rr.calls == []


@pytest.mark.parametrize(
    "kwargs, exc",
    [
        ({"mode": "topk", "k": 0}, ValueError),
        ({"mode": "reorder", "k": -3}, ValueError),
        ({"mode": "shuffle"}, ValueError),
        ({"mode": "topk", "chunk_tokens": 0}, ValueError),
    ],
)
def test_edit_context_validates_before_scoring(kwargs, exc):
    rr = FixedReranker({})
    with pytest.raises(exc):
        edit_context("Some text. More text.", "question?", reranker=rr, **kwargs)
    assert rr.calls == []


def test_edit_context_empty_question_raises():
    with pytest.raises(ValueError, match="question is empty"):
        edit_context("Some text.", "  ", mode="topk", reranker=FixedReranker({}))
