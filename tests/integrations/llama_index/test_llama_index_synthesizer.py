"""QGPMSynthesizer plumbing, with a model-free stand-in engine (fast).

The query engine's question and retrieved nodes reach ``engine.answer`` as they are (one
document per node, no prompt in between), sync / streaming / async, and the response carries
the result at ``metadata["qgpm"]``.
"""

from __future__ import annotations

import asyncio

import pytest

import llama_index.core
from llama_index.core import VectorStoreIndex
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import MetadataMode, NodeWithScore, TextNode

from qgpm_integrations.llama_index import QGPMLLM, QGPMSynthesizer, QGPMTrace

ALPHA = "Alpha one. Alpha two.\n\nAlpha three."
BETA = "Beta one.\n\nBeta two. Beta three."
QUESTION = "What is alpha?"
ANSWER = "qgpm answer to What is alpha? from 2 docs"


@pytest.fixture
def word_tokenizer(monkeypatch):
    monkeypatch.setattr(llama_index.core, "global_tokenizer", lambda s: s.split())


class _AxisEmbedding(MockEmbedding):
    """Queries embed as (1, 0): ALPHA (1, 0) is retrieved before BETA (0.9, 0.1)."""

    def _get_vector(self):
        return [1.0, 0.0]


@pytest.fixture
def nodes():
    # BETA carries metadata the LLM sees (MetadataMode.LLM), as LlamaIndex's own synthesizers show it
    alpha = TextNode(text=ALPHA, id_="alpha", embedding=[1.0, 0.0])
    beta = TextNode(text=BETA, id_="beta", embedding=[0.9, 0.1], metadata={"file_name": "beta.md"})
    return [alpha, beta]


@pytest.fixture
def index(nodes, word_tokenizer):
    return VectorStoreIndex(nodes, embed_model=_AxisEmbedding(embed_dim=2))


@pytest.fixture
def llm(stub_engine, word_tokenizer):
    return QGPMLLM(engine=stub_engine, max_new_tokens=9)


def _query_engine(index, llm, **kw):
    return RetrieverQueryEngine(retriever=index.as_retriever(similarity_top_k=2), response_synthesizer=QGPMSynthesizer(llm=llm, **kw))


def _node_texts(nodes):
    return [n.get_content(metadata_mode=MetadataMode.LLM) for n in nodes]


def test_query_engine_hands_the_nodes_and_the_question_to_engine_answer(index, llm, nodes, stub_engine):
    response = _query_engine(index, llm).query(QUESTION)
    (kind, context, question, kw), = stub_engine.calls  # one call, no prompt formatting or reading
    assert kind == "answer" and question == QUESTION
    assert context == _node_texts(nodes) and "file_name: beta.md" in context[1]
    assert kw["method"] == "qgpm" and kw["max_new_tokens"] == 9 and kw["instruction"] is None and kw["system"] is None
    assert str(response) == ANSWER
    trace = response.metadata["qgpm"]
    assert isinstance(trace, QGPMTrace) and len(trace) == 1 and trace.result is llm.last_result
    assert trace.text == ANSWER and trace.method == "qgpm"  # the trace reads as its result
    assert trace.result.details["llama_index"] == {"step": "qa", "documents": 2, "prompt": "nodes"}
    assert {"alpha", "beta"} <= set(response.metadata)  # LlamaIndex's node metadata is kept
    assert [n.node.node_id for n in response.source_nodes] == ["alpha", "beta"]


def test_as_query_engine_with_the_synthesizer(index, llm, nodes, stub_engine):
    synthesizer = QGPMSynthesizer(llm=llm)
    response = index.as_query_engine(llm=llm, response_synthesizer=synthesizer, similarity_top_k=2).query(QUESTION)
    assert stub_engine.calls[-1][1:3] == (_node_texts(nodes), QUESTION)
    assert response.metadata["qgpm"].result.text == str(response) == ANSWER


def test_streaming(index, llm, nodes, stub_engine):
    response = _query_engine(index, llm, streaming=True).query(QUESTION)
    pieces = list(response.response_gen)
    assert len(pieces) > 1 and "".join(pieces) == ANSWER
    assert stub_engine.calls[-1][1:3] == (_node_texts(nodes), QUESTION)
    assert response.metadata["qgpm"].result.text == ANSWER


def test_async_and_async_streaming(index, llm, nodes, stub_engine):
    async def go():
        plain = await _query_engine(index, llm).aquery(QUESTION)
        streamed = await _query_engine(index, llm, streaming=True).aquery(QUESTION)
        return plain, streamed, "".join([p async for p in streamed.async_response_gen()])

    plain, streamed, text = asyncio.run(go())
    assert str(plain) == text == ANSWER
    assert [c[1:3] for c in stub_engine.calls] == [(_node_texts(nodes), QUESTION)] * 2
    assert plain.metadata["qgpm"].result.text == streamed.metadata["qgpm"].result.text == ANSWER


def test_concurrent_async_queries_keep_their_own_results(index, llm):
    questions = ["What is alpha?", "What is beta?", "Which one is third?"]

    async def go():
        qe = _query_engine(index, llm)
        return await asyncio.gather(*(qe.aquery(q) for q in questions))

    for q, r in zip(questions, asyncio.run(go())):
        assert q in str(r) and [x.text for x in r.metadata["qgpm"]] == [str(r)]


def test_synthesize_directly_and_the_llm_settings_apply(stub_engine, word_tokenizer):
    llm = QGPMLLM(engine=stub_engine, method="topk", k=1, system_prompt="SYS", instruction="Use the notes.", answer_prefix="A:")
    nodes = [NodeWithScore(node=TextNode(text="Gamma one."), score=1.0), NodeWithScore(node=TextNode(text="Delta one."), score=0.5)]
    response = QGPMSynthesizer(llm=llm).synthesize("What is gamma?", nodes, max_tokens=3, temperature=0.5)
    kind, context, question, kw = stub_engine.calls[-1]
    assert (context, question) == (["Gamma one.", "Delta one."], "What is gamma?")
    assert (kw["method"], kw["k"], kw["system"], kw["instruction"], kw["answer_prefix"]) == ("topk", 1, "SYS", "Use the notes.", "A:")
    assert (kw["max_new_tokens"], kw["temperature"]) == (3, 0.5)  # response_kwargs set decoding for the call
    assert response.metadata["qgpm"].method == "topk"


def test_no_nodes_is_llama_index_empty_response_without_a_model_call(llm, stub_engine):
    response = QGPMSynthesizer(llm=llm).synthesize(QUESTION, [])
    assert str(response) == "Empty Response" and stub_engine.calls == []
    assert "qgpm" not in (response.metadata or {})


def test_oracle_without_its_evidence_says_so(stub_engine, word_tokenizer, caplog):
    llm = QGPMLLM(engine=stub_engine, method="oracle", evidence=["Needle here."])
    synthesizer = QGPMSynthesizer(llm=llm)
    found = synthesizer.synthesize(QUESTION, [NodeWithScore(node=TextNode(text="Hay. Needle here."), score=1.0)])
    assert found.metadata["qgpm"].method == "oracle" and stub_engine.calls[-1][3]["evidence"] == ["Needle here."]
    assert found.metadata["qgpm"].result.details["llama_index"]["evidence_found"] is True
    with caplog.at_level("WARNING", logger="qgpm"):
        missed = synthesizer.synthesize(QUESTION, [NodeWithScore(node=TextNode(text="Only hay."), score=1.0)])
    result = missed.metadata["qgpm"].result
    assert result.method == "vanilla" and result.details["llama_index"]["evidence_found"] is False
    assert "evidence" not in stub_engine.calls[-1][3]
    assert "method='vanilla'" in caplog.text


def test_built_from_llm_settings_and_bad_arguments(stub_engine, word_tokenizer):
    from llama_index.core.llms import MockLLM

    synthesizer = QGPMSynthesizer(engine=stub_engine, method="vanilla")
    assert isinstance(synthesizer.llm, QGPMLLM) and synthesizer.llm.method == "vanilla" and synthesizer.llm.engine is stub_engine
    assert synthesizer.get_prompts() == {}
    with pytest.raises(TypeError, match="QGPMLLM"):
        QGPMSynthesizer(llm=MockLLM())
    with pytest.raises(ValueError, match="either llm="):
        QGPMSynthesizer(llm=QGPMLLM(engine=stub_engine), method="vanilla")
    with pytest.raises(TypeError, match="unexpected arguments"):
        QGPMSynthesizer(engine=stub_engine, response_mode="compact")


def test_only_blank_nodes_is_llama_index_empty_response_without_a_model_call(llm, stub_engine):
    blank = [NodeWithScore(node=TextNode(text=t), score=1.0) for t in ("", "  \n\n ", "\u200b\ufeff")]
    assert str(QGPMSynthesizer(llm=llm).synthesize(QUESTION, blank)) == "Empty Response"
    assert "".join(QGPMSynthesizer(llm=llm, streaming=True).synthesize(QUESTION, blank).response_gen) == "Empty Response"

    async def go():
        plain = await QGPMSynthesizer(llm=llm).asynthesize(QUESTION, blank)
        streamed = await QGPMSynthesizer(llm=llm, streaming=True).asynthesize(QUESTION, blank)
        return str(plain), "".join([p async for p in streamed.async_response_gen()])

    assert asyncio.run(go()) == ("Empty Response", "Empty Response")
    assert stub_engine.calls == []
    with pytest.raises(TypeError, match="num_beams"):  # the call's arguments are still checked
        QGPMSynthesizer(llm=llm).synthesize(QUESTION, blank, num_beams=2)


def _llm_events(run):
    """``run(llm)``'s LLM events: (callback pairs of CBEventType.LLM, instrumentation event class names and
    the class that opened their span)."""
    from llama_index.core.callbacks import CallbackManager, CBEventType, LlamaDebugHandler
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler

    names = []

    class _Names(BaseEventHandler):
        def handle(self, event, **kwargs):
            if type(event).__name__.startswith("LLMCompletion") and "InProgress" not in type(event).__name__:
                names.append((type(event).__name__, event.span_id.split(".")[0]))

    debug = LlamaDebugHandler()
    handler = _Names()
    root = get_dispatcher()
    root.add_event_handler(handler)
    try:
        run(CallbackManager([debug]))
    finally:
        root.event_handlers.remove(handler)
    return debug.get_event_pairs(CBEventType.LLM), names


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_model_call_is_an_llm_event_with_prompt_completion_and_usage(stub_engine, word_tokenizer, nodes, streaming, asynchronous):
    from llama_index.core.callbacks import EventPayload

    texts = []

    def run(callback_manager):
        llm = QGPMLLM(engine=stub_engine, max_new_tokens=9, callback_manager=callback_manager)
        synthesizer = QGPMSynthesizer(llm=llm, streaming=streaming)
        chunks = [NodeWithScore(node=n, score=1.0) for n in nodes]
        if not asynchronous:
            response = synthesizer.synthesize(QUESTION, chunks)
            texts.append("".join(response.response_gen) if streaming else str(response))
            return

        async def go():
            response = await synthesizer.asynthesize(QUESTION, chunks)
            return "".join([p async for p in response.async_response_gen()]) if streaming else str(response)

        texts.append(asyncio.run(go()))

    pairs, names = _llm_events(run)
    assert texts == [ANSWER]
    (start, end), = pairs  # one LLM event for the one model call
    prompt = start.payload[EventPayload.PROMPT]
    assert QUESTION in prompt and all(t in prompt for t in _node_texts(nodes))
    completion = end.payload[EventPayload.COMPLETION]
    assert completion.text == ANSWER and completion.raw["usage"]["prompt_tokens"] == 11
    assert names == [("LLMCompletionStartEvent", "QGPMLLM"), ("LLMCompletionEndEvent", "QGPMLLM")]  # in a span of the LLM
