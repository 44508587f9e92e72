"""End to end on SmolLM2-135M-Instruct: QGPMSynthesizer, and QGPMLLM in every response mode.

The needle: "How many beds does the Fernside Wing have?" -> 36 (cookbook corpus), which
SmolLM2 answers correctly from the retrieved nodes. Greedy decoding throughout. The
synthesizer's tests run on three one-sentence nodes, so each answer takes a fraction of a second.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys

import pytest

from llama_index.core import VectorStoreIndex
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import MetadataMode, TextNode

from qgpm_integrations.llama_index import QGPMSynthesizer

pytestmark = pytest.mark.real_model

QUESTION = "How many beds does the Fernside Wing have?"
EVIDENCE = "The Fernside Wing has 36 beds"
MODES = ["compact", "refine", "tree_summarize", "simple_summarize"]
TOP_K = 2


def _engine(index, llm, mode, **kw):
    return index.as_query_engine(llm=llm, response_mode=mode, similarity_top_k=TOP_K, **kw)


@pytest.fixture(scope="module")
def compact_response(li_index, li_llm):
    return _engine(li_index, li_llm, "compact").query(QUESTION)


def _check_answer(response, mode):
    text = str(response)
    assert "36" in text, f"{mode}: {text!r}"
    trace = response.metadata["qgpm"]
    assert trace and all(r.method == "qgpm" for r in trace)
    assert trace.result.text == text
    assert trace.result.relevance, "no sentence ranking reached the response"
    assert trace.result.usage.prompt_tokens > 0
    return trace


@pytest.mark.parametrize("mode", MODES)
def test_query_engine_answers_the_needle(mode, li_index, li_llm, compact_response):
    response = compact_response if mode == "compact" else _engine(li_index, li_llm, mode).query(QUESTION)
    trace = _check_answer(response, mode)
    sources = [n.node.get_content() for n in response.source_nodes]
    assert any(EVIDENCE in s for s in sources)
    if mode == "refine":
        assert len(trace) == TOP_K  # one QA step, then one refine step
        assert [r.details["llama_index"]["step"] for r in trace] == ["qa", "refine"]
    else:
        assert len(trace) == 1
        # the context was read out of LlamaIndex's own template and reached QGPM as the
        # retrieved text's blank-line-separated parts (the nodes' paragraphs), not as one blob
        info = trace.result.details["llama_index"]
        assert info["prompt"] == "template" and info["documents"] >= len(sources)
        assert {s.doc for s in trace.result.relevance} == set(range(info["documents"]))
        needle = [s for s in trace.result.relevance if EVIDENCE in s.text]
        assert len(needle) == 1


def test_streaming_equals_non_streaming(li_index, li_llm, compact_response):
    streaming = _engine(li_index, li_llm, "compact", streaming=True).query(QUESTION)
    pieces = list(streaming.response_gen)
    assert len([p for p in pieces if p]) > 1, "the answer did not stream"
    assert "".join(pieces) == str(compact_response)
    assert streaming.metadata["qgpm"].result.text == str(compact_response)


def test_async_query_and_async_stream_concurrently(li_index, li_llm, compact_response):
    async def go():
        plain = _engine(li_index, li_llm, "compact", use_async=True).aquery(QUESTION)
        streamed = _engine(li_index, li_llm, "compact", streaming=True).aquery(QUESTION)
        a, s = await asyncio.gather(plain, streamed)
        return a, "".join([p async for p in s.async_response_gen()]), s

    a, text, s = asyncio.run(go())
    assert str(a) == str(compact_response)
    assert text == str(compact_response)
    assert a.metadata["qgpm"].result.text == s.metadata["qgpm"].result.text == text


# --------------------------------------------------------------------------- QGPMSynthesizer on tiny contexts

TINY = ["The Fernside Wing has 36 beds in single rooms.", "The car park of the hospital has 210 spaces.",
        "Visiting hours end at eight in the evening."]


@pytest.fixture(scope="module")
def tiny_retriever(li_embed, li_llm):
    nodes = [TextNode(text=t, id_=f"tiny{i}") for i, t in enumerate(TINY)]
    return VectorStoreIndex(nodes, embed_model=li_embed).as_retriever(similarity_top_k=len(TINY))


@pytest.fixture(scope="module")
def direct_answer(tiny_retriever, li_engine):
    """``engine.answer`` on the retrieved node texts, in retrieval order, with QGPMLLM's defaults."""
    texts = [n.node.get_content(metadata_mode=MetadataMode.LLM) for n in tiny_retriever.retrieve(QUESTION)]
    assert sorted(texts) == sorted(TINY)
    return li_engine.answer(texts, QUESTION, method="qgpm", max_new_tokens=12)


def _same_answer(result, direct):
    assert result.text == direct.text
    assert result.context == direct.context and result.usage.prompt_tokens == direct.usage.prompt_tokens
    assert [(s.doc, s.text, s.rank) for s in result.relevance] == [(s.doc, s.text, s.rank) for s in direct.relevance]


def test_synthesizer_answers_exactly_like_engine_answer(tiny_retriever, li_llm, direct_answer):
    response = RetrieverQueryEngine(tiny_retriever, QGPMSynthesizer(llm=li_llm)).query(QUESTION)
    assert "36" in str(response), str(response)
    result = response.metadata["qgpm"].result
    assert str(response) == result.text
    _same_answer(result, direct_answer)
    assert {s.doc for s in result.relevance} == {0, 1, 2}  # one document per node
    assert result.details["llama_index"] == {"step": "qa", "documents": 3, "prompt": "nodes"}


def test_synthesizer_streaming_and_async_answer_the_same(tiny_retriever, li_llm, direct_answer):
    streaming = RetrieverQueryEngine(tiny_retriever, QGPMSynthesizer(llm=li_llm, streaming=True)).query(QUESTION)
    pieces = list(streaming.response_gen)
    assert len([p for p in pieces if p]) > 1, "the answer did not stream"
    assert "".join(pieces) == direct_answer.text
    _same_answer(streaming.metadata["qgpm"].result, direct_answer)

    async def go():
        plain = RetrieverQueryEngine(tiny_retriever, QGPMSynthesizer(llm=li_llm)).aquery(QUESTION)
        streamed = RetrieverQueryEngine(tiny_retriever, QGPMSynthesizer(llm=li_llm, streaming=True)).aquery(QUESTION)
        a, s = await asyncio.gather(plain, streamed)
        return a, s, "".join([p async for p in s.async_response_gen()])

    a, s, text = asyncio.run(go())
    assert str(a) == text == direct_answer.text
    _same_answer(a.metadata["qgpm"].result, direct_answer)
    _same_answer(s.metadata["qgpm"].result, direct_answer)


def _cookbook():
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "cookbooks" / "llama_index_rag.py"
    spec = importlib.util.spec_from_file_location("llama_index_rag_cookbook", path)
    cookbook = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = cookbook
    spec.loader.exec_module(cookbook)
    return cookbook


def test_cookbook_run_from_elsewhere_names_its_data_folder(li_engine, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        _cookbook().main(["--data", str(tmp_path)], engine=li_engine)
    assert stop.value.code == 2 and "no questions.json and corpus/ there" in capsys.readouterr().err


def test_cookbook_smoke(li_engine, capsys):
    """cookbooks/llama_index_rag.py end to end on one question (kept short: 1 node, 4 tokens)."""
    cookbook = _cookbook()
    rows = cookbook.main(["--limit", "1", "--k", "1", "--max-tokens", "4"], engine=li_engine)
    printed = capsys.readouterr().out
    assert len(rows) == 1
    for m in cookbook.METHODS:
        assert rows[0][m]["text"].strip(), m
        assert rows[0][m]["sources"] == ["01_public_library.md"], m
    assert "accuracy:" in printed and "QGPM ranked highest" in printed


def test_token_counting_used_the_models_tokenizer(li_engine, li_index, tiktoken_calls):
    import llama_index.core

    ids = li_engine.tokenizer("Fernside Wing beds", add_special_tokens=False)["input_ids"]
    assert llama_index.core.Settings.tokenizer("Fernside Wing beds") == ids
    sizes = [len(llama_index.core.Settings.tokenizer(n.get_content())) for n in li_index.docstore.docs.values()]
    assert max(sizes) <= 128
    assert tiktoken_calls == []


@pytest.mark.parametrize("chat_mode", ["context", "condense_plus_context"])
def test_a_chat_engine_ranks_the_retrieved_nodes_and_keeps_the_conversation_out_of_them(chat_mode, li_index, li_llm, li_engine, monkeypatch):
    """Two turns of LlamaIndex's chat engines: each answer runs QGPM over the retrieved nodes alone;
    the earlier turns reach the model in the system message."""
    systems = []
    answer = li_engine.answer

    def spy(*args, **kwargs):
        systems.append(kwargs.get("system"))
        return answer(*args, **kwargs)

    monkeypatch.setattr(li_engine, "answer", spy)
    chat = li_index.as_chat_engine(llm=li_llm, chat_mode=chat_mode, similarity_top_k=TOP_K)
    for question in (QUESTION, "And what else is in that wing?"):
        chat.chat(question)
        result = li_llm.last_result
        assert result.method == "qgpm" and result.question == question
        assert result.details["llama_index"]["prompt"] == "template"
        for template_text in ("Conversation so far", "relevant documents for the context", "context information below", QUESTION):
            assert template_text not in result.context
    assert "Conversation so far" not in (systems[0] or "") and f"User: {QUESTION}" in systems[-1]
