"""qgpm.conversation: chat messages -> one engine request, the no-context policy, the report (no model)."""

from __future__ import annotations

import pytest

from qgpm import EmptyContextError, QGPMResult
from qgpm.chat_prompt import read_chat
from qgpm.conversation import (
    DOC_KEY,
    NO_CONTEXT_REPLY,
    ChatRequest,
    chat_request,
    context_block,
    expand_context,
    question_block,
)
from qgpm.results import SentenceRelevance, Usage

DOCS = [
    "The Millstone Bakery opened in 1990 on Bridge Street.",
    "The skeleton was found in 1921 near the old harbor wall.",
]
QUESTION = "In which year was the whale skeleton found?"
MARKED = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Use the notes."}, context_block(DOCS[0]), context_block(DOCS[1]),
                                 question_block(QUESTION)]},
]
EMPTY = [{"role": "user", "content": [context_block(""), question_block(QUESTION)]}]


def _result(text: str = "In 1921.", method: str = "qgpm", **kw) -> QGPMResult:
    return QGPMResult(text=text, method=method, usage=Usage(prompt_tokens=40, answer_tokens=3), **kw)


class FakeEngine:
    """Records what a request sends; answers with fixed text."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def answer(self, context, question, **kw):
        self.calls.append(("answer", (context, question), kw))
        return _result()

    def chat(self, messages, **kw):
        self.calls.append(("chat", (messages,), kw))
        return _result("Hello.", "plain")

    def stream(self, context, question, **kw):
        self.calls.append(("stream", (context, question), kw))
        return iter(["In ", "1921."])

    def stream_chat(self, messages, **kw):
        self.calls.append(("stream_chat", (messages,), kw))
        return iter(["Hello."])


# --------------------------------------------------------------------------- reading and the no-context policy


def test_context_request_folds_history_into_the_instruction():
    history = [{"role": "user", "content": "When did the bakery open?"}, {"role": "assistant", "content": "In 1990."}]
    req = chat_request(history + MARKED[1:])
    assert req.mode == "context" and req.source == "prompt" and req.needs_engine
    assert list(req.parts.documents) == DOCS and req.parts.question == QUESTION
    assert req.parts.instruction.startswith("Conversation so far:\nUser: When did the bakery open?\nAssistant: In 1990.")
    assert req.parts.instruction.endswith("Use the notes.")


def test_question_is_the_last_user_message_when_the_context_is_given():
    req = chat_request([{"role": "user", "content": QUESTION}], context=DOCS)
    assert (req.mode, req.source, req.parts.question) == ("context", "kwargs", QUESTION)


def test_no_context_is_a_plain_chat_request():
    req = chat_request([{"role": "user", "content": "Hi"}])
    assert req.mode == "plain" and "no context" in req.parts.reason and req.needs_engine


@pytest.mark.parametrize("messages, kw", [(EMPTY, {}), ([{"role": "user", "content": QUESTION}], {"context": []})])
def test_empty_context_replies_without_the_model_or_raises(messages, kw):
    req = chat_request(messages, **kw)
    assert req.mode == "empty_context" and not req.needs_engine
    result = req.run(None)
    assert result.text == NO_CONTEXT_REPLY and result.usage.answer_tokens == 0
    with pytest.raises(EmptyContextError, match="nothing to answer from.*on_empty_context='reply'"):
        chat_request(messages, on_empty_context="raise", **kw)


def test_unknown_policy_raises_before_reading():
    with pytest.raises(ValueError, match="on_empty_context must be one of"):
        chat_request([], on_empty_context="ignore")
    with pytest.raises(ValueError, match="on_empty_context must be one of"):
        ChatRequest(read_chat(MARKED), on_empty_context="ignore")


# --------------------------------------------------------------------------- running on an engine


def test_prompt_kwargs_call_over_prompt_over_defaults():
    req = chat_request(MARKED)
    assert req.prompt_kwargs(default_system="D", default_instruction="DI") == {"system": "Be brief.", "instruction": "Use the notes."}
    assert req.prompt_kwargs(system="S", instruction="I") == {"system": "S", "instruction": "I"}
    bare = chat_request([{"role": "user", "content": QUESTION}], context=DOCS)
    assert bare.prompt_kwargs(default_system="D", default_instruction="DI") == {"system": "D", "instruction": "DI"}
    shaped = chat_request([{"role": "user", "content": "Context:\n" + "\n\n".join(DOCS) + f"\n\nQuestion: {QUESTION}"}])
    assert "{context}" in shaped.prompt_kwargs()["template"]


def test_run_sends_each_mode_to_its_engine_call():
    engine = FakeEngine()
    assert chat_request(MARKED).run(engine, {"method": "qgpm"}, max_new_tokens=5).text == "In 1921."
    assert engine.calls[-1] == ("answer", (DOCS, QUESTION), {"method": "qgpm", "max_new_tokens": 5})
    assert chat_request([{"role": "user", "content": "Hi"}]).run(engine, {"method": "qgpm"}, max_new_tokens=5).method == "plain"
    assert engine.calls[-1] == ("chat", ([{"role": "user", "content": "Hi"}],), {"max_new_tokens": 5})
    with pytest.raises(ValueError, match="pass the QGPM engine"):
        chat_request(MARKED).run(None)


def test_stream_sends_each_mode_to_its_engine_call():
    engine = FakeEngine()
    assert list(chat_request(MARKED).stream(engine, {"method": "vanilla"})) == ["In ", "1921."]
    assert engine.calls[-1][0] == "stream" and engine.calls[-1][2] == {"method": "vanilla"}
    assert list(chat_request([{"role": "user", "content": "Hi"}]).stream(engine)) == ["Hello."]
    assert engine.calls[-1][0] == "stream_chat"


def test_empty_context_stream_is_the_reply_in_one_piece():
    stream = chat_request(EMPTY).stream(None)
    assert next(stream) == NO_CONTEXT_REPLY and stream.result is None  # set once exhausted, as on AnswerStream
    assert list(stream) == [] and stream.result.text == NO_CONTEXT_REPLY
    assert list(stream) == []
    closed = chat_request(EMPTY).stream(None)
    closed.close()
    assert list(closed) == [] and closed.result is None


# --------------------------------------------------------------------------- the report


def test_report_of_each_mode():
    plain = chat_request([{"role": "user", "content": "Hi"}]).report(_result("Hello.", "plain"))
    assert set(plain) == {"mode", "reason", "timings"} and plain["mode"] == "plain"
    empty = chat_request(EMPTY)
    info = empty.report(empty.run(None))
    assert (info["mode"], info["documents"], info["source"], info["question"]) == ("empty_context", 0, "prompt", QUESTION)
    assert info["prompt"]["shape"] == "marked" and "empty" in info["reason"]


def test_report_of_an_answer_over_context():
    rel = [SentenceRelevance(index=i, text=d, start=0, end=len(d), doc=i, rank=1 - i, broad=0.5, sharp=0.25, z=float(i))
           for i, d in enumerate(DOCS)]
    result = _result(relevance=rel, details={"flat_relevance": False}, context="\n\n".join(DOCS), question=QUESTION)
    req = chat_request(MARKED)
    info = req.report(result, top_k=1)
    assert (info["mode"], info["method"], info["source"], info["documents"]) == ("context", "qgpm", "prompt", 2)
    assert info["top_sentences"] == [{"rank": 0, "text": DOCS[1], "doc": 1, "z": 1.0, "broad": 0.5, "sharp": 0.25, "promoted": False,
                                      "term_dropped": False}]
    assert info["details"] == {"flat_relevance": False} and "html" not in info and "edit" not in info
    assert req.report(result, top_k=0)["top_sentences"] == [] and req.report(result, top_k=0)["explanation"] == ""
    page = req.report(result, html=True)
    assert page["html"].startswith("<!DOCTYPE html>") and len(page["sentences"]) == 2
    assert set(info["timings"]) == {"total_s", "first_token_s", "pass1_s", "edit_s", "decode_s"}


# --------------------------------------------------------------------------- marked blocks


def test_marked_blocks():
    assert context_block() == {"type": "text", "text": "{context}", "qgpm_role": "context"}
    assert question_block("Q?", extra=1) == {"type": "text", "text": "Q?", "qgpm_role": "question", "extra": 1}


def test_expand_context_one_block_per_document():
    ph = "\ue000ctx\ue000"
    content = [{"type": "text", "text": "Read."}, context_block(ph), question_block("Q?")]
    out = expand_context(content, DOCS, ph)
    assert [b["text"] for b in out] == ["Read.", *DOCS, "Q?"]
    assert [b.get(DOC_KEY) for b in out] == [None, 0, 1, None]
    assert expand_context(content, [], ph)[1] == context_block("")  # empty, not missing
    assert expand_context([{"type": "text", "text": f"Docs: {ph}"}], DOCS, ph)[0]["text"] == "Docs: " + "\n\n".join(DOCS)
    assert expand_context(f"Docs: {ph}", DOCS, ph) == "Docs: " + "\n\n".join(DOCS)
    untouched = [{"type": "text", "text": "no placeholder"}]
    assert expand_context(untouched, DOCS, ph) is untouched
