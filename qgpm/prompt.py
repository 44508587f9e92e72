"""Prompt assembly with role spans (system, instruction, context, question, answer prefix).

The user message is rendered from a template with ``{instruction}``, ``{context}`` and
``{question}`` fields, wrapped by the model's chat template (when it has one), and the
answer prefix is appended after the assistant header. Every role's character span in
the final prompt is tracked, then mapped to tokens through the tokenizer's offsets:

text -> role spans -> tokens -> (per token) sentence index, query-row flag, newline flag.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .segment import Sentence, assign_tokens_to_sentences, split_documents

__all__ = ["PromptSpec", "Prompt", "build_prompt", "DEFAULT_TEMPLATE", "DEFAULT_INSTRUCTION", "PromptError"]

DEFAULT_TEMPLATE = "{instruction}\n\n{context}\n\n{question}"
DEFAULT_INSTRUCTION = "Answer the question using the text below."
_FIELDS = ("instruction", "context", "question")


class PromptError(ValueError):
    """The prompt parts are unusable (empty question, bad template, ...)."""


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


def _render_user(template: str, parts: dict[str, str]) -> tuple[str, dict[str, tuple[int, int]]]:
    """Render ``template`` and return the text with the char span of each field."""
    out: list[str] = []
    spans: dict[str, tuple[int, int]] = {}
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
        out.append(value)
        pos += len(value)
    for required in ("context", "question"):
        if required not in seen:
            raise PromptError(f"template must contain {{{required}}}: {template!r}")
    return "".join(out), spans


def build_prompt(tokenizer, spec: PromptSpec, *, max_sentence_chars: int = 600, query_tail: int | None = None) -> Prompt:
    """Assemble, tokenize and annotate a prompt.

    Raises :class:`PromptError` for an empty context or question.
    """
    docs = [spec.context] if isinstance(spec.context, str) else list(spec.context)
    if not docs or not any(isinstance(d, str) and d.strip() for d in docs):
        raise PromptError("context is empty: pass the text (or a non-empty list of documents) to answer from")
    if not isinstance(spec.question, str) or not spec.question.strip():
        raise PromptError("question is empty: pass the question to answer")
    context_text, sentences, doc_spans = split_documents(docs, spec.document_separator, max_chars=max_sentence_chars)

    template = spec.template
    instruction = spec.instruction if spec.instruction is not None else DEFAULT_INSTRUCTION
    if not instruction and template == DEFAULT_TEMPLATE:
        template = "{context}\n\n{question}"
    user, spans = _render_user(template, {"instruction": instruction, "context": context_text, "question": spec.question.strip()})

    prefix = spec.answer_prefix or ""
    if getattr(tokenizer, "chat_template", None):
        messages = []
        if spec.system:
            messages.append({"role": "system", "content": spec.system})
        messages.append({"role": "user", "content": user})
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        where = rendered.find(user)
        if where < 0:
            raise PromptError(
                "the model's chat template changed the user message (e.g. stripped it), so role spans "
                "cannot be located; strip surrounding whitespace from the context/question"
            )
        head = rendered
        add_special = False
    else:
        head = (spec.system + "\n\n" if spec.system else "") + user + "\n\n"
        where = len(spec.system) + 2 if spec.system else 0
        add_special = True
    text = head + prefix
    role_spans = {k: (a + where, b + where) for k, (a, b) in spans.items()}
    if spec.system:
        s = text.find(spec.system)
        role_spans["system"] = (s, s + len(spec.system))
    role_spans["answer_prefix"] = (len(head), len(text))

    enc = tokenizer(text, add_special_tokens=add_special, return_offsets_mapping=True)
    ids = enc["input_ids"]
    offsets = [tuple(o) for o in enc["offset_mapping"]]
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
