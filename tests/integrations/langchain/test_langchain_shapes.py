"""QGPM inside LangChain's own RAG prompts, unchanged: the context and question are found from
the messages' shape (real templates from langchain_classic / langchain_core, real SmolLM2)."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_classic.chains.combine_documents import create_stuff_documents_chain
from langchain_classic.chains.question_answering import stuff_prompt
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate

from qgpm_integrations.langchain import QGPMChatModel
from qgpm_lc_support import load_prompt_shapes

USES_REAL_MODEL = True

DOCS = [
    Document("The Millstone Bakery opened in 1990 on Bridge Street. It sells rye bread and honey cake."),
    Document(
        "The town museum owns the skeleton of a whale. The skeleton was found in 1921 near the old harbor wall. "
        "School classes visit it every spring."
    ),
]
QUESTION = "In which year was the whale skeleton found?"
EVIDENCE = "The skeleton was found in 1921 near the old harbor wall."


class _Capture(BaseCallbackHandler):
    """Keeps the chat model's messages as the chain built them."""

    def __init__(self) -> None:
        self.outputs: list[Any] = []

    def on_llm_end(self, response, **kwargs: Any) -> None:
        self.outputs.append(response.generations[0][0].message)


def _prompts() -> dict[str, tuple[Any, dict[str, Any]]]:
    """shape -> (prompt, extra inputs): LangChain's own templates where it ships one (the benchmark's set)."""
    return load_prompt_shapes().prompts()


@pytest.fixture(scope="module")
def llm(lc_engine):
    return QGPMChatModel(engine=lc_engine, method="qgpm", max_tokens=12)


@pytest.mark.parametrize("name", list(_prompts()))
def test_stuff_documents_chain_runs_qgpm_with_the_prompt_as_written(llm, name, caplog):
    prompt, extra = _prompts()[name]
    chain = create_stuff_documents_chain(llm, prompt)
    capture = _Capture()
    with caplog.at_level("WARNING", logger="qgpm.langchain"):
        answer = chain.invoke({"context": DOCS, "question": QUESTION, **extra}, config={"callbacks": [capture]})
    assert "no context" not in caplog.text
    (message,) = capture.outputs
    assert message.content == answer
    info = message.response_metadata["qgpm"]
    assert info["mode"] == "context", info.get("reason")
    found = info["prompt"]
    assert found["shape"] == ("system_context" if name == "history" else name)
    assert info["question"] == QUESTION, "the question must be the human's question, never the template's instruction"
    assert info["documents"] == 2, "the stuffed documents' separator gives the document boundaries"
    assert found["context_preview"].startswith("The Millstone Bakery opened in 1990")
    assert found["context_preview"].endswith("School classes visit it every spring.")
    if name == "history":
        assert found["history_messages"] == 2
        history = " ".join(text for _, text in load_prompt_shapes().HISTORY)
        assert all(s["text"] not in history for s in info["top_sentences"]), "history is not context"
    texts = [s["text"] for s in info["top_sentences"]]
    assert EVIDENCE in texts[:2], info["explanation"]


def test_prompt_without_context_block_still_answers_plainly_with_the_warning(lc_engine, caplog):
    llm = QGPMChatModel(engine=lc_engine, method="qgpm", max_tokens=4)
    prompt = ChatPromptTemplate.from_messages([("system", "You are a friendly assistant."), ("human", "{question}")])
    with caplog.at_level("WARNING", logger="qgpm.langchain"):
        message = (prompt | llm).invoke({"question": "Say hello."})
    assert message.response_metadata["qgpm"]["mode"] == "plain"
    assert "found no context" in caplog.text


def test_retriever_that_found_nothing_gets_the_fixed_reply(lc_engine):
    from qgpm_integrations.langchain import NO_CONTEXT_REPLY

    llm = QGPMChatModel(engine=lc_engine, method="qgpm", max_tokens=4)
    chain = create_stuff_documents_chain(llm, stuff_prompt.CHAT_PROMPT)
    assert chain.invoke({"context": [], "question": QUESTION}) == NO_CONTEXT_REPLY


def test_relevance_source_setting_reaches_the_engine(lc_engine):
    llm = QGPMChatModel(engine=lc_engine, method="qgpm", max_tokens=4, relevance="bm25")
    msg = llm.invoke(stuff_prompt.CHAT_PROMPT.invoke({"context": "\n\n".join(d.page_content for d in DOCS), "question": QUESTION}))
    info = msg.response_metadata["qgpm"]
    assert info["details"]["relevance_source"] == "bm25" and info["details"]["layers_run"] == 0
    assert "ranked by bm25" in info["explanation"]
    with pytest.raises(ValueError, match="relevance"):
        QGPMChatModel(engine=lc_engine, relevance="bm25+heads")
    with pytest.raises(ValueError, match="takes none"):
        llm.invoke("hi", context=[d.page_content for d in DOCS], method="vanilla", relevance="bm25")
    with pytest.raises(ValueError, match="takes none"):
        QGPMChatModel(engine=lc_engine, method="vanilla", relevance="bm25")
