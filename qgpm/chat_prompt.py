"""Chat messages -> QGPM's prompt parts: which text is the context, which the question.

A chat framework hands a chat model a list of messages, not a context and a question.
This module reads them back out, so that a RAG prompt written for any chat model runs
with QGPM unchanged. Three sources, in this order:

1. **Arguments**: ``context=`` (and ``question=``) given with the call.
2. **Marked blocks**: text content blocks that carry ``"qgpm_role": "context"`` or
   ``"question"`` (what ``qgpm_integrations.langchain.qgpm_prompt`` builds).
3. **The prompt's shape** (:func:`find_context_block`), for the prompts RAG chains
   already use:

   * ``system_context``: the context in a system message, the question in the last
     user message (LangChain's ``create_stuff_documents_chain`` /
     ``create_retrieval_chain`` prompt);
   * ``one_message``: one user message with an instruction, the context and then a
     labelled question (``"... Context: {context} Question: {question}"``);
   * ``earlier_message``: the context in a user message, the question in a later one;
   * any of these with chat history between them: earlier turns are kept as
     conversation text before the instruction, never ranked as context.

   A context block (:mod:`qgpm.message_shape`) starts after a marker near the start of its
   message: a tag such as ``<context>``, a label line (``Context:``, ``Documents:``,
   ``Sources:``, ...), a label inside the instruction's first paragraph or a line of it that
   mentions the context and ends with a colon, a rule line (``-----``) after an instruction that mentions the context,
   or a blank line after such an instruction (then the block must be at least :data:`MIN_WEAK_CONTEXT_CHARS`
   characters or half the instruction's length, so that a short system prompt is not
   taken for documents). The documents are the block's parts between blank lines
   (LangChain's stuffed-document separator). The text before the marker is the
   instruction; the template keeps every other character of the message as written (a
   labelled question before a ``Context:`` label line, ``rlm/rag-prompt``, is moved after the
   context with its label, since QGPM reads relevance from a question that comes last).

Without any of these the call is plain chat (``mode == "plain"``, with the reason).
Where a marker is found but the block is empty (a retriever that found nothing) the
mode is ``"empty_context"``.

Message format: ``{"role": "system" | "user" | "assistant", "content": str | blocks}``
where blocks are strings or ``{"type": "text", "text": ...}`` dicts (other block types
raise; ``reasoning`` / ``thinking`` blocks are skipped).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

from .message_shape import DOCUMENT_SEPARATOR, MIN_WEAK_CONTEXT_CHARS, QUESTION_LABEL, ContextBlock, escape_template, find_context_block
from .prompt import has_visible_text

__all__ = [
    "ROLE_KEY",
    "CONTEXT_ROLE",
    "QUESTION_ROLE",
    "DOCUMENT_SEPARATOR",
    "MIN_WEAK_CONTEXT_CHARS",
    "ContextBlock",
    "ChatParts",
    "find_context_block",
    "read_chat",
    "message_text",
    "history_text",
]

ROLE_KEY = "qgpm_role"
"""Extra key of a text content block that marks it as the context or the question."""
CONTEXT_ROLE = "context"
QUESTION_ROLE = "question"

Shape = Literal["kwargs", "marked", "system_context", "one_message", "earlier_message"]


# --------------------------------------------------------------------------- message text


def _block_text(block: Any) -> str | None:
    """Text of one content block (``None`` for reasoning blocks, which are skipped)."""
    if isinstance(block, str):
        return block
    if isinstance(block, Mapping):
        kind = block.get("type")
        if kind in (None, "text", "text-plain") and isinstance(block.get("text"), str):
            return block["text"]
        if kind in ("reasoning", "thinking"):
            return None
        raise ValueError(
            f"QGPM reads text only; got a content block of type {kind!r} "
            "(images, audio, files and tool blocks are not supported): send their text instead"
        )
    raise ValueError(f"unsupported message content item: {type(block).__name__} (expected a string or a text block dict)")


def message_text(content: Any) -> str:
    """The text of a message's content (a string, or text blocks joined by a newline)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    return "\n".join(t for t in (_block_text(b) for b in content) if t)


def _is_marked(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(b, Mapping) and b.get(ROLE_KEY) in (CONTEXT_ROLE, QUESTION_ROLE) for b in content
    )


def history_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """Earlier chat turns as conversation text (``"Conversation so far:\\nUser: ..."``), or ``""``."""
    lines = []
    for m in messages:
        text = message_text(m.get("content")).strip()
        if text:
            lines.append(f"{str(m.get('role', 'user')).capitalize()}: {text}")
    return "Conversation so far:\n" + "\n".join(lines) if lines else ""


def _join(parts: Sequence[str | None]) -> str | None:
    text = "\n\n".join(p.strip() for p in parts if p and p.strip())
    return text or None


# --------------------------------------------------------------------------- a whole conversation


@dataclass(frozen=True)
class ChatParts:
    """What one chat call asks of QGPM.

    ``mode``: ``"context"`` (answer ``question`` from ``documents``), ``"plain"`` (no
    context found: answer ``messages`` as ordinary chat; ``reason`` says why) or
    ``"empty_context"`` (a context block was found but holds no text). ``template`` is
    the user-message template for :meth:`qgpm.QGPM.answer` (``None``: the engine's
    default). ``found`` says where each part was taken from (message indices, character
    spans in the message text, the marker): it is what a caller shows the user.
    """

    mode: Literal["context", "plain", "empty_context"]
    shape: Shape | None = None
    documents: tuple[str, ...] = ()
    question: str = ""
    instruction: str | None = None
    system: str | None = None
    template: str | None = None
    messages: tuple[dict[str, str], ...] = ()
    reason: str = ""
    found: dict[str, Any] = field(default_factory=dict)

    def engine_kwargs(self) -> dict[str, Any]:
        """The prompt arguments of :meth:`qgpm.QGPM.answer` (besides context and question)."""
        kw: dict[str, Any] = {"system": self.system, "instruction": self.instruction}
        if self.template is not None:
            kw["template"] = self.template
        return kw


def _plain(messages: Sequence[Mapping[str, Any]], question: str | None, reason: str) -> ChatParts:
    plain = [{"role": str(m.get("role", "user")), "content": message_text(m.get("content"))} for m in messages]
    if question is not None and question.strip():
        plain.append({"role": "user", "content": question})
    return ChatParts(mode="plain", messages=tuple(plain), reason=reason)


def _marked_parts(content: Any) -> tuple[list[str], str, str | None]:
    """(context documents, question, instruction) of a marked message.

    Without a question block, the unmarked text is the question (and there is no
    instruction); with one, the unmarked text is the instruction.
    """
    ctx: list[str] = []
    q: list[str] = []
    other: list[str] = []
    for b in content if isinstance(content, list) else [content]:
        text = _block_text(b)
        if text is None:
            continue
        role = b.get(ROLE_KEY) if isinstance(b, Mapping) else None
        if role == CONTEXT_ROLE:
            if text.strip():
                ctx.append(text)
        elif role == QUESTION_ROLE:
            q.append(text)
        else:
            other.append(text)
    if q:
        return ctx, "\n".join(t.strip() for t in q if t.strip()), _join(other)
    return ctx, "\n".join(t.strip() for t in other if t.strip()), None


def _preview(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 2 * width + 5 else f"{text[:width]} ... {text[-width:]}"


def _strip_question_label(text: str) -> tuple[str, str]:
    """(label, question) of a question message such as ``"Question: ..."``, after any leading
    whitespace (blank lines included). A label with nothing visible after it is no label: the
    text is the question as it stands."""
    text = text.lstrip()
    m = QUESTION_LABEL.match(text)
    if m and has_visible_text(text[m.end() :]):
        rest = text[m.end() :]
        label_end = m.end() + len(rest) - len(rest.lstrip())  # a label on a line of its own keeps its line break
        return text[:label_end], text[label_end:].strip()
    return "", text.strip()


def _documents(context: Any) -> list[str]:
    if context is None:
        return []
    if isinstance(context, str):
        return [context] if context.strip() else []
    docs = list(context)
    for i, d in enumerate(docs):
        if not isinstance(d, str):
            raise TypeError(f"context item {i} is {type(d).__name__}; pass document texts (str)")
    return [d for d in docs if d.strip()]


def read_chat(
    messages: Sequence[Mapping[str, Any]],
    *,
    context: str | Sequence[str] | None = None,
    question: str | None = None,
    separator: str = DOCUMENT_SEPARATOR,
) -> ChatParts:
    """Split chat ``messages`` into QGPM's parts (see the module docs for the three sources).

    ``context`` / ``question``: given with the call, they take precedence (``question``
    defaults to the marked question block or the last user message). Raises ``ValueError``
    for no messages, a context without a question, or a non-text content block.
    """
    if not messages:
        raise ValueError("no messages: pass at least one message")
    roles = [str(m.get("role", "user")) for m in messages]
    user_idx = [i for i, r in enumerate(roles) if r == "user"]
    last_user = user_idx[-1] if user_idx else None
    marked_idx = next((i for i in range(len(messages) - 1, -1, -1) if _is_marked(messages[i].get("content"))), None)
    systems = {i: message_text(messages[i].get("content")) for i, r in enumerate(roles) if r == "system"}

    def finish(shape: Shape, docs: list[str], q: str, instruction: str | None, used: set[int], *,
               template: str | None = None, found: dict[str, Any] | None = None, source_reason: str = "") -> ChatParts:
        if not isinstance(q, str) or not q.strip():
            raise ValueError(
                "question is empty: QGPM needs a question to rank the context against. Put it in the "
                "{'qgpm_role': 'question'} block of the prompt, pass question=..., or send it as the last user "
                "message when the context comes from elsewhere"
            )
        info = dict(found or {})
        info.update(shape=shape, question=q.strip())
        if not docs:
            return ChatParts(mode="empty_context", shape=shape, question=q.strip(), found=info,
                             reason=source_reason or "the context is empty (no documents, e.g. the retriever found nothing)")
        history = [messages[i] for i in range(len(messages)) if i not in used and roles[i] != "system"]
        hist = history_text(history)
        if hist:
            if template is not None and "{instruction}" not in template:
                template, instruction = "{instruction}\n\n" + template, hist
            else:
                instruction = _join([hist, instruction or ""])
            info["history_messages"] = len(history)
        system = _join([systems[i] for i in sorted(systems) if i not in used])
        info.update(documents=len(docs), context_preview=_preview(separator.join(docs)))
        return ChatParts(mode="context", shape=shape, documents=tuple(docs), question=q.strip(), instruction=instruction,
                         system=system, template=template, found=info)

    if context is not None:
        docs = _documents(context)
        if question is not None:
            q, qi = str(question), None
        elif marked_idx is not None:
            q, qi = _marked_parts(messages[marked_idx].get("content"))[1], marked_idx
        elif last_user is not None:
            q, qi = message_text(messages[last_user].get("content")), last_user
        else:
            q, qi = "", None
        instruction = _marked_parts(messages[marked_idx].get("content"))[2] if marked_idx is not None else None
        pivot = marked_idx if marked_idx is not None else last_user
        used = {pivot} if pivot is not None else set()
        return finish("kwargs", docs, q, instruction, used, found={"question_message": qi},
                      source_reason="context= is empty (no documents, e.g. the retriever found nothing)")
    if marked_idx is not None:
        docs, q, instruction = _marked_parts(messages[marked_idx].get("content"))
        if question is not None:
            q = str(question)
        return finish("marked", docs, q, instruction, {marked_idx}, found={"context_message": marked_idx},
                      source_reason="the marked context is empty (no documents, e.g. the retriever found nothing)")
    if last_user is None:
        return _plain(messages, question, "no user message holds a question")

    def found_at(i: int, block: ContextBlock) -> dict[str, Any]:
        out = {"context_message": i, "context_role": roles[i], "context_chars": [block.start, block.end], "marker": block.marker}
        if block.instruction:
            out["instruction_preview"] = _preview(block.instruction)
        return out

    last_text = message_text(messages[last_user].get("content"))
    if question is None:
        block = find_context_block(last_text, with_question=True)
        if block is not None:
            info = found_at(last_user, block)
            info.update(question_message=last_user, question_chars=[block.question_start, block.question_end])
            return finish("one_message", [] if block.empty else block.documents(separator), block.question or "",
                          block.instruction, {last_user}, template=block.template(question_here=True), found=info)
    candidates = [i for i in sorted(systems)] + [i for i in reversed(user_idx) if i != last_user]
    if question is not None:
        candidates = [last_user] + candidates
    for i in candidates:
        block = find_context_block(message_text(messages[i].get("content")), with_question=False)
        if block is None:
            continue
        if question is not None:
            label, q = "", str(question)
            used = {i}
        else:
            label, q = _strip_question_label(last_text)
            used = {i, last_user}
        template = block.template(question_here=False)
        if label:
            template = template[: -len("{question}")] + escape_template(label) + "{question}"
        info = found_at(i, block)
        if question is None:
            q0 = len(last_text) - len(last_text.lstrip()) + len(label)
            info.update(question_message=last_user, question_chars=[q0, q0 + len(q)])
        shape: Shape = "system_context" if roles[i] == "system" else "earlier_message"
        return finish(shape, [] if block.empty else block.documents(separator), q, block.instruction, used,
                      template=template, found=info)
    return _plain(messages, question, "no context was marked, passed as context=, or found in the prompt's shape")
