"""End to end on SmolLM2-135M-Instruct: a real VectorStoreIndex, QGPMLLM, every response mode.

The needle: "How many beds does the Fernside Wing have?" -> 36 (cookbook corpus), which
SmolLM2 answers correctly from the retrieved nodes. Greedy decoding throughout.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import sys

import pytest

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
        # the context reached QGPM as the retrieved nodes, not as one blob
        assert trace.result.details["llama_index"]["documents"] == len(sources)
        assert {s.doc for s in trace.result.relevance} == set(range(len(sources)))
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


def test_cookbook_smoke(li_engine, capsys):
    """cookbooks/llama_index_rag.py end to end on one question (kept short: 1 node, 4 tokens)."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "cookbooks" / "llama_index_rag.py"
    spec = importlib.util.spec_from_file_location("llama_index_rag_cookbook", path)
    cookbook = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = cookbook
    spec.loader.exec_module(cookbook)
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
