"""QGPMChatModel on the embedded SmolLM2-135M: context paths, streaming, async, bad input."""

from __future__ import annotations

import asyncio
import time

import pytest
from langchain_core.documents import Document
from langchain_core.messages import AIMessageChunk, HumanMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.runnables import RunnablePassthrough

from qgpm_integrations.langchain import NO_CONTEXT_REPLY, QGPMChatModel, format_documents, qgpm_prompt
from qgpm_lc_support import lc_heads

USES_REAL_MODEL = True

DOCS = [
    Document("The Millstone Bakery opened in 1990 on Bridge Street. It sells rye bread and honey cake.", metadata={"source": "bakery"}),
    Document(
        "The town museum owns the skeleton of a whale. The skeleton was found in 1921 near the old harbor wall. "
        "School classes visit it every spring.",
        metadata={"source": "museum"},
    ),
]
QUESTION = "In which year was the whale skeleton found?"
EVIDENCE = "The skeleton was found in 1921 near the old harbor wall."
ALL_TEXT = " ".join(d.page_content for d in DOCS)


@pytest.fixture(scope="module")
def llm(lc_engine):
    return QGPMChatModel(engine=lc_engine, method="qgpm", max_tokens=12)


@pytest.fixture(scope="module")
def prompt_value():
    return qgpm_prompt().invoke({"context": DOCS, "question": QUESTION})


@pytest.fixture(scope="module")
def marked_answer(llm, prompt_value):
    """One greedy QGPM answer through the marked prompt, reused by several tests."""
    return llm.invoke(prompt_value)


def _check_context_reached_pass1(msg, source):
    info = msg.response_metadata["qgpm"]
    assert info["mode"] == "context"
    assert info["source"] == source
    assert info["method"] == "qgpm" and msg.response_metadata["method"] == "qgpm"
    assert info["documents"] == 2
    assert info["question"] == QUESTION
    top = info["top_sentences"]
    assert len(top) == 5
    assert [s["rank"] for s in top] == sorted(s["rank"] for s in top) == list(range(5))
    assert all(isinstance(s["z"], float) for s in top), "pass 1 must have produced z-scores"
    assert all(s["text"] in ALL_TEXT for s in top), "ranked sentences must come from the given documents"
    assert EVIDENCE in [s["text"] for s in top[:2]], info["explanation"]
    assert {s["doc"] for s in top if s["text"] == EVIDENCE} == {1}
    assert info["explanation"].startswith("method=qgpm")
    assert msg.response_metadata["model_name"] == "SmolLM2-135M-Instruct"
    assert msg.usage_metadata["input_tokens"] > 60 and msg.usage_metadata["output_tokens"] > 0


def test_marked_prompt_context_reaches_pass1(marked_answer):
    _check_context_reached_pass1(marked_answer, "prompt")
    assert "1921" in marked_answer.content


def test_kwargs_context_reaches_pass1(llm):
    msg = llm.bind(context=DOCS).invoke(QUESTION)
    _check_context_reached_pass1(msg, "kwargs")
    assert "1921" in msg.content
    # strings work too, and question= overrides the human message
    msg2 = llm.invoke([HumanMessage("this text is not the question")], context=[d.page_content for d in DOCS],
                      question=QUESTION, max_tokens=2)
    assert msg2.response_metadata["qgpm"]["question"] == QUESTION
    assert msg2.response_metadata["qgpm"]["documents"] == 2


def test_chain_answers_needle_from_retriever(corpus_store, lc_engine):
    question = "In which city was the observatory's main telescope made?"
    retriever = corpus_store.as_retriever(search_kwargs={"k": 6})
    retrieved = retriever.invoke(question)
    assert any("made in Dundee" in d.page_content for d in retrieved), "precondition: the retriever finds the evidence"
    llm = QGPMChatModel(engine=lc_engine, method="qgpm", max_tokens=16)
    chain = {"context": retriever | format_documents, "question": RunnablePassthrough()} | qgpm_prompt() | llm | StrOutputParser()
    answer = chain.invoke(question)
    assert "Dundee" in answer


def test_engine_is_shared_and_lazy(lc_engine):
    a = QGPMChatModel(heads=lc_heads())
    b = QGPMChatModel(heads=lc_heads(), method="vanilla")
    assert a._engine is None, "instantiation must not load the model"
    assert a.get_engine() is lc_engine and b.get_engine() is lc_engine
    assert QGPMChatModel(engine=lc_engine).get_engine() is lc_engine


@pytest.mark.parametrize("mode", ["context", "plain"])
def test_stream_equals_invoke_with_greedy_decoding(llm, prompt_value, marked_answer, mode):
    if mode == "context":
        value, full = prompt_value, marked_answer
    else:
        value = "Name three colors."
        full = llm.invoke(value)
    chunks = list(llm.stream(value))
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    assert len([c for c in chunks if c.content]) >= 2, "the answer must arrive in several pieces"
    assert "".join(c.content for c in chunks) == full.content
    assert chunks[-1].chunk_position == "last"
    with_usage = [c for c in chunks if c.usage_metadata]
    assert len(with_usage) == 1 and with_usage[0].usage_metadata == full.usage_metadata
    merged = chunks[0]
    for c in chunks[1:]:
        merged = merged + c
    assert merged.response_metadata["qgpm"]["mode"] == full.response_metadata["qgpm"]["mode"] == mode
    if mode == "context":
        assert merged.response_metadata["qgpm"]["top_sentences"] == full.response_metadata["qgpm"]["top_sentences"]


def test_stop_sequences(llm, prompt_value, marked_answer):
    assert "1921" in marked_answer.content
    msg = llm.invoke(prompt_value, stop=["1921"])
    assert "1921" not in msg.content
    assert marked_answer.content.startswith(msg.content)
    assert msg.response_metadata["finish_reason"] == "stop"
    streamed = "".join(c.content for c in llm.stream(prompt_value, stop=["1921"]))
    assert streamed == msg.content


def test_streaming_flag_routes_invoke_through_stream(lc_engine, prompt_value, marked_answer):
    llm = QGPMChatModel(engine=lc_engine, max_tokens=12, streaming=True)
    tokens = []

    from langchain_core.callbacks import BaseCallbackHandler

    class Collect(BaseCallbackHandler):
        def on_llm_new_token(self, token, **kwargs):
            tokens.append(token)

    msg = llm.invoke(prompt_value, config={"callbacks": [Collect()]})
    assert msg.content == marked_answer.content
    assert len([t for t in tokens if t]) >= 2


# --------------------------------------------------------------------------- async


@pytest.mark.asyncio
async def test_async_invoke_and_stream_match_sync(llm, prompt_value, marked_answer):
    msg = await llm.ainvoke(prompt_value)
    assert msg.content == marked_answer.content
    assert msg.response_metadata["qgpm"]["top_sentences"] == marked_answer.response_metadata["qgpm"]["top_sentences"]
    chunks = [c async for c in llm.astream(prompt_value)]
    assert "".join(c.content for c in chunks) == marked_answer.content
    assert chunks[-1].chunk_position == "last" and chunks[-1].usage_metadata["input_tokens"] > 0


@pytest.mark.asyncio
async def test_async_paths_do_not_block_the_event_loop(llm, prompt_value):
    ticks = 0
    stop = asyncio.Event()

    async def ticker():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    try:
        # ainvoke: pass 1, prefill and decoding all happen while the loop keeps ticking
        start, t0 = ticks, time.perf_counter()
        await llm.ainvoke(prompt_value, max_tokens=4)
        during_invoke, invoke_s = ticks - start, time.perf_counter() - t0
        # astream: the first chunk needs pass 1 + prefill; the loop must tick meanwhile
        agen = llm.astream(prompt_value, max_tokens=4)
        start, t0 = ticks, time.perf_counter()
        await agen.__anext__()
        before_first, first_s = ticks - start, time.perf_counter() - t0
        async for _ in agen:
            pass
    finally:
        stop.set()
        await task
    # A blocked loop ticks at most once per await; a free one every ~5 ms (allow heavy jitter).
    assert during_invoke >= max(5, int(invoke_s / 0.005 * 0.1)), (during_invoke, invoke_s)
    assert before_first >= max(5, int(first_s / 0.005 * 0.1)), (before_first, first_s)


@pytest.mark.asyncio
async def test_abatch_and_async_chain(lc_engine):
    llm = QGPMChatModel(engine=lc_engine, max_tokens=6)
    chain = qgpm_prompt() | llm
    out = await chain.abatch([{"context": DOCS, "question": QUESTION}, {"context": [], "question": QUESTION}])
    assert [m.response_metadata["qgpm"]["mode"] for m in out] == ["context", "empty_context"]
    assert out[0].content and out[1].content == NO_CONTEXT_REPLY


@pytest.mark.asyncio
async def test_astream_closed_early_stops_generation(llm, prompt_value):
    from qgpm.runtime import model_lock

    lock = model_lock(llm.get_engine().model)
    # Our _astream: closing it must stop generation and join its thread before returning.
    agen = llm._astream(prompt_value.to_messages(), max_tokens=64)
    first = await agen.__anext__()
    assert first.message.content
    await agen.aclose()
    assert lock.acquire(blocking=False), "a closed stream must not leave generation running"
    lock.release()
    # Through LangChain's public astream (which finalizes our generator a moment later):
    # closing early raises nothing and the model answers the next call.
    outer = llm.astream(prompt_value, max_tokens=64)
    assert isinstance(await outer.__anext__(), AIMessageChunk)
    await outer.aclose()
    msg = await llm.ainvoke("Hi", max_tokens=2)
    assert msg.response_metadata["qgpm"]["mode"] == "plain"


# --------------------------------------------------------------------------- methods


@pytest.mark.parametrize("method", ["vanilla", "topk", "reorder", "oracle"])
def test_methods_via_call_kwargs(llm, prompt_value, method):
    extra = {"evidence": [EVIDENCE]} if method == "oracle" else {}
    msg = llm.invoke(prompt_value, method=method, max_tokens=3, **extra)
    info = msg.response_metadata["qgpm"]
    assert info["mode"] == "context" and info["method"] == method == msg.response_metadata["method"]
    if method == "vanilla":
        assert info["top_sentences"] == []
    if method == "oracle":
        assert info["top_sentences"][0]["text"] == EVIDENCE and info["top_sentences"][0]["z"] is None
    if method in ("topk", "reorder"):
        assert info["edit"]["mode"] == method and info["edit"]["chunks"] >= 1
    assert isinstance(info["details"], dict)  # present for every method ({} where a call sets no fact)
    assert msg.usage_metadata["output_tokens"] <= 3


# --------------------------------------------------------------------------- bad input


def test_no_context_is_plain_mode_and_says_so(llm):
    msg = llm.invoke("Hello", max_tokens=4)
    assert msg.content
    assert msg.response_metadata["qgpm"]["mode"] == "plain"
    assert "no context" in msg.response_metadata["qgpm"]["reason"]
    assert msg.response_metadata["method"] == "plain"
    assert "top_sentences" not in msg.response_metadata["qgpm"]


def test_empty_retrieval_says_there_is_no_context(llm):
    msg = llm.invoke(qgpm_prompt().invoke({"context": [], "question": QUESTION}), max_tokens=2)
    assert msg.content == NO_CONTEXT_REPLY
    assert msg.response_metadata["qgpm"]["mode"] == "empty_context"
    assert "empty" in msg.response_metadata["qgpm"]["reason"]


@pytest.mark.parametrize("question", ["", "  \n "])
def test_empty_question_is_a_clear_error(llm, question):
    with pytest.raises(ValueError, match="question is empty"):
        llm.invoke(qgpm_prompt().invoke({"context": DOCS, "question": question}))
    with pytest.raises(ValueError, match="question is empty"):
        llm.invoke([HumanMessage("x")], context=DOCS, question=question)


def test_wrong_arguments_are_clear_errors(llm, prompt_value):
    with pytest.raises(TypeError, match="unexpected keyword"):
        llm.invoke(prompt_value, max_tokenz=3)
    with pytest.raises(ValueError, match="unknown method"):
        llm.invoke(prompt_value, method="bogus")
    with pytest.raises(ValueError, match="evidence"):
        llm.invoke(prompt_value, evidence=[EVIDENCE])
    with pytest.raises(ValueError, match="reranker= sets the reranker of method='topk'"):  # qgpm ranks by its config.relevance
        llm.invoke(prompt_value, reranker="bm25")
    with pytest.raises(ValueError, match="timeout must be a number of seconds > 0"):  # 0 is no "no limit"
        llm.invoke(prompt_value, timeout=0)
    with pytest.raises(ValueError, match="name one budget"):
        llm.invoke(prompt_value, max_tokens=3, max_new_tokens=5)
    with pytest.raises(ValueError, match="text only"):
        llm.invoke([HumanMessage(content=[{"type": "image", "url": "https://example.com/x.png"}])])


def test_explain_html_puts_the_explanation_view_in_the_metadata(llm, prompt_value, marked_answer):
    assert "html" not in marked_answer.response_metadata["qgpm"]  # opt-in: the page repeats the whole context
    msg = llm.invoke(prompt_value, explain_html=True, max_tokens=2)
    info = msg.response_metadata["qgpm"]
    assert info["html"].startswith("<!DOCTYPE html>") and "method <b>qgpm</b>" in info["html"]
    assert QUESTION.replace("?", "") in info["html"] and EVIDENCE in info["html"]
    rows = info["sentences"]
    assert [r["text"] for r in sorted(rows, key=lambda r: r["rank"])[:5]] == [s["text"] for s in info["top_sentences"]]
    assert all(0 <= r["depth"] < 1 and isinstance(r["promoted"], bool) for r in rows)
