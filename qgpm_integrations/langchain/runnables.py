"""``qgpm_answer``: a runnable that takes ``{"context": documents, "question": str}`` directly.

A LangChain RAG chain already holds the retrieved documents and the question apart; this
runnable hands them to :class:`QGPMChatModel` as they are (its ``context=`` / ``question=``
call arguments), so no prompt is rendered and parsed back:

    chain = {"context": retriever, "question": RunnablePassthrough()} | qgpm_answer(llm) | StrOutputParser()

It returns the chat model's ``AIMessage`` (``response_metadata["qgpm"]`` included); callbacks,
tags, ``batch`` / ``ainvoke`` and ``stream`` / ``astream`` (the answer piece by piece) go through
the chat model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.runnables import Runnable, RunnableLambda

from .call_args import check_call_kwargs
from .chat_models import QGPMChatModel

__all__ = ["qgpm_answer"]


def qgpm_answer(llm: QGPMChatModel, *, context_key: str = "context", question_key: str = "question", **call_kwargs: Any) -> Runnable:
    """A runnable from ``{context_key: documents, question_key: question}`` to ``llm``'s answer.

    ``documents``: a string, a ``Document`` or a list of them (each document is one unit of the
    context). ``call_kwargs``: per-call settings of :class:`QGPMChatModel` (``method``, ``k``, ...).
    """
    if not isinstance(llm, QGPMChatModel):
        raise TypeError(f"qgpm_answer needs a QGPMChatModel, got {type(llm).__name__}")
    for name in ("context", "question", "messages"):
        if name in call_kwargs:
            raise TypeError(f"qgpm_answer takes the {name} from its input, not as {name}=")
    check_call_kwargs({k: v for k, v in call_kwargs.items() if k != "stop"})  # an unknown name fails here, not at the first call

    def split(inputs: Any) -> tuple[Any, str]:
        if not isinstance(inputs, Mapping) or context_key not in inputs or question_key not in inputs:
            got = sorted(inputs) if isinstance(inputs, Mapping) else type(inputs).__name__
            raise TypeError(f"qgpm_answer takes a dict with {context_key!r} (documents) and {question_key!r} (a string), got {got}")
        question = inputs[question_key]
        if not isinstance(question, str):
            raise TypeError(f"{question_key!r} must be a string, got {type(question).__name__}")
        return inputs[context_key], question

    def answer(inputs: Any) -> Runnable:
        # A runnable returned here runs with this step's config and callbacks, and streams when the chain does.
        docs, question = split(inputs)
        message = RunnableLambda(lambda _: [HumanMessage(question)], name="question")
        return message | llm.bind(context=docs, question=question, **call_kwargs)

    return RunnableLambda(answer, name="qgpm_answer")
