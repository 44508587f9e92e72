"""Reading the context and the question back out of a prompt a LlamaIndex synthesizer formatted.

``QGPMLLM`` receives what every LlamaIndex LLM receives: finished prompt text. Where that
text is a question-answering prompt, :func:`read_prompt` finds its parts, in this order:

1. **LlamaIndex's own default templates** (question answering, tree summarize and refine,
   in their completion and chat versions, taken from ``llama_index.core.prompts``): the
   text is matched against the template, so the context and the question come out exactly
   as the synthesizer put them in. On refine steps the earlier answer comes out too.
2. **The context templates of LlamaIndex's chat engines** (``context`` and
   ``condense_plus_context``, answer and refine, from ``llama_index.core.chat_engine``), as
   :func:`messages_to_prompt` joins a chat turn: the engine's system message opens the text,
   the user's message is its last paragraph and the question; the engine's system prompt and
   the earlier turns between them go to ``system_text``, never to the documents.
3. **Any other template** is read by the core's prompt-shape reader
   (:func:`qgpm.chat_prompt.find_context_block`): a context after a marker (a ``Context:``
   label, also inside the instruction's first paragraph, a ``<context>`` tag, a rule line
   after an instruction that mentions the context) and a labelled question at the end
   (``Question:`` / ``Query:``, optionally followed by an ``Answer:`` cue) or before a
   ``Context:`` label line. A context opened by a rule line ends at the same rule line where one
   closes it, as in LlamaIndex's templates.

The context is split into documents at blank lines (synthesizers join node texts with a
blank line; a node's own paragraphs become documents of their own; see
:func:`split_documents`). Prompts with no such
shape -- query rewriting, summaries without a question, any other component's prompt --
give ``None``: the LLM then generates plainly from the text.

No text of the prompt is dropped unseen: what is neither the template's own text nor the
context, the question and the earlier answer -- lines before a default template (other than
LlamaIndex's own default system prompts), the instruction before a context marker, text
between a closed context and the question -- comes back as :attr:`PromptParts.system_text`,
which ``QGPMLLM`` sends in the system message.
"""

from __future__ import annotations

import ast
import re
import string
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Optional, Sequence

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.prompts import chat_prompts, default_prompts

from qgpm.chat_prompt import find_context_block, history_text
from qgpm.message_shape import QUESTION_LABEL
from qgpm.prompt import has_visible_text

__all__ = ["PromptParts", "is_own_plain_prompt", "read_prompt", "split_documents", "split_context", "messages_to_prompt"]

_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_RULE_LINE = re.compile(r"[ \t]*(?:-{3,}|={3,}|\*{3,}|_{3,}|#{3,})[ \t]*")
_CONTEXT_VARS = ("context_str", "context_msg")
# A node's metadata block as LlamaIndex writes it ("{key}: {value}" lines): short keys, no blank line
_METADATA = re.compile(r"[A-Za-z_][\w.\- ]{0,40}:[^\n]{0,300}(?:\n[A-Za-z_][\w.\- ]{0,40}:[^\n]{0,300})*")
_HISTORY_HEAD = "Conversation so far:"  # how qgpm.chat_prompt.history_text opens the earlier turns


@dataclass(frozen=True)
class PromptParts:
    """What one QGPM answer is asked: documents, a question and, on refine steps, the answer so far.

    ``source`` says where the parts were found: ``"nodes"`` (handed over by
    :class:`~qgpm_integrations.llama_index.QGPMSynthesizer`), ``"template"`` (one of
    LlamaIndex's default templates) or ``"shape:<marker>"`` (the core's shape reader;
    the marker is ``label``, ``tag``, ``rule`` or ``paragraph``). ``system_text``: the rest
    of the prompt's own text, for the system message (see the module docs); ``None`` if none.
    """

    documents: tuple[str, ...]
    question: str
    existing_answer: Optional[str] = None
    source: str = "nodes"
    system_text: Optional[str] = None

    @property
    def step(self) -> str:
        """``"refine"`` when an earlier answer is being refined, else ``"qa"``."""
        return "qa" if self.existing_answer is None else "refine"


def split_documents(text: str) -> list[str]:
    """The blank-line-separated parts of ``text`` that hold visible text, stripped.

    A part made only of ``key: value`` lines -- a node's metadata, which LlamaIndex writes
    above the node's text with a blank line between (``"{metadata_str}\n\n{content}"``) --
    opens the part after it, so a node's source stays with its text, where the same keys open at
    least two parts and each time text of another shape follows (so "Q: ... / A: ..." entries,
    records of ``Name: ... / Beds: ...`` lines or a one-off "Note: ..." paragraph stay apart).
    With one node retrieved, its metadata stays a document of its own. A context formatted as a
    Python list of strings (older ``simple_summarize`` versions pass their context as a list,
    which the template formats with ``str``) is read back as that list.
    """
    texts = [text]
    stripped = text.strip()
    if stripped.startswith("[") and stripped.endswith("]"):
        try:
            value = ast.literal_eval(stripped)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            value = None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            texts = value
    parts = [p.strip() for t in texts for p in _BLANK_LINE.split(t) if has_visible_text(p)]
    keys = [tuple(line.split(":", 1)[0] for line in p.splitlines()) if _METADATA.fullmatch(p) else None for p in parts]
    opens: dict[tuple, list[bool]] = {}  # for each key set: is each of its parts followed by a part of another shape?
    for i, k in enumerate(keys):
        if k:
            opens.setdefault(k, []).append(i + 1 < len(parts) and keys[i + 1] != k)
    # metadata: key sets seen at least twice, each time above text of another shape (FAQ entries and records follow their own kind)
    meta = {k for k, after in opens.items() if len(after) >= 2 and all(after)}
    out: list[str] = []
    opening = False  # the last part out is a metadata block still waiting for its text
    for part, k in zip(parts, keys):
        if opening:
            out[-1] = f"{out[-1]}\n\n{part}"
        else:
            out.append(part)
        opening = not opening and k in meta
    return out


# --------------------------------------------------------------------------- LlamaIndex's default templates


def _default_templates() -> list[str]:
    """The user-message text of LlamaIndex's default QA, tree-summarize and refine templates."""
    texts = [default_prompts.DEFAULT_TEXT_QA_PROMPT_TMPL, default_prompts.DEFAULT_TREE_SUMMARIZE_TMPL,
             default_prompts.DEFAULT_REFINE_PROMPT_TMPL]
    for messages in (chat_prompts.TEXT_QA_PROMPT_TMPL_MSGS, chat_prompts.TREE_SUMMARIZE_PROMPT_TMPL_MSGS,
                     chat_prompts.CHAT_REFINE_PROMPT_TMPL_MSGS):
        texts += [m.content for m in messages if isinstance(m.content, str) and any(f"{{{v}}}" in m.content for v in _CONTEXT_VARS)]
    return list(dict.fromkeys(texts))


_READ_TEMPLATES = ("DEFAULT_SIMPLE_INPUT_TMPL", "DEFAULT_TEXT_QA_PROMPT_TMPL", "DEFAULT_REFINE_PROMPT_TMPL", "DEFAULT_TREE_SUMMARIZE_TMPL")


@lru_cache(maxsize=1)
def _own_plain_patterns() -> tuple[re.Pattern[str], ...]:
    """Patterns of LlamaIndex's own prompts that ask no question over nodes: the default
    templates other than question answering (summaries, keyword extraction, text to SQL, ...)
    and the chat engines' query rewriting."""
    from llama_index.core.chat_engine import condense_plus_context, condense_question

    texts = [v for k, v in vars(default_prompts).items() if k.endswith("_TMPL") and isinstance(v, str) and k not in _READ_TEMPLATES]
    texts += [condense_question.DEFAULT_TEMPLATE, condense_plus_context.DEFAULT_CONDENSE_PROMPT_TEMPLATE]
    return tuple(_template_pattern(t) for t in texts)


def is_own_plain_prompt(text: str) -> bool:
    """Whether ``text`` is one of LlamaIndex's own prompts that ask no question over nodes
    (:func:`_own_plain_patterns`), which ``QGPMLLM`` answers as plain chat by design."""
    return any(p.search(text) for p in _own_plain_patterns())


def _template_pattern(template: str, *, then_rest: bool = False) -> re.Pattern[str]:
    """A pattern that matches ``template`` formatted with any values, after any leading lines
    (``then_rest``: at the start of the text, with any text after it as the group ``rest``).

    Literal text must match exactly (trailing whitespace aside); the context variable takes
    as much text as it can (the template's own closing text is the last of its kind), every
    other variable as little.
    """
    out = [r"\A" if then_rest else r"(?:\A|(?<=\n))"]
    for literal, name, _, _ in string.Formatter().parse(template.rstrip()):
        out.append(re.escape(literal))
        if name is not None:
            out.append(f"(?P<{name}>.*)" if name in _CONTEXT_VARS else f"(?P<{name}>.*?)")
    out.append(r"(?P<rest>.*)\Z" if then_rest else r"\s*\Z")
    return re.compile("".join(out), re.S)


@lru_cache(maxsize=1)
def _default_patterns() -> tuple[re.Pattern[str], ...]:
    return tuple(_template_pattern(t) for t in _default_templates())


@lru_cache(maxsize=1)
def _default_system_texts() -> tuple[str, ...]:
    """The system messages of LlamaIndex's default chat templates (template text, not the caller's)."""
    texts = []
    for messages in (chat_prompts.TEXT_QA_PROMPT_TMPL_MSGS, chat_prompts.TREE_SUMMARIZE_PROMPT_TMPL_MSGS,
                     chat_prompts.CHAT_REFINE_PROMPT_TMPL_MSGS):
        texts += [m.content.strip() for m in messages if _ROLES.get(m.role) == "system" and isinstance(m.content, str) and m.content.strip()]
    return tuple(dict.fromkeys(texts))


def _kept_text(*pieces: str) -> Optional[str]:
    """The pieces that hold visible text, stripped and joined by a blank line (``None`` if none)."""
    kept = [p.strip() for p in pieces if has_visible_text(p)]
    return "\n\n".join(kept) or None


def _from_default_template(text: str) -> Optional[PromptParts]:
    for pattern in _default_patterns():
        m = pattern.search(text)
        if m is None:
            continue
        values = m.groupdict()
        context = values.get("context_str", values.get("context_msg")) or ""
        question = (values.get("query_str") or "").strip()
        documents = split_documents(context)
        if not documents or not question:
            return None
        existing = values.get("existing_answer")
        leading = text[: m.start()]
        for default in _default_system_texts():  # messages_to_prompt puts the chat template's system message first
            leading = leading.replace(default, "")
        return PromptParts(tuple(documents), question, None if existing is None else existing.strip(), "template", _kept_text(leading))
    return None


# --------------------------------------------------------------------------- the chat engines' context templates


def _chat_engine_templates() -> list[str]:
    """The system-message templates of LlamaIndex's ``context`` and ``condense_plus_context`` chat
    engines (answer and refine), stripped as :func:`messages_to_prompt` strips a message."""
    from llama_index.core.chat_engine import condense_plus_context, context

    texts = [context.DEFAULT_CONTEXT_TEMPLATE, context.DEFAULT_REFINE_TEMPLATE,
             condense_plus_context.DEFAULT_CONTEXT_PROMPT_TEMPLATE, condense_plus_context.DEFAULT_CONTEXT_REFINE_PROMPT_TEMPLATE]
    return list(dict.fromkeys(t.strip() for t in texts))


@lru_cache(maxsize=1)
def _chat_engine_patterns() -> tuple[re.Pattern[str], ...]:
    return tuple(_template_pattern(t, then_rest=True) for t in _chat_engine_templates())


def _from_chat_engine_template(text: str) -> Optional[PromptParts]:
    """A chat engine's turn as :func:`messages_to_prompt` joins it: the engine's system message
    (its context template, then the engine's ``system_prompt``), the earlier turns as
    conversation text, the user's message last. The documents come from the template, the
    question is the last paragraph, and the system prompt and the conversation go to
    ``system_text``: earlier answers are never ranked as context."""
    for pattern in _chat_engine_patterns():
        m = pattern.match(text)
        if m is None:
            continue
        values = m.groupdict()
        documents = split_documents(values.get("context_str", values.get("context_msg")) or "")
        rest = _BLANK_LINE.split(values["rest"].strip())
        question = rest.pop().strip() if rest else ""
        if not documents or not question or question.startswith(_HISTORY_HEAD):
            return None
        existing = values.get("existing_answer")
        return PromptParts(tuple(documents), question, None if existing is None else existing.strip(), "template", _kept_text(*rest))
    return None


# --------------------------------------------------------------------------- any other template: the core's shape reader


_CLOSING = re.compile(r"\A\s*(?:</[A-Za-z_]+>|" + _RULE_LINE.pattern + r"$)", re.M)
_QUESTION_TAG = re.compile(r"<(?:question|query)>\s*\Z", re.I)


def _between(text: str) -> str:
    """The text between a context and its question, without the context's closing tag or rule
    line and the question's label or tag."""
    text = _CLOSING.sub("", text, count=1)
    labels = [m for m in QUESTION_LABEL.finditer(text) if m.end() == len(text)]
    cut = labels[-1].start() if labels else (m.start() if (m := _QUESTION_TAG.search(text)) else len(text))
    return text[:cut]


def _from_shape(text: str) -> Optional[PromptParts]:
    block = find_context_block(text, with_question=True)
    if block is None or block.question is None or block.question_start is None:
        return None
    documents = split_documents(block.context)
    question = block.question.strip()
    if not documents or not question:
        return None
    kept = _kept_text(block.instruction, _between(text[block.end : block.question_start]))
    return PromptParts(tuple(documents), question, None, f"shape:{block.marker}", kept)


def read_prompt(text: str) -> Optional[PromptParts]:
    """The documents and the question of a question-answering prompt, or ``None`` (see the module docs)."""
    if not isinstance(text, str) or not has_visible_text(text):
        return None
    return _from_default_template(text) or _from_chat_engine_template(text) or _from_shape(text)


# --------------------------------------------------------------------------- node texts in a joined context


def split_context(text: str, chunks: Iterable[str] = ()) -> str | list[str]:
    """Split a synthesizer's joined context back into the node texts ``chunks``.

    Synthesizers join node texts with ``"\\n\\n"`` (compact / refine / tree_summarize) or
    ``"\\n"`` (simple_summarize) and may re-split or truncate the result to fit the window.
    A boundary is placed wherever a known node text begins at the start of the context or
    right after a line break (matched on its first 200 characters). Pieces before the first
    match (a node cut at its start) stay separate documents. Without any match the context
    is returned as one string.
    """
    heads = [c.strip()[:200] for c in chunks if c.strip()]
    starts = set()
    for head in heads:
        pos = text.find(head)
        while pos >= 0:
            if pos == 0 or text[pos - 1] == "\n" or not text[:pos].strip():
                starts.add(pos)
            pos = text.find(head, pos + 1)
    cuts = sorted(p for p in starts if text[:p].strip())
    if not cuts:
        return text
    pieces = []
    prev = 0
    for p in cuts + [len(text)]:
        piece = text[prev:p].strip()
        if piece:
            pieces.append(piece)
        prev = p
    return pieces if len(pieces) > 1 else text


# --------------------------------------------------------------------------- chat messages as one prompt

_ROLES = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
}


def messages_to_prompt(messages: Sequence[ChatMessage]) -> str:
    """Chat messages as the text of one user message (``QGPMLLM``'s default ``messages_to_prompt``).

    The system messages first, then the earlier turns as conversation text
    (``"Conversation so far:\\nUser: ...\\nAssistant: ..."``), then the last user message,
    separated by blank lines. ``CustomLLM``'s chat completes this text, which QGPM reads
    like any prompt (a RAG prompt in the last user message is still found).
    """
    system = [m.content or "" for m in messages if _ROLES.get(m.role) == "system"]
    turns = [{"role": _ROLES.get(m.role, "user"), "content": m.content or ""} for m in messages if _ROLES.get(m.role) != "system"]
    last = turns.pop()["content"] if turns and turns[-1]["role"] == "user" else ""
    return "\n\n".join(p.strip() for p in [*system, history_text(turns), last] if p.strip())
