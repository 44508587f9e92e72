"""qgpm_answer: a RAG chain hands the documents and the question over as they are."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.documents import Document
from langchain_core.messages import HumanMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.runnables import RunnableLambda, RunnablePassthrough

from qgpm_integrations.langchain import QGPMChatModel, qgpm_answer

USES_REAL_MODEL = True

DOCS = [Document(page_content=" ".join(f"Stall {i} sold bread and cheese." for i in range(40))),
        Document(page_content="The secret password for the blue door is tangerine."),
        Document(page_content=" ".join(f"Boat {i} left at dawn." for i in range(40)))]
QUESTION = "What is the secret password for the blue door?"


def test_the_runnable_answers_as_the_chat_model_with_its_arguments(lc_engine):
    llm = QGPMChatModel(engine=lc_engine, max_new_tokens=24)
    got = qgpm_answer(llm).invoke({"context": DOCS, "question": QUESTION})
    want = llm.invoke([HumanMessage(QUESTION)], context=DOCS, question=QUESTION)
    assert got.content == want.content and "tangerine" in got.content.lower()
    meta = got.response_metadata["qgpm"]
    assert meta["mode"] == "context" and meta["source"] == "kwargs" and meta["documents"] == 3
    retriever = RunnableLambda(lambda q: DOCS)
    chain = {"context": retriever, "question": RunnablePassthrough()} | qgpm_answer(llm, method="vanilla") | StrOutputParser()
    assert chain.invoke(QUESTION) == llm.invoke([HumanMessage(QUESTION)], context=DOCS, question=QUESTION, method="vanilla").content
    assert asyncio.run(qgpm_answer(llm).ainvoke({"context": DOCS, "question": QUESTION})).content == got.content


def test_bad_input_is_named(lc_engine):
    llm = QGPMChatModel(engine=lc_engine, max_new_tokens=4)
    with pytest.raises(TypeError, match="'context' .*'question'"):
        qgpm_answer(llm).invoke({"input": QUESTION})
    with pytest.raises(TypeError, match="must be a string"):
        qgpm_answer(llm).invoke({"context": DOCS, "question": 3})
    with pytest.raises(TypeError, match="from its input"):
        qgpm_answer(llm, question="x")
    with pytest.raises(TypeError, match="QGPMChatModel"):
        qgpm_answer(object())


def test_the_runnable_streams_the_answer_piece_by_piece_with_callbacks(lc_engine):
    """In a streamed chain the answer comes as the chat model's chunks (not one message at the end),
    on_llm_new_token sees each, and the pieces join to the invoked answer."""
    from langchain_core.callbacks import BaseCallbackHandler

    class Tokens(BaseCallbackHandler):
        def __init__(self) -> None:
            self.tokens: list[str] = []

        def on_llm_new_token(self, token: str, **kwargs) -> None:
            self.tokens.append(token)

    llm = QGPMChatModel(engine=lc_engine, max_new_tokens=16)
    chain = {"context": RunnableLambda(lambda q: DOCS), "question": RunnablePassthrough()} | qgpm_answer(llm) | StrOutputParser()
    seen = Tokens()
    pieces = list(chain.stream(QUESTION, config={"callbacks": [seen]}))
    assert len(pieces) > 1 and "".join(pieces) == chain.invoke(QUESTION)
    assert "".join(seen.tokens) == "".join(pieces)

    async def astream() -> list[str]:
        return [p async for p in chain.astream(QUESTION)]

    assert asyncio.run(astream()) == pieces


def test_an_unknown_call_argument_fails_when_the_runnable_is_built():
    llm = QGPMChatModel(max_new_tokens=4)  # lazy: nothing loads
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['foo'\]"):
        qgpm_answer(llm, foo=1)
    qgpm_answer(llm, method="vanilla", stop=["\n"])  # call settings and stop strings are taken
