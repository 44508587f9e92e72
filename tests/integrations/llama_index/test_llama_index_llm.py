"""QGPMLLM plumbing, with a model-free stand-in engine (fast).

What reaches the engine for each response mode, sync / streaming / async, when the LLM reads
the context and the question back out of the synthesizer's prompt; refine steps; the trace in
``response.metadata["qgpm"]``; plain fallbacks; chat through ``CustomLLM``; metadata and
token counting.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

import llama_index.core
from llama_index.core import VectorStoreIndex
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import ChatMessage
from llama_index.core.prompts import PromptTemplate
from llama_index.core.prompts.default_prompt_selectors import DEFAULT_REFINE_PROMPT_SEL, DEFAULT_TEXT_QA_PROMPT_SEL
from llama_index.core.schema import NodeWithScore, TextNode

from qgpm_integrations.llama_index import QGPMLLM, QGPMTrace, messages_to_prompt, set_tokenizer, split_context

MODES = ["compact", "refine", "tree_summarize", "simple_summarize"]
ALPHA = "Alpha one. Alpha two.\n\nAlpha three."
BETA = "Beta one.\n\nBeta two. Beta three."
QUESTION = "What is alpha?"
# the documents the LLM reads out of a prompt: the context's blank-line-separated parts
ALPHA_DOCS = ["Alpha one. Alpha two.", "Alpha three."]
BETA_DOCS = ["Beta one.", "Beta two. Beta three."]
BOTH_DOCS = {
    "compact": ALPHA_DOCS + BETA_DOCS,  # nodes joined with a blank line
    "tree_summarize": ALPHA_DOCS + BETA_DOCS,
    "simple_summarize": ["Alpha one. Alpha two.", "Alpha three.\nBeta one.", "Beta two. Beta three."],  # joined with "\n"
}


def _words(text):
    return text.split()


@pytest.fixture
def word_tokenizer(monkeypatch):
    """LlamaIndex counts whitespace words during a stub test (restored afterwards)."""
    monkeypatch.setattr(llama_index.core, "global_tokenizer", _words)


@pytest.fixture
def llm(stub_engine, word_tokenizer):
    return QGPMLLM(engine=stub_engine)


class _AxisEmbedding(MockEmbedding):
    """Queries embed as (1, 0): ALPHA (1, 0) is retrieved before BETA (0.9, 0.1)."""

    def _get_vector(self):
        return [1.0, 0.0]


@pytest.fixture
def index(word_tokenizer):
    nodes = [TextNode(text=ALPHA, id_="alpha"), TextNode(text=BETA, id_="beta")]
    for n in nodes:
        n.embedding = [1.0, 0.0] if n.node_id == "alpha" else [0.9, 0.1]
    return VectorStoreIndex(nodes, embed_model=_AxisEmbedding(embed_dim=2))


def _answers(engine):
    return [c for c in engine.calls if c[0] == "answer"]


# --------------------------------------------------------------------------- context / question per mode


@pytest.mark.parametrize("mode", MODES)
def test_each_response_mode_sends_nodes_and_question(mode, llm, index, stub_engine):
    response = index.as_query_engine(llm=llm, response_mode=mode, similarity_top_k=2).query(QUESTION)
    calls = _answers(stub_engine)
    assert calls, "the synthesizer's call never reached engine.answer"
    assert all(c[2] == QUESTION for c in calls)
    if mode == "refine":  # one call per node: first the QA step, then a refine step
        assert [c[1] for c in calls] == [ALPHA_DOCS, BETA_DOCS]
        assert calls[0][3]["instruction"] is None
        assert "qgpm answer to What is alpha? from 2 docs" in calls[1][3]["instruction"]
        assert [r.details["llama_index"]["step"] for r in response.metadata["qgpm"]] == ["qa", "refine"]
    else:  # one call over both nodes
        assert len(calls) == 1
        assert calls[0][1] == BOTH_DOCS[mode]
    assert all(r.details["llama_index"]["prompt"] == "template" for r in response.metadata["qgpm"])
    assert all(c[3]["method"] == "qgpm" for c in calls)
    trace = response.metadata["qgpm"]
    assert isinstance(trace, QGPMTrace) and len(trace) == len(calls)
    assert trace.result.text == str(response)
    assert llm.last_result is trace.result


@pytest.mark.parametrize("mode", MODES)
def test_streaming_matches_and_fills_trace(mode, llm, index, stub_engine):
    qe = index.as_query_engine(llm=llm, response_mode=mode, similarity_top_k=2)
    plain = str(qe.query(QUESTION))
    n_calls = len(_answers(stub_engine))
    streaming = index.as_query_engine(llm=llm, response_mode=mode, similarity_top_k=2, streaming=True).query(QUESTION)
    text = "".join(streaming.response_gen)
    assert text == plain
    assert len(_answers(stub_engine)) == 2 * n_calls
    assert [c[1] for c in _answers(stub_engine)[n_calls:]] == [c[1] for c in _answers(stub_engine)[:n_calls]]
    trace = streaming.metadata["qgpm"]
    assert len(trace) == n_calls and trace.result.text == text


@pytest.mark.parametrize("mode", MODES)
def test_async_query_and_async_streaming(mode, llm, index, stub_engine):
    plain = str(index.as_query_engine(llm=llm, response_mode=mode, similarity_top_k=2).query(QUESTION))

    async def go():
        a = await index.as_query_engine(llm=llm, response_mode=mode, similarity_top_k=2, use_async=True).aquery(QUESTION)
        s = await index.as_query_engine(llm=llm, response_mode=mode, similarity_top_k=2, streaming=True).aquery(QUESTION)
        pieces = [p async for p in s.async_response_gen()]
        return a, s, "".join(pieces)

    a, s, streamed = asyncio.run(go())
    assert str(a) == plain and streamed == plain
    assert a.metadata["qgpm"].result.text == plain
    assert s.metadata["qgpm"].result.text == plain
    contexts = [c[1] for c in _answers(stub_engine)]
    n = len(contexts) // 3
    assert contexts[n : 2 * n] == contexts[:n] and contexts[2 * n :] == contexts[:n]


def test_concurrent_async_queries_keep_their_own_traces(llm, index, stub_engine):
    questions = ["What is alpha?", "What is beta?", "Which one is third?"]

    async def go():
        qe = index.as_query_engine(llm=llm, similarity_top_k=2)
        return await asyncio.gather(*(qe.aquery(q) for q in questions))

    responses = asyncio.run(go())
    for q, r in zip(questions, responses):
        assert q in str(r)
        assert [x.text for x in r.metadata["qgpm"]] == [str(r)]


def test_settings_llm_is_used(llm, index, stub_engine, monkeypatch):
    from llama_index.core import Settings

    monkeypatch.setattr(Settings, "_llm", llm)
    response = index.as_query_engine(similarity_top_k=2).query(QUESTION)
    assert _answers(stub_engine)[-1][1:3] == (BOTH_DOCS["compact"], QUESTION)
    assert response.metadata["qgpm"].result.text == str(response)


def test_llm_serializes_without_the_engine(llm):
    d = llm.to_dict()
    assert d["class_name"] == "QGPMLLM" and d["method"] == "qgpm" and "engine" not in d and "_engine" not in d
    assert llm.to_payload()["model_name"] == "stub-model"


# --------------------------------------------------------------------------- direct template calls


def test_predict_with_synthesizer_templates(llm, stub_engine):
    qa = DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str="Q?")
    assert llm.predict(qa, context_str="Some text.") == "qgpm answer to Q? from 1 docs"
    assert stub_engine.calls[-1][1:3] == (["Some text."], "Q?")
    refine = DEFAULT_REFINE_PROMPT_SEL.partial_format(query_str="Q?", existing_answer="  Earlier.  ")
    llm.predict(refine, context_msg="More text.")
    kind, context, question, kw = stub_engine.calls[-1]
    assert (context, question) == (["More text."], "Q?")
    assert kw["instruction"].count("Earlier.") == 1
    assert llm.last_result.details["llama_index"]["step"] == "refine"


def test_custom_templates_and_fallback(stub_engine, word_tokenizer):
    llm = QGPMLLM(engine=stub_engine)
    tmpl = PromptTemplate("Docs:\n{docs}\nQ: {q}\nA:")  # read by its shape: a context label, a question label
    assert llm.predict(tmpl, docs="Text here.", q="Why?").startswith("qgpm answer to Why?")
    assert stub_engine.calls[-1][1:3] == (["Text here."], "Why?")
    assert llm.last_result.details["llama_index"]["prompt"] == "shape:label"
    # a template without a context (e.g. a query transform) is plain generation
    out = llm.predict(PromptTemplate("Rewrite the question: {q}"), q="Why?")
    assert out == "plain reply"
    assert stub_engine.calls[-1][0] == "chat"
    assert stub_engine.calls[-1][1] == [{"role": "user", "content": "Rewrite the question: Why?"}]


def test_prompt_text_beside_the_template_reaches_the_engine_as_system_text(stub_engine, word_tokenizer):
    llm = QGPMLLM(engine=stub_engine, system_prompt="Be brief.")
    pirate = "You are a pirate. Start every answer with ARRR."
    qa = PromptTemplate(pirate + "\n" + DEFAULT_TEXT_QA_PROMPT_SEL.default_template.template)
    llm.predict(qa, context_str="Text.", query_str="Q?")
    kind, documents, question, kw = stub_engine.calls[-1]
    assert (kind, documents, question) == ("answer", ["Text."], "Q?")
    assert kw["system"] == "Be brief.\n\n" + pirate


def test_template_variable_and_function_mappings(stub_engine, word_tokenizer):
    llm = QGPMLLM(engine=stub_engine)
    tmpl = PromptTemplate(
        "Context: {context_str}\nQ: {query_str}\nA:",
        template_var_mappings={"docs": "context_str"},
        function_mappings={"query_str": lambda **kw: kw["q"].upper()},
    )
    assert llm.predict(tmpl, docs="Some text.", q="why?") == "qgpm answer to WHY? from 1 docs"
    assert stub_engine.calls[-1][1:3] == (["Some text."], "WHY?")


def test_plain_complete_and_chat_use_engine_chat(llm, stub_engine):
    r = llm.complete("hello")
    assert r.text == "plain reply" and r.raw["usage"]["prompt_tokens"] == 11
    assert r.raw["result"].method == "plain"
    assert stub_engine.calls[-1][1] == [{"role": "user", "content": "hello"}]
    # chat is CustomLLM's: messages_to_prompt joins the messages into one prompt, which is completed
    c = llm.chat([ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="hi")])
    assert c.message.content == "plain reply"
    assert stub_engine.calls[-1][1] == [{"role": "user", "content": "Be brief.\n\nhi"}]
    assert [x.delta for x in llm.stream_complete("hello")][:2] == ["plain ", "reply"]
    assert [x.delta for x in llm.stream_chat([ChatMessage(role="user", content="hi")])][:2] == ["plain ", "reply"]
    assert asyncio.run(llm.acomplete("hello")).text == "plain reply"
    assert asyncio.run(llm.achat([ChatMessage(role="user", content="hi")])).message.content == "plain reply"

    async def astream():
        gen = await llm.astream_complete("hello")
        return [x.delta async for x in gen]

    assert "".join(asyncio.run(astream())) == "plain reply"


def test_streams_end_with_one_chunk_that_carries_usage_and_result(llm, stub_engine):
    completion = list(llm.stream_complete("hello"))
    chat = list(llm.stream_chat([ChatMessage(role="user", content="hi")]))
    assert [c.text for c in completion] == ["plain ", "plain reply", "plain reply"]
    assert [c.message.content for c in chat] == ["plain ", "plain reply", "plain reply"]
    # CustomLLM turns completions into chat responses with the completion's additional_kwargs on the message
    for chunks, extra in ((completion, lambda c: c.additional_kwargs), (chat, lambda c: c.message.additional_kwargs)):
        assert [c.delta for c in chunks] == ["plain ", "reply", ""]
        assert [c.raw for c in chunks[:-1]] == [None, None]
        assert [extra(c) for c in chunks[:-1]] == [{}, {}]
        last = chunks[-1]
        assert last.raw["usage"] == {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13}
        assert last.raw["result"].method == "plain"
        assert extra(last) == {"method": "plain", "finish_reason": "stop"}
    assert chat[-1].raw["result"] is llm.last_result
    assert chat[-1].message.role == "assistant"
    reply = llm.complete("hello")
    assert reply.delta is None and reply.additional_kwargs == {"method": "plain", "finish_reason": "stop"}
    answer = llm.chat([ChatMessage(role="user", content="hi")])
    assert answer.delta is None and answer.raw["usage"]["total_tokens"] == 13
    assert answer.message.additional_kwargs == {"method": "plain", "finish_reason": "stop"}


def test_messages_to_prompt_joins_system_history_and_question():
    msgs = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="Hi."),
            ChatMessage(role="assistant", content="Hello."), ChatMessage(role="user", content="Context:\nA text.\nQuestion: Why?")]
    assert messages_to_prompt(msgs) == ("Be brief.\n\nConversation so far:\nUser: Hi.\nAssistant: Hello.\n\n"
                                        "Context:\nA text.\nQuestion: Why?")
    assert messages_to_prompt([ChatMessage(role="user", content="hi")]) == "hi"


def test_chat_prompts_of_a_chat_model_are_read_too(stub_engine, word_tokenizer):
    """is_chat_model=True: synthesizers send LlamaIndex's chat templates, joined by messages_to_prompt."""
    llm = QGPMLLM(engine=stub_engine, is_chat_model=True, system_prompt="SYS")
    assert llm.predict(DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str="Q?"), context_str="Some text.") == "qgpm answer to Q? from 1 docs"
    assert stub_engine.calls[-1][1:3] == (["Some text."], "Q?") and stub_engine.calls[-1][3]["system"] == "SYS"
    llm.predict(DEFAULT_REFINE_PROMPT_SEL.partial_format(query_str="Q?", existing_answer="Earlier."), context_msg="More text.")
    assert stub_engine.calls[-1][1:3] == (["More text."], "Q?") and "Earlier." in stub_engine.calls[-1][3]["instruction"]


def test_generation_settings_reach_the_engine(stub_engine, word_tokenizer):
    llm = QGPMLLM(engine=stub_engine, method="vanilla", max_new_tokens=7, temperature=0.5, top_p=0.9, seed=3, stop=["\n"],
                  system_prompt="SYS", answer_prefix="Answer:")
    llm.predict(DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str="Q?"), context_str="Text.")
    kw = stub_engine.calls[-1][3]
    assert kw["method"] == "vanilla" and kw["system"] == "SYS" and kw["answer_prefix"] == "Answer:"
    assert (kw["max_new_tokens"], kw["temperature"], kw["top_p"], kw["seed"], kw["stop"]) == (7, 0.5, 0.9, 3, ["\n"])
    llm.complete("hi", max_tokens=3)
    assert stub_engine.calls[-1][3]["max_new_tokens"] == 3
    llm.complete("hi", temperature=0.25, stop=["x"], seed=5)  # per-call settings win
    kw = stub_engine.calls[-1][3]
    assert (kw["temperature"], kw["stop"], kw["seed"], kw["max_new_tokens"]) == (0.25, ["x"], 5, 7)


def test_topk_reorder_and_oracle_arguments(stub_engine, word_tokenizer):
    qa = DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str="Q?")
    QGPMLLM(engine=stub_engine, method="topk", reranker="minilm", k=2).predict(qa, context_str="Text.")
    kw = stub_engine.calls[-1][3]
    assert (kw["method"], kw["reranker"], kw["k"]) == ("topk", "minilm", 2)
    QGPMLLM(engine=stub_engine, method="reorder").predict(qa, context_str="Text.")
    assert stub_engine.calls[-1][3]["method"] == "reorder"
    oracle = QGPMLLM(engine=stub_engine, method="oracle", evidence=["Needle here.", "Absent."])
    oracle.predict(qa, context_str="Hay. Needle here. Hay.")
    kw = stub_engine.calls[-1][3]
    assert kw["method"] == "oracle" and kw["evidence"] == ["Needle here."]
    oracle.predict(qa, context_str="Only hay.")  # no evidence in this chunk: vanilla
    assert stub_engine.calls[-1][3]["method"] == "vanilla" and "evidence" not in stub_engine.calls[-1][3]
    with pytest.raises(ValueError, match="evidence"):
        QGPMLLM(engine=stub_engine, method="oracle")
    with pytest.raises(ValueError, match="unknown method"):
        QGPMLLM(engine=stub_engine, method="magic")


def test_relevance_source_reaches_the_engine_config(stub_engine, word_tokenizer):
    from qgpm import QGPMConfig

    stub_engine.config = QGPMConfig(k_sharp=4.0)  # the engine's own settings, which the source is applied on
    qa = DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str="Q?")
    QGPMLLM(engine=stub_engine, method="qgpm", relevance="minilm").predict(qa, context_str="Text.")
    cfg = stub_engine.calls[-1][3]["config"]
    assert cfg.relevance == "minilm" and cfg.k_sharp == 4.0
    QGPMLLM(engine=stub_engine, method="qgpm").predict(qa, context_str="Text.")
    assert "config" not in stub_engine.calls[-1][3]
    with pytest.raises(ValueError, match="relevance"):
        QGPMLLM(engine=stub_engine, relevance="heads+")
    with pytest.raises(ValueError, match="takes none"):
        QGPMLLM(engine=stub_engine, method="vanilla", relevance="minilm")


def test_metadata_and_tokenizer(stub_engine, monkeypatch, caplog):
    monkeypatch.setattr(llama_index.core, "global_tokenizer", None)
    llm = QGPMLLM(engine=stub_engine, max_new_tokens=33)
    md = llm.metadata
    # the window LlamaIndex packs into leaves room for QGPM's own prompt around the context and question
    assert 10 < llm.prompt_overhead() < 100
    assert (md.context_window, md.num_output, md.model_name, md.is_chat_model) == (4096 - llm.prompt_overhead(), 33, "stub-model", False)
    assert llama_index.core.global_tokenizer is None  # building the LLM changed no LlamaIndex setting
    assert llm.count_tokens("a b") == 2
    # set_tokenizer makes the model's tokenizer count LlamaIndex's tokens (no tiktoken)
    assert set_tokenizer(llm) is True
    assert llama_index.core.Settings.tokenizer("one two three") == ["one", "two", "three"]
    # a tokenizer already chosen is kept unless forced
    mine = lambda s: list(s)  # noqa: E731
    llama_index.core.Settings.tokenizer = mine
    assert set_tokenizer(stub_engine) is False and llama_index.core.global_tokenizer is mine
    with caplog.at_level("WARNING", logger="qgpm"):
        QGPMLLM(engine=stub_engine, set_global_tokenizer=True)
    assert llama_index.core.global_tokenizer is mine
    assert "already has a global tokenizer" in caplog.text and "force=True" in caplog.text  # kept, and said so
    assert set_tokenizer(llm, force=True) is True and llama_index.core.global_tokenizer is not mine
    with pytest.raises(TypeError, match="set_tokenizer takes"):
        set_tokenizer(object())


def test_construction_leaves_llama_index_settings_untouched(stub_engine, monkeypatch):
    from llama_index.core import Settings

    from qgpm_integrations.llama_index import QGPMSynthesizer

    monkeypatch.setattr(llama_index.core, "global_tokenizer", None)
    Settings.callback_manager  # LlamaIndex creates its default manager on first read; read it before the snapshot
    before = dict(vars(Settings))
    llm = QGPMLLM(engine=stub_engine)
    QGPMSynthesizer(llm=llm, streaming=True)
    QGPMSynthesizer(engine=stub_engine, method="vanilla")
    assert dict(vars(Settings)) == before
    assert llama_index.core.global_tokenizer is None


def test_last_result_is_thread_safe(llm, stub_engine):
    qa = DEFAULT_TEXT_QA_PROMPT_SEL

    def worker(i):
        for _ in range(20):
            llm.predict(qa.partial_format(query_str=f"Q{i}?"), context_str="Text.")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(_answers(stub_engine)) == 80
    assert llm.last_result.text in {f"qgpm answer to Q{i}? from 1 docs" for i in range(4)}


def test_no_trace_outside_a_synthesis(llm, index):
    # a synthesizer with another LLM gets no "qgpm" metadata
    from llama_index.core.llms import MockLLM

    r = index.as_query_engine(llm=MockLLM(max_tokens=4), similarity_top_k=1).query(QUESTION)
    assert "qgpm" not in (r.metadata or {})


def test_synthesizer_without_retriever(llm, stub_engine):
    from llama_index.core import get_response_synthesizer

    synth = get_response_synthesizer(llm=llm, response_mode="compact")
    nodes = [NodeWithScore(node=TextNode(text="Gamma one. Gamma two."), score=1.0), NodeWithScore(node=TextNode(text="Delta one."), score=0.5)]
    r = synth.synthesize("What is gamma?", nodes)
    assert _answers(stub_engine)[-1][1] == ["Gamma one. Gamma two.", "Delta one."]
    assert r.metadata["qgpm"].result.text == str(r)


# --------------------------------------------------------------------------- environment


@pytest.mark.filterwarnings("ignore:A test tried")
def test_network_is_blocked(network_errors):
    import socket

    with pytest.raises(network_errors):
        socket.create_connection(("127.0.0.1", 9), timeout=1)


def test_tiktoken_is_trapped(tiktoken_calls, network_errors):
    tiktoken = pytest.importorskip("tiktoken")
    n = len(tiktoken_calls)
    with pytest.raises(network_errors):
        tiktoken.get_encoding("cl100k_base")
    assert tiktoken_calls[n:] == [("get_encoding", ("cl100k_base",))]  # the trap, not just the network block
    del tiktoken_calls[n:]


# --------------------------------------------------------------------------- split_context


def test_split_context():
    a, b, c = "First node.\n\nIts second paragraph.", "Second node.", "Third node."
    assert split_context("\n\n".join([a, b, c]), [c, a, b]) == [a, b, c]
    assert split_context("\n".join([a, b]), [a, b]) == [a, b]  # simple_summarize joins with "\n"
    assert split_context("\n\n".join([a, b]), []) == "\n\n".join([a, b])  # nothing known: one text
    assert split_context(a, [a]) == a
    # a node cut at its start by the prompt helper stays a separate piece
    assert split_context("paragraph.\n\n" + b, [a, b]) == ["paragraph.", b]
    # a known text in the middle of a line is not a boundary
    assert split_context("See Second node. here", [b]) == "See Second node. here"


def test_trace_to_html_is_the_final_calls_explanation_page():
    class Result:
        def __init__(self, page):
            self.page = page

        def to_html(self, top=10):
            return f"{self.page}:{top}"

    trace = QGPMTrace()
    with pytest.raises(ValueError, match="no QGPM call has finished yet"):
        trace.to_html()
    for read in (trace.top_sentences, trace.explain):  # the count is checked with no call finished too
        with pytest.raises(ValueError, match="k must be >= 0"):
            read(-1)
    trace.add_result(Result("first"))
    trace.add_result(Result("last"))
    assert trace.to_html() == "last:10" and trace.to_html(top=3) == "last:3"


def test_arguments_no_method_reads_raise(stub_engine, word_tokenizer):
    """A call argument outside the decoding settings, or a method's setting given to another
    method, raises instead of vanishing."""
    llm = QGPMLLM(engine=stub_engine)
    with pytest.raises(TypeError, match=r"unexpected call arguments \['top_k'\]"):
        llm.complete("hi", top_k=20)
    with pytest.raises(TypeError, match=r"\['method'\]"):  # the method is the LLM's field, not a call argument
        llm.complete("Context: Text.\n\nQuestion: Q?", method="vanilla")
    assert stub_engine.calls == []  # neither call reached the engine
    with pytest.raises(ValueError, match="evidence= is only used with method='oracle'"):
        QGPMLLM(engine=stub_engine, method="qgpm", evidence=["Needle here."])
    with pytest.raises(ValueError, match="reranker= sets the reranker of method='topk'"):
        QGPMLLM(engine=stub_engine, method="qgpm", reranker="bm25")
    with pytest.raises(ValueError, match="k= is how many chunks method='topk' keeps"):
        QGPMLLM(engine=stub_engine, method="reorder", k=2)
    qa = DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str="Q?")
    QGPMLLM(engine=stub_engine, method="reorder", reranker="bm25").predict(qa, context_str="Text.")  # reorder reads its reranker
    assert stub_engine.calls[-1][3]["reranker"] == "bm25" and "k" not in stub_engine.calls[-1][3]


def test_plain_chat_fallback_is_logged_once(stub_engine, word_tokenizer, caplog):
    llm = QGPMLLM(engine=stub_engine)
    with caplog.at_level("WARNING", logger="qgpm"):
        llm.complete("Tell me a joke.")
        llm.complete("Another one.")
    assert stub_engine.calls[-1][0] == "chat"
    assert caplog.text.count("answers a prompt as plain chat without QGPM") == 1
    caplog.clear()
    with caplog.at_level("WARNING", logger="qgpm"):
        llm.predict(DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str="Q?"), context_str="Text.")
    assert stub_engine.calls[-1][0] == "answer" and "plain chat" not in caplog.text
    # a chat engine's query rewriting is plain by design (said at INFO) and leaves the warning for a QA template not read
    from llama_index.core.chat_engine.condense_question import DEFAULT_PROMPT as CONDENSE

    fresh = QGPMLLM(engine=stub_engine)
    caplog.clear()
    with caplog.at_level("INFO", logger="qgpm"):
        fresh.predict(CONDENSE, chat_history="user: Who built it?\nassistant: The council.", question="And when?")
        fresh.predict(CONDENSE, chat_history="user: Who built it?", question="Why?")
    assert [r.levelname for r in caplog.records] == ["INFO"] and "own prompts that ask no question" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="qgpm"):
        fresh.predict(PromptTemplate("Notes to use:\n{context_str}\nNow answer: {query_str}"), context_str="Text.", query_str="Q?")
        fresh.complete("Tell me a joke.")
    assert caplog.text.count("answers a prompt as plain chat without QGPM") == 1


def test_a_reranker_source_needs_no_head_set(stub_engine, word_tokenizer, monkeypatch):
    from qgpm import HeadSetMissingError

    def missing(self):
        raise HeadSetMissingError("no head set is stored for model stub")

    monkeypatch.setattr(type(stub_engine), "heads", property(missing))
    with pytest.raises(HeadSetMissingError):
        QGPMLLM(engine=stub_engine)  # relevance from the heads: the missing set is named at construction
    QGPMLLM(engine=stub_engine, relevance="minilm").predict(DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str="Q?"), context_str="Text.")
    assert stub_engine.calls[-1][3]["config"].relevance == "minilm"


def test_a_model_qgpm_cannot_patch_is_refused_at_construction_not_as_an_empty_response(stub_engine, monkeypatch):
    from qgpm import UnsupportedModelError

    def unsupported(self):
        raise UnsupportedModelError("model family 'gpt2' is not supported")

    monkeypatch.setattr(type(stub_engine), "require_supported", unsupported)
    for method in ("qgpm", "string", "ms-poe"):  # methods that change positions
        with pytest.raises(UnsupportedModelError, match="gpt2"):
            QGPMLLM(engine=stub_engine, method=method)
    for method in ("vanilla", "reorder"):  # standard positions: they run
        QGPMLLM(engine=stub_engine, method=method).predict(DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str="Q?"), context_str="Text.")
        assert stub_engine.calls[-1][3]["method"] == method


class _SlowStream:
    """A stream of 100 pieces, 20 ms apart, that records how far it was read and whether it was closed."""

    def __init__(self, result):
        self._final, self.read, self.closed, self.result = result, 0, False, None

    def __iter__(self):
        return self

    def __next__(self):
        if self.closed or self.read == 100:
            self.result = None if self.closed else self._final
            raise StopIteration
        import time

        time.sleep(0.02)
        self.read += 1
        return "x"

    def close(self):
        self.closed = True

    def cancel(self):
        self.closed = True


def test_cancelling_acomplete_stops_the_call(stub_engine, word_tokenizer):
    """acomplete runs the call as a stream stepped from worker threads: cancelling the awaiting task
    closes the stream (which stops the engine's generation), and the cancelled call's result is
    never recorded."""
    streams = []

    def slow_chat_stream(messages, **kw):
        streams.append(_SlowStream(stub_engine.chat(messages, **kw)))
        return streams[-1]

    stub_engine.stream_chat = slow_chat_stream
    llm = QGPMLLM(engine=stub_engine)

    async def go():
        task = asyncio.create_task(llm.acomplete("hello"))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        read = streams[0].read
        await asyncio.sleep(0.3)
        return read

    read = asyncio.run(go())
    assert streams[0].closed and 0 < read < 100 and streams[0].read == read  # stopped, not read on in the background
    assert llm.last_result is None
    assert asyncio.run(llm.acomplete("hello")).text == "plain reply"  # a whole call ends with its result


def test_a_call_that_fails_its_checks_leaves_the_plain_chat_warning_for_the_next(llm, caplog):
    with caplog.at_level("WARNING", logger="qgpm"), pytest.raises(TypeError, match="unexpected call arguments"):
        llm.complete("Tell me a joke", foo=1)
    assert "as plain chat" not in caplog.text
    with caplog.at_level("WARNING", logger="qgpm"):
        llm.complete("Tell me a joke")
    assert "as plain chat" in caplog.text


def test_max_tokens_is_the_answer_budget_and_not_a_second_one(llm, stub_engine):
    llm.complete("hello", max_tokens=7)
    assert stub_engine.calls[-1][3]["max_new_tokens"] == 7
    with pytest.raises(TypeError, match="max_new_tokens or as max_tokens, not both"):
        llm.complete("hello", max_new_tokens=5, max_tokens=50)
    with pytest.raises(TypeError, match="max_tokens .* must be an int, got NoneType None"):
        llm.complete("hello", max_tokens=None)


def test_a_query_wrapper_set_after_construction_is_refused_at_the_call(llm, stub_engine):
    """QGPM writes the prompt with the model's chat template: a wrapper's text would land in the question."""
    llm.query_wrapper_prompt = PromptTemplate("[INST] {query_str} [/INST]")
    qa = DEFAULT_TEXT_QA_PROMPT_SEL.default_template.format(context_str=ALPHA, query_str=QUESTION)
    with pytest.raises(ValueError, match="takes no query_wrapper_prompt"):
        llm.complete(qa, formatted=True)
    assert stub_engine.calls == []


def test_async_chat_leaves_the_event_loop_free(stub_engine, word_tokenizer):
    """achat / astream_chat run the model in worker threads (CustomLLM's own ran it in the event
    loop's thread, so an async query engine over a chat model stalled every other task)."""
    stub_engine.stream_chat = lambda messages, **kw: _SlowStream(stub_engine.chat(messages, **kw))
    llm = QGPMLLM(engine=stub_engine, is_chat_model=True)

    async def go(call):
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        out = await call()
        ticker.cancel()
        return out, ticks

    async def streamed():
        return [r.delta async for r in await llm.astream_chat([ChatMessage(role="user", content="hi")])]

    response, ticks = asyncio.run(go(lambda: llm.achat([ChatMessage(role="user", content="hi")])))
    assert response.message.content == "plain reply" and ticks > 20  # 100 pieces, 20 ms apart: the loop ran meanwhile
    deltas, ticks = asyncio.run(go(streamed))
    assert "".join(d for d in deltas if d) == "x" * 100 and ticks > 20
