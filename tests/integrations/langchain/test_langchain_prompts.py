"""Prompt helpers and message parsing: how context and question are marked (no model needed)."""

from __future__ import annotations

import pytest
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate

from qgpm_integrations.langchain import (
    QGPMChatModel,
    QGPMDocuments,
    QGPMPromptTemplate,
    context_block,
    document_texts,
    format_documents,
    qgpm_prompt,
    question_block,
)
from qgpm_integrations.langchain.call_args import build_request

DOCS = [
    Document("The bakery opened in 1990.", metadata={"source": "bakery.md"}),
    Document("The skeleton was found in 1921.", metadata={"source": "museum.md"}),
]


def _human(messages):
    return [m for m in messages if isinstance(m, HumanMessage)][-1]


def test_qgpm_prompt_marks_context_and_question_blocks():
    prompt = qgpm_prompt()
    assert isinstance(prompt, ChatPromptTemplate) and isinstance(prompt, QGPMPromptTemplate)
    assert sorted(prompt.input_variables) == ["context", "question"]
    msgs = prompt.invoke({"context": "Some text. More text.", "question": "What?"}).to_messages()
    blocks = _human(msgs).content
    assert blocks == [
        {"type": "text", "text": "Some text. More text.", "qgpm_role": "context"},
        {"type": "text", "text": "What?", "qgpm_role": "question"},
    ]


def test_documents_become_one_marked_block_each():
    msgs = qgpm_prompt().invoke({"context": DOCS, "question": "When?"}).to_messages()
    blocks = _human(msgs).content
    ctx = [b for b in blocks if b.get("qgpm_role") == "context"]
    assert [b["text"] for b in ctx] == [d.page_content for d in DOCS]
    assert [b["qgpm_doc"] for b in ctx] == [0, 1]
    assert blocks[-1] == {"type": "text", "text": "When?", "qgpm_role": "question"}


@pytest.mark.parametrize("value", [format_documents(DOCS), [d.page_content for d in DOCS], tuple(DOCS)])
def test_document_lists_of_any_kind_keep_boundaries(value):
    blocks = _human(qgpm_prompt().invoke({"context": value, "question": "q"}).to_messages()).content
    assert [b["text"] for b in blocks if b.get("qgpm_role") == "context"] == [d.page_content for d in DOCS]


@pytest.mark.asyncio
async def test_async_formatting_expands_documents_too():
    value = await qgpm_prompt().ainvoke({"context": DOCS, "question": "q"})
    blocks = _human(value.to_messages()).content
    assert [b.get("qgpm_doc") for b in blocks if b.get("qgpm_role") == "context"] == [0, 1]


def test_instruction_system_and_label():
    prompt = qgpm_prompt("Use the notes.", system="Be brief.", question_label="Question: ")
    msgs = prompt.invoke({"context": DOCS, "question": "When?"}).to_messages()
    assert isinstance(msgs[0], SystemMessage) and msgs[0].content == "Be brief."
    blocks = _human(msgs).content
    assert blocks[0] == {"type": "text", "text": "Use the notes."}
    assert blocks[-1]["text"] == "Question: When?"


def test_custom_variable_names_and_partial():
    prompt = qgpm_prompt(context_variable="docs", question_variable="q").partial(q="Who?")
    blocks = _human(prompt.invoke({"docs": DOCS}).to_messages()).content
    assert [b["text"] for b in blocks if b.get("qgpm_role") == "context"] == [d.page_content for d in DOCS]
    assert blocks[-1]["text"] == "Who?"
    with pytest.raises(ValueError):
        qgpm_prompt(context_variable="x", question_variable="x")


def test_empty_document_list_gives_an_empty_marked_block():
    blocks = _human(qgpm_prompt().invoke({"context": [], "question": "q"}).to_messages()).content
    assert [b["text"] for b in blocks if b.get("qgpm_role") == "context"] == [""]


def test_format_documents_prints_joined_in_a_plain_template():
    docs = format_documents(DOCS + [Document("   ")])
    assert isinstance(docs, QGPMDocuments) and list(docs) == [d.page_content for d in DOCS]
    plain = ChatPromptTemplate.from_messages([("human", "Context:\n{context}\n\nQ: {question}")])
    text = plain.invoke({"context": docs, "question": "q"}).to_messages()[0].content
    assert text == "Context:\nThe bakery opened in 1990.\n\nThe skeleton was found in 1921.\n\nQ: q"
    assert list(format_documents(DOCS, with_source=True))[1] == "[museum.md] The skeleton was found in 1921."


def test_hand_built_marked_template_with_plain_chat_prompt():
    # Extra keys of raw dict blocks survive ChatPromptTemplate formatting (langchain-core 1.x).
    prompt = ChatPromptTemplate.from_messages([("human", [context_block(), question_block()])])
    blocks = prompt.invoke({"context": "A. B.", "question": "q"}).to_messages()[0].content
    assert [b.get("qgpm_role") for b in blocks] == ["context", "question"]


def test_placeholder_inside_other_text_falls_back_to_joined_text():
    prompt = QGPMPromptTemplate.from_messages([("human", [context_block("Notes: {context}"), question_block()])])
    blocks = prompt.invoke({"context": DOCS, "question": "q"}).to_messages()[0].content
    assert blocks[0]["text"] == "Notes: The bakery opened in 1990.\n\nThe skeleton was found in 1921."


def test_document_texts_normalizes_and_rejects():
    assert document_texts("a") == ["a"]
    assert document_texts(DOCS[0]) == [DOCS[0].page_content]
    assert document_texts(["a", " ", DOCS[1]]) == ["a", DOCS[1].page_content]
    assert document_texts(None) == []
    with pytest.raises(TypeError):
        document_texts(42)
    with pytest.raises(TypeError):
        document_texts([1, 2])
    assert document_texts({"page_content": "a doc", "metadata": {}}) == ["a doc"]  # a Document's dict form
    assert document_texts(t for t in ("a", "b")) == ["a", "b"]


@pytest.mark.parametrize("value, named", [({"text": "The secret word is marmalade."}, "got dict"),
                                          (b"The secret word is marmalade.", "got bytes (decode it to a string first)"),
                                          (bytearray(b"abc"), "got bytearray")])
def test_document_texts_refuses_a_mapping_or_bytes_instead_of_reading_keys_or_byte_values(value, named):
    """A dict without page_content would give its keys as documents, bytes their integer values."""
    with pytest.raises(TypeError, match="context must be a string, a Document, or a list") as exc:
        document_texts(value)
    assert named in str(exc.value)


# --------------------------------------------------------------------------- parsing


def test_request_from_marked_prompt():
    msgs = [SystemMessage("Be brief."), *qgpm_prompt("Use the notes.").invoke({"context": DOCS, "question": "When?"}).to_messages()]
    req = build_request(msgs, {})
    assert req.mode == "context" and req.shape == "marked"
    assert list(req.documents) == [d.page_content for d in DOCS]
    assert req.question == "When?"
    assert req.instruction == "Use the notes."
    assert req.system == "Be brief."


def test_request_history_goes_into_instruction():
    marked = _human(qgpm_prompt().invoke({"context": DOCS, "question": "And the skeleton?"}).to_messages())
    req = build_request([HumanMessage("When did the bakery open?"), AIMessage("In 1990."), marked], {})
    assert req.mode == "context"
    assert req.instruction.startswith("Conversation so far:\nUser: When did the bakery open?\nAssistant: In 1990.")


def test_request_from_kwargs():
    req = build_request([SystemMessage("S"), HumanMessage("When was it found?")], {"context": DOCS})
    assert (req.mode, req.shape, req.question, req.system) == ("context", "kwargs", "When was it found?", "S")
    assert list(req.documents) == [d.page_content for d in DOCS]
    req = build_request([HumanMessage("ignored")], {"context": "One text.", "question": "Real question?"})
    assert list(req.documents) == ["One text."] and req.question == "Real question?"


def test_request_marked_question_without_question_block_uses_unmarked_text():
    msg = HumanMessage(content=[context_block("Some context."), {"type": "text", "text": "What is it?"}])
    req = build_request([msg], {})
    assert req.question == "What is it?" and req.instruction is None


def test_request_plain_without_context():
    req = build_request([SystemMessage("S"), HumanMessage("hi"), AIMessage("hello"), HumanMessage("bye")], {})
    assert req.mode == "plain"
    assert [m["role"] for m in req.messages] == ["system", "user", "assistant", "user"]
    assert "no context" in req.reason


def test_request_empty_context_is_empty_context_mode_with_reason():
    msgs = qgpm_prompt().invoke({"context": [], "question": "When?"}).to_messages()
    req = build_request(msgs, {})
    assert req.mode == "empty_context" and "empty" in req.reason and req.shape == "marked"
    assert req.question == "When?" and req.messages == ()
    for ctx in ([], "", "   ", [""]):
        req = build_request([HumanMessage("When?")], {"context": ctx})
        assert req.mode == "empty_context" and req.shape == "kwargs" and "context= is empty" in req.reason


@pytest.mark.parametrize("question", ["", "   "])
def test_request_empty_question_raises(question):
    msgs = qgpm_prompt().invoke({"context": DOCS, "question": question}).to_messages()
    with pytest.raises(ValueError, match="question is empty"):
        build_request(msgs, {})
    with pytest.raises(ValueError, match="question is empty"):
        build_request([SystemMessage("S")], {"context": DOCS})


def test_non_text_blocks_are_rejected():
    msg = HumanMessage(content=[{"type": "image", "url": "https://example.com/a.png"}, {"type": "text", "text": "hi"}])
    with pytest.raises(ValueError, match="text only"):
        build_request([msg], {})


# --------------------------------------------------------------------------- construction


def test_instantiation_is_lazy_and_validated():
    llm = QGPMChatModel(model="/no/such/model", max_tokens=5, api_key="ignored", max_retries=3, timeout=30)
    assert llm.model_name == "/no/such/model" and llm.timeout == 30
    with pytest.raises(ValueError, match="timeout"):
        QGPMChatModel(model="/no/such/model", timeout=0)
    with pytest.raises(Exception):
        QGPMChatModel(max_tokenz=5)
    with pytest.raises(Exception):
        QGPMChatModel(method="nope")
    with pytest.raises(Exception):
        QGPMChatModel(engine=object(), model="x")
    assert QGPMChatModel(max_new_tokens=7).max_tokens == 7


def test_ls_params_and_identity():
    llm = QGPMChatModel(max_tokens=9, temperature=0.5, stop=["\n"])
    ls = llm._get_ls_params()
    assert ls["ls_provider"] == "qgpm" and ls["ls_model_type"] == "chat"
    assert ls["ls_model_name"] == "SmolLM2-135M-Instruct"
    assert (ls["ls_max_tokens"], ls["ls_temperature"], ls["ls_stop"]) == (9, 0.5, ["\n"])
    assert llm._get_ls_params(model="other")["ls_model_name"] == "other"
    assert llm._llm_type == "qgpm-chat"
    assert llm._identifying_params["method"] == "qgpm"
