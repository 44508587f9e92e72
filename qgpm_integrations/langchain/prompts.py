"""Prompt helpers that mark the context and the question for :class:`QGPMChatModel`.

QGPM needs to know which part of the prompt is the context (the text it ranks and
re-positions) and which part is the question (the text that drives pass 1). In an
ordinary LCEL chain both arrive inside one human message, so the prompt marks them:
the human message's content is a list of text blocks, and the blocks that hold the
context and the question carry an extra key ``"qgpm_role"``::

    [{"type": "text", "text": "Answer the question using the text below."},
     {"type": "text", "text": "<document 1>", "qgpm_role": "context", "qgpm_doc": 0},
     {"type": "text", "text": "<document 2>", "qgpm_role": "context", "qgpm_doc": 1},
     {"type": "text", "text": "Who ...?", "qgpm_role": "question"}]

LangChain keeps extra keys of raw dict content blocks through prompt formatting and
message conversion, and any other chat model simply reads the blocks as text.

* :func:`qgpm_prompt` builds such a :class:`QGPMPromptTemplate` (a
  ``ChatPromptTemplate``). When its context variable receives a list of documents
  (strings or ``Document`` objects, e.g. straight from a retriever or from
  :func:`format_documents`), it emits one context block per document so document
  boundaries survive.
* :func:`format_documents` turns retrieved ``Document`` objects into a
  :class:`QGPMDocuments` list of strings. It prints as the documents joined by a blank
  line, so it also works in a plain ``ChatPromptTemplate``.
* :func:`context_block` / :func:`question_block` build marked blocks by hand
  (:mod:`qgpm.conversation`, which also splits the context into one block per document).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from langchain_core.documents import Document
from langchain_core.messages import BaseMessage
from langchain_core.prompts import ChatPromptTemplate

from qgpm.chat_prompt import CONTEXT_ROLE, DOCUMENT_SEPARATOR, QUESTION_ROLE, ROLE_KEY
from qgpm.conversation import DOC_KEY, context_block, expand_context, question_block

__all__ = [
    "QGPM_ROLE_KEY",
    "QGPM_DOC_KEY",
    "CONTEXT_ROLE",
    "QUESTION_ROLE",
    "DOCUMENT_SEPARATOR",
    "QGPMDocuments",
    "format_documents",
    "document_texts",
    "context_block",
    "question_block",
    "QGPMPromptTemplate",
    "qgpm_prompt",
]

QGPM_ROLE_KEY = ROLE_KEY
"""Extra key of a text content block that tells QGPM what the block is (``qgpm.chat_prompt.ROLE_KEY``)."""
QGPM_DOC_KEY = DOC_KEY
"""Extra key holding the document index of a context block (informational; ``qgpm.conversation.DOC_KEY``)."""

# A private-use sentinel that stands for the context while the template is formatted.
_PLACEHOLDER = "\ue000qgpm-context\ue000"


class QGPMDocuments(list):
    """A list of document texts that formats as the documents joined by a blank line.

    :class:`QGPMPromptTemplate` turns it into one context block per document; any other
    prompt template (f-string, mustache, jinja2) sees the joined text.
    """

    separator: str = DOCUMENT_SEPARATOR

    def __str__(self) -> str:
        return self.separator.join(str(d) for d in self)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def _text_of(item: Any) -> str:
    if isinstance(item, Document):
        return item.page_content
    if isinstance(item, str):
        return item
    if isinstance(item, dict) and isinstance(item.get("page_content"), str):
        return item["page_content"]
    raise TypeError(
        f"context items must be strings or langchain Document objects, got {type(item).__name__}"
    )


def document_texts(context: Any) -> list[str]:
    """Normalize a context to a list of non-empty document strings.

    Accepts a string, a ``Document`` (or its dict form, with ``page_content``), or an iterable
    of those. Whitespace-only documents are dropped; ``None`` gives ``[]``. Another mapping, or
    bytes, raises ``TypeError`` (their keys or byte values are not documents).
    """
    if context is None:
        return []
    if isinstance(context, (str, Document)):
        items: Iterable[Any] = [context]
    elif isinstance(context, Mapping) and "page_content" in context:
        items = [context]
    elif isinstance(context, Iterable) and not isinstance(context, (Mapping, bytes, bytearray, memoryview)):
        items = context
    else:
        hint = " (decode it to a string first)" if isinstance(context, (bytes, bytearray, memoryview)) else ""
        raise TypeError(
            "context must be a string, a Document, or a list of strings/Documents, "
            f"got {type(context).__name__}{hint}"
        )
    return [t for t in (_text_of(i) for i in items) if t.strip()]


def format_documents(documents: Iterable[Document | str], *, with_source: bool = False) -> QGPMDocuments:
    """Retrieved documents -> a :class:`QGPMDocuments` list of their texts (order kept).

    Use it as the step after a retriever: ``retriever | format_documents``.

    Args:
        documents: ``Document`` objects (or strings).
        with_source: Prefix each text with ``"[source] "`` taken from
            ``metadata["source"]`` when present.
    """
    out = QGPMDocuments()
    for d in documents:
        text = _text_of(d)
        if not text.strip():
            continue
        if with_source and isinstance(d, Document) and d.metadata.get("source"):
            text = f"[{d.metadata['source']}] {text}"
        out.append(text)
    return out


def _expand_context(messages: list[BaseMessage], docs: list[str]) -> list[BaseMessage]:
    """The messages with the placeholder replaced by the documents (:func:`qgpm.conversation.expand_context`)."""
    out: list[BaseMessage] = []
    for msg in messages:
        content = expand_context(msg.content, docs, _PLACEHOLDER)
        out.append(msg if content is msg.content else msg.model_copy(update={"content": content}))
    return out


class QGPMPromptTemplate(ChatPromptTemplate):
    """A ``ChatPromptTemplate`` that keeps document boundaries in the marked context.

    If the value of :attr:`context_variable` is not a plain string (a list of strings
    or ``Document`` objects, a :class:`QGPMDocuments`, a single ``Document``), each
    document becomes its own ``{"qgpm_role": "context"}`` text block. A plain string
    stays one block. Everything else behaves like ``ChatPromptTemplate``.
    """

    context_variable: str = "context"

    def _prepare(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], list[str] | None]:
        kwargs = self._merge_partial_and_user_variables(**kwargs)
        value = kwargs.get(self.context_variable)
        if value is None or isinstance(value, str):
            return kwargs, None
        docs = document_texts(value)
        return {**kwargs, self.context_variable: _PLACEHOLDER}, docs

    def format_messages(self, **kwargs: Any) -> list[BaseMessage]:
        kwargs, docs = self._prepare(kwargs)
        messages = super().format_messages(**kwargs)
        return messages if docs is None else _expand_context(messages, docs)

    async def aformat_messages(self, **kwargs: Any) -> list[BaseMessage]:
        kwargs, docs = self._prepare(kwargs)
        messages = await super().aformat_messages(**kwargs)
        return messages if docs is None else _expand_context(messages, docs)


def qgpm_prompt(
    instruction: str | None = None,
    *,
    system: str | None = None,
    context_variable: str = "context",
    question_variable: str = "question",
    question_label: str | None = None,
) -> QGPMPromptTemplate:
    """The standard RAG prompt with the context and question marked for QGPM.

    The human message is ``[instruction?, context, question]`` as text blocks; the
    context block is ``{"qgpm_role": "context"}`` (one per document when the context
    variable gets a list), the question block ``{"qgpm_role": "question"}``.

    Args:
        instruction: Text before the context (unmarked; QGPM uses it as its instruction).
            ``None`` lets :class:`QGPMChatModel` use its own default instruction.
        system: Optional system message.
        context_variable / question_variable: Names of the two input variables.
        question_label: Optional text put before the question inside its block,
            e.g. ``"Question: "``.

    Example:
        >>> chain = ({"context": retriever | format_documents, "question": RunnablePassthrough()}
        ...          | qgpm_prompt() | QGPMChatModel() | StrOutputParser())
    """
    if context_variable == question_variable:
        raise ValueError("context_variable and question_variable must differ")
    blocks: list[dict[str, Any]] = []
    if instruction:
        blocks.append({"type": "text", "text": instruction})
    blocks.append(context_block("{" + context_variable + "}"))
    blocks.append(question_block((question_label or "") + "{" + question_variable + "}"))
    messages: list[Any] = []
    if system:
        messages.append(("system", system))
    messages.append(("human", blocks))
    tmpl = QGPMPromptTemplate.from_messages(messages)
    tmpl.context_variable = context_variable
    return tmpl
