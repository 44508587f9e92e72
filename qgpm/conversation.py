"""Chat messages -> one engine request, and the report of its answer.

A chat adapter converts its framework's messages to qgpm's role / content dicts
(``{"role": "system" | "user" | "assistant", "content": str | text blocks}``, as
:mod:`qgpm.chat_prompt` reads them); everything after that is here, the same for every
adapter:

* :func:`chat_request` reads the messages (:func:`~qgpm.chat_prompt.read_chat`: the
  context, the question, and the instruction with the earlier turns folded in) and applies
  the **no-context policy** given as ``on_empty_context``. A context that is there but
  empty (a retriever that found nothing) is never answered from nothing: ``"reply"``
  answers :data:`NO_CONTEXT_REPLY` without running the model, ``"raise"`` raises
  :class:`~qgpm.EmptyContextError`. Messages without any context are a plain chat request.
* :meth:`ChatRequest.run` / :meth:`ChatRequest.stream` send the request to an engine:
  :meth:`QGPM.answer <qgpm.QGPM.answer>` / ``stream`` with a context, ``chat`` /
  ``stream_chat`` without.
* :meth:`ChatRequest.report` says what was taken as context and question and what the
  answer rests on (the top sentences, the edit, timings), as a JSON-ready dict.
* :func:`context_block`, :func:`question_block` and :func:`expand_context` write the
  marked content blocks that :func:`~qgpm.chat_prompt.read_chat` reads first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Literal, Mapping, Protocol, Sequence, cast

from .chat_prompt import CONTEXT_ROLE, DOCUMENT_SEPARATOR, QUESTION_ROLE, ROLE_KEY, ChatParts, read_chat
from .explain import sentence_rows
from .prompt import EmptyContextError
from .results import QGPMResult

__all__ = [
    "NO_CONTEXT_REPLY",
    "EMPTY_CONTEXT_POLICIES",
    "DOC_KEY",
    "EmptyContextPolicy",
    "ChatRequest",
    "ChatStream",
    "chat_request",
    "check_empty_context_policy",
    "no_context_result",
    "context_block",
    "question_block",
    "expand_context",
]

NO_CONTEXT_REPLY = "I found no context to answer from: no documents were retrieved for this question."
"""The reply to a request whose context is empty (``on_empty_context="reply"``, the default).

The model is not run: an empty retrieval result is visible as this fixed text (and as
``report()["mode"] == "empty_context"``), never as a made-up answer."""

EmptyContextPolicy = Literal["reply", "raise"]
EMPTY_CONTEXT_POLICIES: tuple[str, ...] = ("reply", "raise")
"""The values of ``on_empty_context``."""

DOC_KEY = "qgpm_doc"
"""Extra key holding the document index of a marked context block (informational)."""


def check_empty_context_policy(policy: Any) -> EmptyContextPolicy:
    """``policy`` if it is one of :data:`EMPTY_CONTEXT_POLICIES`; raises ``ValueError`` otherwise."""
    if policy not in EMPTY_CONTEXT_POLICIES:
        raise ValueError(f"on_empty_context must be one of {EMPTY_CONTEXT_POLICIES}, got {policy!r}")
    return cast(EmptyContextPolicy, policy)


def no_context_result() -> QGPMResult:
    """The result of a request with an empty context: :data:`NO_CONTEXT_REPLY`, no model run."""
    return QGPMResult(text=NO_CONTEXT_REPLY, method="none", finish_reason="stop", details={"empty_context": True})


class ChatStream(Protocol):
    """What :meth:`ChatRequest.stream` returns (:class:`~qgpm.results.AnswerStream` is one): the
    answer's text pieces, then ``result``; ``close()`` stops generation early, ``cancel()``
    stops it from another thread without waiting."""

    @property
    def result(self) -> QGPMResult | None: ...

    def __iter__(self) -> Iterator[str]: ...

    def __next__(self) -> str: ...

    def close(self) -> None: ...

    def cancel(self) -> None: ...


class _ReplyStream:
    """A finished result as a one-piece stream, shaped like :class:`~qgpm.results.AnswerStream`:
    an iterator of text pieces with ``result`` set once it is exhausted, and ``close()``."""

    def __init__(self, result: QGPMResult) -> None:
        self._result = result
        self._state: Literal["pending", "sent", "done"] = "pending"
        self.result: QGPMResult | None = None

    def __iter__(self) -> _ReplyStream:
        return self

    def __next__(self) -> str:
        if self._state == "pending":
            self._state = "sent"
            return self._result.text
        if self._state == "sent":
            self._state, self.result = "done", self._result
        raise StopIteration

    def close(self) -> None:
        self._state = "done"

    def cancel(self) -> None:
        self.close()


@dataclass(frozen=True)
class ChatRequest:
    """What one chat call asks of an engine: :class:`~qgpm.chat_prompt.ChatParts` under a
    no-context policy.

    Built by :func:`chat_request` (or from parts already read); construction checks
    ``on_empty_context`` and raises :class:`~qgpm.EmptyContextError` for an empty context
    under ``"raise"``, so a request that exists can always be run.
    """

    parts: ChatParts
    on_empty_context: EmptyContextPolicy = "reply"

    def __post_init__(self) -> None:
        check_empty_context_policy(self.on_empty_context)
        if self.parts.mode == "empty_context" and self.on_empty_context == "raise":
            raise EmptyContextError(
                f"{self.parts.reason}; there is nothing to answer from. Check the retriever, or pass "
                f"on_empty_context='reply' to get the fixed reply {NO_CONTEXT_REPLY!r} instead."
            )

    @property
    def mode(self) -> str:
        """``"context"``, ``"plain"`` or ``"empty_context"`` (:attr:`ChatParts.mode <qgpm.chat_prompt.ChatParts.mode>`)."""
        return self.parts.mode

    @property
    def needs_engine(self) -> bool:
        """Whether running the request needs an engine (the fixed no-context reply does not)."""
        return self.parts.mode != "empty_context"

    @property
    def source(self) -> str:
        """Where the context came from: ``"kwargs"`` (given with the call) or ``"prompt"``."""
        return "kwargs" if self.parts.shape == "kwargs" else "prompt"

    def prompt_kwargs(
        self,
        *,
        system: str | None = None,
        instruction: str | None = None,
        default_system: str | None = None,
        default_instruction: str | None = None,
    ) -> dict[str, Any]:
        """The prompt arguments of :meth:`QGPM.answer <qgpm.QGPM.answer>` for a context request.

        ``system`` / ``instruction`` (given with the call) replace what the messages hold;
        ``default_system`` / ``default_instruction`` (the caller's settings) are used where
        neither has one. The template that renders the prompt's own message is kept.
        """
        kw: dict[str, Any] = {
            "system": system or self.parts.system or default_system,
            "instruction": instruction or self.parts.instruction or default_instruction,
        }
        if self.parts.template is not None:
            kw["template"] = self.parts.template
        return kw

    def plain_messages(self, *, system: str | None = None, default_system: str | None = None) -> list[dict[str, Any]]:
        """The messages of a plain request: ``system`` (given with the call) replaces their system
        messages; ``default_system`` (the caller's setting) leads them where they carry none."""
        msgs = [dict(m) for m in self.parts.messages]
        if system:
            return [{"role": "system", "content": system}, *(m for m in msgs if m.get("role") != "system")]
        if default_system and not any(m.get("role") == "system" for m in msgs):
            return [{"role": "system", "content": default_system}, *msgs]
        return msgs

    def run(self, engine: Any, answer: Mapping[str, Any] | None = None, **decoding: Any) -> QGPMResult:
        """Answer the request on ``engine`` (``None`` is fine for the fixed no-context reply).

        ``answer``: further :meth:`QGPM.answer <qgpm.QGPM.answer>` arguments for a context
        request (``method``, :meth:`prompt_kwargs`, ``reranker``, ...); plain chat reads only its
        ``system`` and ``default_system`` (:meth:`plain_messages`). ``decoding``: ``max_new_tokens``, ``temperature``,
        ``stop``, ... for every mode.
        """
        if self.parts.mode == "empty_context":
            return no_context_result()
        engine = self._engine(engine)
        if self.parts.mode == "plain":
            return engine.chat(self._plain(answer), **decoding)
        return engine.answer(list(self.parts.documents), self.parts.question, **dict(answer or {}), **decoding)

    def stream(self, engine: Any, answer: Mapping[str, Any] | None = None, **decoding: Any) -> ChatStream:
        """:meth:`run`, piece by piece: an iterator of text pieces whose ``result`` holds the
        :class:`~qgpm.QGPMResult` once it is exhausted; ``close()`` stops generation."""
        if self.parts.mode == "empty_context":
            return _ReplyStream(no_context_result())
        engine = self._engine(engine)
        if self.parts.mode == "plain":
            return engine.stream_chat(self._plain(answer), **decoding)
        return engine.stream(list(self.parts.documents), self.parts.question, **dict(answer or {}), **decoding)

    def _plain(self, answer: Mapping[str, Any] | None) -> list[dict[str, Any]]:
        """The plain request's messages, with the system message of ``answer`` (its other keys belong to a context request)."""
        answer = answer or {}
        return self.plain_messages(system=answer.get("system"), default_system=answer.get("default_system"))

    def _engine(self, engine: Any) -> Any:
        if engine is None:
            raise ValueError(f"this {self.parts.mode} request runs the model: pass the QGPM engine to run it on")
        return engine

    def report(self, result: QGPMResult, *, top_k: int = 5, html: bool = False) -> dict[str, Any]:
        """What the request took and what ``result`` rests on, as a JSON-ready dict.

        Always ``mode`` and ``timings``; ``reason`` for plain chat and an empty context;
        with a context (empty or not) ``source``, ``documents``, ``question`` and ``prompt``
        (where each part was found: :attr:`ChatParts.found <qgpm.chat_prompt.ChatParts.found>`);
        for an answer over a context also ``method``, the ``top_k`` best ``top_sentences``
        with the ``explanation``, ``edit`` (Top-K / Reorder / LLMLingua-2) and ``details``,
        and with ``html`` the explanation page and every sentence's row (``html``,
        ``sentences``).
        """
        parts = self.parts
        info: dict[str, Any] = {"mode": parts.mode}
        if parts.mode == "plain":
            info["reason"] = parts.reason
        elif parts.mode == "empty_context":
            info.update(reason=parts.reason, source=self.source, documents=0, question=parts.question, prompt=dict(parts.found))
        else:
            info.update(
                method=result.method,
                source=self.source,
                documents=len(parts.documents),
                question=parts.question,
                prompt=dict(parts.found),
                top_sentences=[
                    {"rank": s.rank, "text": s.text, "doc": s.doc, "z": s.z, "broad": round(s.broad, 4), "sharp": round(s.sharp, 4),
                     "promoted": s.promoted, "term_dropped": s.term_dropped}
                    for s in result.top_sentences(top_k)
                ] if top_k else [],
                explanation=result.explain(top_k) if top_k else "",
            )
            if html:
                info["html"] = result.to_html()
                info["sentences"] = sentence_rows(result)
            if result.edit is not None and hasattr(result.edit, "compressed_tokens"):  # llmlingua-2: no chunks, token counts
                info["edit"] = {"mode": result.edit.mode, "original_tokens": result.edit.original_tokens,
                                "compressed_tokens": result.edit.compressed_tokens}
            elif result.edit is not None:
                info["edit"] = {
                    "mode": getattr(result.edit, "mode", result.method),
                    "kept": list(getattr(result.edit, "kept", [])),
                    "chunks": len(getattr(result.edit, "chunks", [])),
                }
            info["details"] = dict(result.details)  # {} for a call that set no fact (a Top-K / Reorder edit)
        t = result.timings
        info["timings"] = {
            "total_s": round(t.total_s, 4), "first_token_s": round(t.first_token_s, 4),
            "pass1_s": round(t.pass1_s, 4), "edit_s": round(t.edit_s, 4), "decode_s": round(t.decode_s, 4),
        }
        return info


def chat_request(
    messages: Sequence[Mapping[str, Any]],
    *,
    context: str | Sequence[str] | None = None,
    question: str | None = None,
    on_empty_context: EmptyContextPolicy = "reply",
    separator: str = DOCUMENT_SEPARATOR,
) -> ChatRequest:
    """The engine request of chat ``messages`` (role / content dicts).

    ``context`` / ``question`` given with the call take precedence over the messages
    (:func:`~qgpm.chat_prompt.read_chat`); ``on_empty_context`` is the no-context policy
    (see the module docs). Raises ``ValueError`` for no messages, an empty question or a
    non-text content block, :class:`~qgpm.EmptyContextError` for an empty context under
    ``"raise"``.
    """
    check_empty_context_policy(on_empty_context)
    parts = read_chat(messages, context=context, question=question, separator=separator)
    return ChatRequest(parts, on_empty_context=on_empty_context)


# --------------------------------------------------------------------------- marked content blocks


def context_block(text: str = "{context}", **extra: Any) -> dict[str, Any]:
    """A text content block marked as the context (``{"qgpm_role": "context"}``); ``extra``
    keys are added (e.g. :data:`DOC_KEY`). The default text is a template variable."""
    return {"type": "text", "text": text, ROLE_KEY: CONTEXT_ROLE, **extra}


def question_block(text: str = "{question}", **extra: Any) -> dict[str, Any]:
    """A text content block marked as the question (``{"qgpm_role": "question"}``); ``extra``
    keys are added. The default text is a template variable."""
    return {"type": "text", "text": text, ROLE_KEY: QUESTION_ROLE, **extra}


def expand_context(content: Any, documents: Sequence[str], placeholder: str, *, separator: str = DOCUMENT_SEPARATOR) -> Any:
    """Message ``content`` with ``placeholder`` replaced by ``documents``.

    A marked context block whose whole text is the placeholder becomes one block per
    document (its other keys kept, :data:`DOC_KEY` set to the document's index), or one
    empty marked block when there are no documents, so the context reads as empty rather
    than missing. Anywhere else the placeholder becomes the documents joined by
    ``separator``. Content without the placeholder is returned as it is (the same object).
    """
    joined = separator.join(documents)
    if isinstance(content, str):
        return content.replace(placeholder, joined) if placeholder in content else content
    if not isinstance(content, list) or not any(isinstance(b, Mapping) and placeholder in str(b.get("text", "")) for b in content):
        return content
    blocks: list[Any] = []
    for b in content:
        text = b.get("text") if isinstance(b, Mapping) else None
        if not isinstance(text, str) or placeholder not in text:
            blocks.append(b)
        elif text == placeholder and b.get(ROLE_KEY) == CONTEXT_ROLE:
            blocks.extend({**b, "text": d, DOC_KEY: i} for i, d in enumerate(documents))
            if not documents:
                blocks.append({**b, "text": ""})
        else:
            blocks.append({**b, "text": text.replace(placeholder, joined)})
    return blocks
