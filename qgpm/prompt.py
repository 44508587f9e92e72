"""Prompt assembly with role spans (system, instruction, context, question, answer prefix).

The user message is rendered from a template with ``{instruction}``, ``{context}`` and
``{question}`` fields, wrapped by the model's chat template (when it has one), and the
answer prefix is appended after the assistant header. Every role's character span in
the final prompt is tracked, then mapped to tokens through the tokenizer's offsets:

text -> role spans -> tokens -> (per token) sentence index, query-row flag, newline flag.

Caller text is data: special-token strings inside the context, question, instruction,
system prompt or answer prefix are tokenized as plain text, never as control tokens
(:func:`qgpm.tokens.encode_prompt`); only the chat template's own control tokens are.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import torch

from .chat_template import render_chat
from .log import warn_once
from .segment import Sentence, assign_tokens_to_sentences, has_visible_text, split_documents
from .tokens import encode_prompt

__all__ = [
    "PromptSpec",
    "Prompt",
    "build_prompt",
    "RenderedPrompt",
    "render_prompt",
    "normalize_spec",
    "count_prompt_tokens",
    "render_chat",
    "check_prompt_inputs",
    "check_prompt_settings",
    "check_template",
    "has_visible_text",
    "DEFAULT_TEMPLATE",
    "DEFAULT_INSTRUCTION",
    "PromptError",
    "EmptyContextError",
]

DEFAULT_TEMPLATE = "{instruction}\n\n{context}\n\n{question}"
DEFAULT_INSTRUCTION = "Answer the question using the text below."
PLAIN_TEXT_ADVICE = (
    "qgpm: this model's tokenizer has no chat template, so the prompt is plain text with no end of turn, and a base model may "
    "repeat the prompt or write on past its answer; give it a labelled question, an answer cue and a stop string, e.g. "
    "template='{instruction}\\n\\n{context}\\n\\nQuestion: {question}', answer_prefix='Answer:', stop=['\\n'] (qgpm ask: "
    "--template '{instruction}\\n\\n{context}\\n\\nQuestion: {question}' --answer-prefix 'Answer:' --stop '\\n')")
"""Said once (logger ``qgpm``) when such a prompt is rendered with the default template and no ``answer_prefix``."""
_FIELDS = ("instruction", "context", "question")


class PromptError(ValueError):
    """The prompt parts are unusable (empty question, bad template, ...)."""


class EmptyContextError(PromptError):
    """The context holds no text to answer from (nothing given, or nothing retrieved)."""


def _type_name(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def check_prompt_settings(*, instruction: Any = None, system: Any = None, answer_prefix: Any = None) -> None:
    """Raise :class:`PromptError` for an instruction / system prompt / answer prefix that is not a string or ``None``."""
    for name, value in (("instruction", instruction), ("system", system), ("answer_prefix", answer_prefix)):
        if value is not None and not isinstance(value, str):
            raise PromptError(f"{name} must be a string or None, got {_type_name(value)}")


def check_prompt_inputs(
    context: Any,
    question: Any,
    *,
    instruction: Any = None,
    system: Any = None,
    answer_prefix: Any = None,
    check_empty: bool = True,
) -> list[str]:
    """Validate the caller's prompt parts; return the context as a list of documents.

    Raises :class:`PromptError` naming the problem: a context that is ``None``, bytes,
    not a string or list of strings, empty, or made only of invisible characters
    (:class:`EmptyContextError` for the last two); a question that is not a string or
    is empty; an instruction / system prompt / answer prefix that is not a string.
    ``check_empty=False`` checks only the types (for a size check that must come first).
    """
    if context is None:
        raise PromptError("context is None: pass the text to answer from (a string or a list of document strings)")
    if isinstance(context, (bytes, bytearray, memoryview)):
        raise PromptError(f"context is {type(context).__name__}, not text: decode it first, e.g. context.decode('utf-8')")
    if isinstance(context, str):
        docs = [context]
    elif isinstance(context, Mapping) or not hasattr(context, "__iter__"):
        raise PromptError(f"context must be a string or a list of document strings, got {_type_name(context)}")
    else:
        docs = list(context)
        for i, d in enumerate(docs):
            if isinstance(d, (bytes, bytearray)):
                raise PromptError(f"context item {i} is {type(d).__name__}, not text: decode it first, e.g. .decode('utf-8')")
            if not isinstance(d, str):
                raise PromptError(f"context item {i} is {_type_name(d)}, expected str (the text of one document)")
    if question is None:
        raise PromptError("question is None: pass the question to answer")
    if isinstance(question, (bytes, bytearray)):
        raise PromptError(f"question is {type(question).__name__}, not text: decode it first, e.g. question.decode('utf-8')")
    if not isinstance(question, str):
        raise PromptError(f"question must be a string, got {_type_name(question)}")
    check_prompt_settings(instruction=instruction, system=system, answer_prefix=answer_prefix)
    if not check_empty:
        return docs
    # (visible-text search stops at the first visible character: no copy of a long text)
    if not any(has_visible_text(d) for d in docs):
        if not any(d.strip() for d in docs):
            raise EmptyContextError("context is empty: pass the text (or a non-empty list of documents) to answer from")
        raise EmptyContextError(
            "context has no visible text: it holds only whitespace and zero-width or other invisible characters "
            "(e.g. U+200B); pass the document text to answer from"
        )
    if not has_visible_text(question):
        if not question.strip():
            raise PromptError("question is empty: pass the question to answer")
        raise PromptError("question has no visible text (only whitespace and zero-width or invisible characters)")
    return docs


@dataclass(frozen=True)
class PromptSpec:
    """What the caller provides. ``context`` is one text or a list of documents."""

    context: str | Sequence[str]
    question: str
    instruction: str | None = None
    system: str | None = None
    answer_prefix: str | None = None
    template: str = DEFAULT_TEMPLATE
    document_separator: str = "\n\n"


@dataclass
class Prompt:
    """A tokenized prompt with everything QGPM needs to know about its tokens."""

    text: str
    input_ids: torch.Tensor  # [1, N]
    offsets: list[tuple[int, int]]
    role_spans: dict[str, tuple[int, int]]  # char spans in ``text``
    context_text: str
    context_start: int  # char offset of the context in ``text``
    sentences: list[Sentence]  # spans relative to ``context_text``
    doc_spans: list[tuple[int, int]]  # relative to ``context_text``
    token_sentence: torch.Tensor  # [N] sentence index or -1
    query_rows: torch.Tensor  # [R] token indices
    newline_tokens: torch.Tensor  # [N] bool
    meta: dict = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def question_text(self) -> str | None:
        """The question as it appears in the prompt (``None`` if the prompt has no question span)."""
        span = self.role_spans.get("question")
        return self.text[span[0]:span[1]] if span else None

    @property
    def context_tokens(self) -> int:
        return int((self.token_sentence >= 0).sum())

    def char_span_tokens(self, start: int, end: int) -> list[int]:
        """Token indices overlapping ``[start, end)`` of the context string."""
        a, b = start + self.context_start, end + self.context_start
        return [i for i, (s, e) in enumerate(self.offsets) if s < b and max(e, s + 1) > a]


def _render_user(template: str, parts: dict[str, str]) -> tuple[str, dict[str, tuple[int, int]], list[tuple[int, int]]]:
    """Render ``template``; return the text, the char span of each field (its first
    occurrence) and the spans of every field occurrence (caller text)."""
    if not isinstance(template, str):
        raise PromptError(f"template must be a string, got {_type_name(template)}")
    out: list[str] = []
    spans: dict[str, tuple[int, int]] = {}
    every: list[tuple[int, int]] = []
    pos = 0
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise PromptError(f"invalid template {template!r}: {exc}") from exc
    seen = set()
    for literal, name, spec, conv in parsed:
        out.append(literal)
        pos += len(literal)
        if name is None:
            continue
        if name not in _FIELDS or spec or conv:
            raise PromptError(f"template field {{{name}}} is not one of {{instruction}}, {{context}}, {{question}} (no format specs)")
        if name in seen and name != "instruction":
            raise PromptError(f"template field {{{name}}} appears twice (only {{instruction}} may repeat)")
        seen.add(name)
        value = parts[name]
        spans.setdefault(name, (pos, pos + len(value)))
        every.append((pos, pos + len(value)))
        out.append(value)
        pos += len(value)
    for required in ("context", "question"):
        if required not in seen:
            raise PromptError(f"template must contain {{{required}}}: {template!r}")
    return "".join(out), spans, every


def check_template(template: Any) -> None:
    """Raise :class:`PromptError` unless ``template`` is a usable user-message template."""
    _render_user(template, {"instruction": "", "context": "", "question": ""})


@dataclass(frozen=True)
class RenderedPrompt:
    """A prompt's text before tokenization, with the character spans needed to tokenize it.

    ``head`` is the prompt without the answer prefix (``text[head:]`` is the prefix).
    ``user_start`` is where the user message starts in ``text``; it is ``None`` when the
    model's chat template changed the user message (e.g. stripped it), so the roles in
    it cannot be located (:func:`build_prompt` raises then). ``fields`` holds the span of
    every field occurrence in the user message and ``first`` the span of each field's
    first occurrence, both relative to the user message. ``messages`` are the spans of the
    chat messages' contents as the chat template placed them (``None`` if not found).
    """

    text: str
    head: int
    user_start: int | None
    fields: tuple[tuple[int, int], ...]
    first: dict[str, tuple[int, int]]
    messages: tuple[tuple[int, int], ...] | None
    system_span: tuple[int, int] | None
    add_special_tokens: bool
    user_length: int

    @property
    def role_spans(self) -> dict[str, tuple[int, int]]:
        """Char spans in ``text`` of the user-message fields, the system prompt and the answer prefix."""
        where = self.user_start if self.user_start is not None else 0
        spans = {k: (a + where, b + where) for k, (a, b) in self.first.items()}
        if self.system_span is not None:
            spans["system"] = self.system_span
        spans["answer_prefix"] = (self.head, len(self.text))
        return spans

    @property
    def protected(self) -> list[tuple[int, int]]:
        """The caller's text in ``text`` (read as plain text when tokenized): the whole user
        message (its fields and the template's own text, which an adapter copies from a
        chat message), the system prompt and the answer prefix. Where the user message was
        not located: the message contents as found, and the answer prefix. Special tokens
        come only from the model's chat template."""
        prefix = (self.head, len(self.text))
        if self.user_start is None:
            return list(self.messages or []) + [prefix]
        out = [(self.user_start, self.user_start + self.user_length), prefix]
        if self.system_span is not None:
            out.append(self.system_span)
        return out


def normalize_spec(spec: PromptSpec) -> PromptSpec:
    """The parts as :func:`build_prompt` renders them: the default instruction for ``None``,
    the template without ``{instruction}`` for an empty instruction with the default
    template, and the question without surrounding whitespace."""
    instruction = spec.instruction if spec.instruction is not None else DEFAULT_INSTRUCTION
    template = spec.template
    if not instruction and template == DEFAULT_TEMPLATE:
        template = "{context}\n\n{question}"
    return replace(spec, instruction=instruction, template=template, question=spec.question.strip())


def _render(tokenizer: Any, spec: PromptSpec, context_text: str) -> RenderedPrompt:
    """Render ``spec`` as given (no defaults, no stripping) around ``context_text``."""
    user, first, fields = _render_user(spec.template, {"instruction": spec.instruction or "", "context": context_text, "question": spec.question})
    if getattr(tokenizer, "chat_template", None):
        messages = []
        if spec.system:
            messages.append({"role": "system", "content": spec.system})
        messages.append({"role": "user", "content": user})
        head, located = render_chat(tokenizer, messages)
        where = located[-1][0] if located is not None and head[located[-1][0] : located[-1][1]] == user else None
        system_span = located[0] if spec.system and located is not None else None
        add_special = False
    else:
        if spec.template in (DEFAULT_TEMPLATE, "{context}\n\n{question}") and not spec.answer_prefix:
            warn_once(PLAIN_TEXT_ADVICE)
        head = (spec.system + "\n\n" if spec.system else "") + user + "\n\n"
        where = len(spec.system) + 2 if spec.system else 0
        system_span = (0, len(spec.system)) if spec.system else None
        located = ([system_span] if system_span else []) + [(where, where + len(user))]
        add_special = True
    return RenderedPrompt(
        text=head + (spec.answer_prefix or ""),
        head=len(head),
        user_start=where,
        fields=tuple(fields),
        first=first,
        messages=None if located is None else tuple(located),
        system_span=system_span,
        add_special_tokens=add_special,
        user_length=len(user),
    )


def render_prompt(tokenizer: Any, spec: PromptSpec) -> RenderedPrompt:
    """The prompt text of ``spec``, rendered as :func:`build_prompt` renders it, but from
    the parts exactly as given (:func:`build_prompt` first applies :func:`normalize_spec`).

    Raises :class:`PromptError` for an unusable context or question (see
    :func:`check_prompt_inputs`) or template.
    """
    docs = check_prompt_inputs(spec.context, spec.question, instruction=spec.instruction, system=spec.system, answer_prefix=spec.answer_prefix)
    return _render(tokenizer, spec, spec.document_separator.join(docs))


def count_prompt_tokens(tokenizer: Any, spec: PromptSpec) -> int:
    """Tokens of :func:`render_prompt`'s prompt, tokenized as :func:`build_prompt` does
    (special-token strings in the caller's parts count as plain text)."""
    r = render_prompt(tokenizer, spec)
    return len(encode_prompt(tokenizer, r.text, r.protected, add_special_tokens=r.add_special_tokens)[0])


def build_prompt(tokenizer, spec: PromptSpec, *, max_sentence_chars: int = 600, query_tail: int | None = None,
                 split_run_ons: bool = False) -> Prompt:
    """Assemble, tokenize and annotate a prompt.

    ``max_sentence_chars`` and ``split_run_ons`` go to the sentence splitter
    (:func:`qgpm.segment.split_documents`), ``query_tail`` chooses the query rows.

    Raises :class:`PromptError` for an unusable context or question (see
    :func:`check_prompt_inputs`). Special-token strings in the caller's text are
    tokenized as plain text.
    """
    docs = check_prompt_inputs(spec.context, spec.question, instruction=spec.instruction, system=spec.system, answer_prefix=spec.answer_prefix)
    context_text, sentences, doc_spans = split_documents(docs, spec.document_separator, max_chars=max_sentence_chars, run_ons=split_run_ons)
    rendered = _render(tokenizer, normalize_spec(spec), context_text)
    if rendered.user_start is None:
        raise PromptError(
            "the model's chat template changed the user message (e.g. stripped it), so role spans "
            "cannot be located; strip surrounding whitespace from the context/question"
        )
    text, role_spans = rendered.text, rendered.role_spans
    ids, offsets = encode_prompt(tokenizer, text, rendered.protected, add_special_tokens=rendered.add_special_tokens)
    c0, c1 = role_spans["context"]
    starts = []
    for s, e in offsets:
        starts.append(s - c0 if c0 <= s < c1 else -1)
    token_sentence = [
        sid if st >= 0 else -1
        for st, sid in zip(starts, assign_tokens_to_sentences([max(st, 0) for st in starts], sentences))
    ]
    q0 = role_spans["question"][0]
    rows = [i for i, (s, e) in enumerate(offsets) if s >= q0 or (e > q0 and s < q0)]
    if query_tail is not None:
        q1 = role_spans["question"][1]
        qrows = [i for i in rows if offsets[i][0] < q1]
        tail = [i for i in rows if offsets[i][0] >= q1][-query_tail:] if query_tail > 0 else []
        rows = qrows + tail
    if not rows:
        rows = [len(ids) - 1]
    newline = [("\n" in text[s:e]) for s, e in offsets]
    return Prompt(
        text=text,
        input_ids=torch.tensor([ids], dtype=torch.long),
        offsets=offsets,
        role_spans=role_spans,
        context_text=context_text,
        context_start=c0,
        sentences=sentences,
        doc_spans=doc_spans,
        token_sentence=torch.tensor(token_sentence, dtype=torch.long),
        query_rows=torch.tensor(rows, dtype=torch.long),
        newline_tokens=torch.tensor(newline, dtype=torch.bool),
    )
