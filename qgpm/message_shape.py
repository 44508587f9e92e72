"""The shape of one message: where its context block (and its question) sits.

:func:`find_context_block` finds a context after a marker near the start of the message
text: a tag such as ``<context>`` (the context ends at the last closing tag before the
question, so a document that quotes ``</context>`` stays whole), a label line (``Context:``, ``Documents:``, ...) or a
Markdown heading (``## Context``), a label inside the instruction's first paragraph (``... the following context:``, ``... concise. Context: ``) or a line of it
that mentions the context and ends with a colon (``Use the text below:``), a rule
line (``-----``) after an instruction that mentions the context, or a blank line after such
an instruction (then the block must be at least :data:`MIN_WEAK_CONTEXT_CHARS` characters or
half the instruction's length). A context opened by a tag ends at its closing tag; one opened
by a rule line ends at the same rule line where the template closes it (its last repeat,
followed by nothing or by one paragraph that mentions the context or opens as an instruction;
a rule line inside a document is the document's). With ``with_question=True`` the message must also end with
its question: after a ``Question:``-style label, in ``<question>`` tags, or as a short last
paragraph ending with ``?`` (of which only the last line, where that line opens with a
lead-in that ends in "question:", "query:", "me:", "answer:" and the like, as ``Now tell me:``;
an unlabelled paragraph of several lines is said once, as it may hold the last document; after
a closing context tag, the one line there that ends with ``?``); or hold a labelled question
before a ``Context:`` label line (``rlm/rag-prompt``). :mod:`qgpm.chat_prompt` applies it to
whole conversations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .log import warn_once
from .prompt import has_visible_text

__all__ = ["ContextBlock", "find_context_block", "escape_template", "DOCUMENT_SEPARATOR", "MIN_WEAK_CONTEXT_CHARS", "HEAD_LIMIT", "QUESTION_LABEL"]

DOCUMENT_SEPARATOR = "\n\n"
"""How stuffed documents are joined (LangChain's ``DEFAULT_DOCUMENT_SEPARATOR``)."""
MIN_WEAK_CONTEXT_CHARS = 200
"""A block found only by a blank line after a context-mentioning instruction must be this long
(or half the instruction's length) to count as context."""
HEAD_LIMIT = 2000
"""The marker must start within this many characters of its message (instructions are short)."""

_NOUNS = r"(?:context|contexts|documents?|docs|passages?|sources?|excerpts?|snippets?|references?|information|background|knowledge)"
_CUE = re.compile(
    r"\b(?:context|contexts|documents?|passages?|sources?|excerpts?|snippets?|retrieved|references?|knowledge base|"
    r"(?:information|text|texts) (?:below|provided)|(?:following|provided|given) (?:information|text|texts|data))\b",
    re.I,
)
_TAG = re.compile(r"<(context|contexts|documents?|docs|sources?|passages?|retrieved_context|information)>[ \t]*\n?", re.I)
_LABEL_BODY = rf"(?:retrieved[ \t]+|relevant[ \t]+)?{_NOUNS}(?:\*\*)?[ \t]*:[ \t]*(?:\*\*)?[ \t]*(?:\n|(?=\S))"
_LABEL = re.compile(rf"^[ \t]*(?:#{{1,6}}[ \t]*|\*\*)?{_LABEL_BODY}", re.I | re.M)
# A document's own metadata line ("Source: a.pdf", "Reference: RFC 9110"): a one-item noun with its value on the same line
_META_LINE = re.compile(r"[ \t]*(?:\*\*)?(?:source|reference)(?:\*\*)?[ \t]*:[ \t]*(?:\*\*)?[ \t]*\Z", re.I)
# A Markdown heading that names the context without a colon ("## Context", "### Retrieved documents"): a
# marker only in the message's first two paragraphs (after at most the instruction), so a document's
# own headings further on ("## Background", "## Sources") stay its text.
_CONTEXT_HEADING = re.compile(r"^[ \t]*#{1,6}[ \t]*(?:retrieved[ \t]+|relevant[ \t]+)?(?:context|contexts|documents?|docs)[ \t]*\n", re.I | re.M)
# A label inside the instruction's first paragraph ("... based only on the following context:\n",
# "... keep the answer concise. Context: {context}"): the context starts right after it.
_INLINE_LABEL = re.compile(rf"\b{_LABEL_BODY}", re.I)
# A line of the instruction's first paragraph that mentions the context and ends with a colon ("Use the text below:").
_CUE_LINE = re.compile(r"^[^\n]*:[ \t]*\n", re.M)
# How a template's instruction after a closing rule line opens ("Answer from the notes only.")
_INSTRUCTION_OPENING = re.compile(r"(?:please[ \t,]+)?(?:answer|respond|reply|use|using|given|based|according|only|do[ \t]+not|don't|if[ \t]+you)\b",
                                  re.I)
_RULE = re.compile(r"^[ \t]*(?:-{3,}|={3,}|\*{3,}|_{3,}|#{3,})[ \t]*(?:\n|$)", re.M)
_PARA = re.compile(r"\n[ \t]*\n")
# A question's label line ("Question:", "**Query:**", "Q:", ...); chat_prompt strips it too.
QUESTION_LABEL = re.compile(
    r"^[ \t]*(?:(?:#{1,6}[ \t]*|\*\*)?(?:user[ \t]+)?(?:question|query|q|input)(?:\*\*)?[ \t]*:[ \t]*(?:\*\*)?[ \t]*"
    r"|#{1,6}[ \t]*(?:user[ \t]+)?(?:question|query)[ \t]*(?=\n))",  # or a Markdown heading without a colon ("## Question")
    re.I | re.M,
)
_Q_TAG = re.compile(r"<(question|query)>(.*?)</\1>", re.I | re.S)
_ANSWER_CUE = re.compile(r"\s*\n[ \t]*(?:helpful[ \t]+)?(?:answer|a|response|assistant)[ \t]*:[ \t]*$", re.I)
_SHORT_QUESTION = 500
# A template's question line with its own short lead-in ("Now tell me: {question}", "Answer the question: {question}")
_LED_QUESTION = re.compile(r"^[ \t]*[A-Za-z][^\n:?]{0,50}\b(?:question|query|ask|asks|me|answer|input)[ \t]*:[ \t]+(?=\S)", re.I | re.M)
GLUED_QUESTION_WARNING = ("qgpm: a prompt's question was read as its last paragraph of several lines, right after the context; if its "
                          "first lines are the last document, put a blank line or a 'Question:' label before the question in the template")
_ANSWER_LINE = re.compile(r"^[ \t]*(?:a|answer|response)[ \t]*:[ \t]*\S", re.I | re.M)  # an answer given in the text


def escape_template(literal: str) -> str:
    """Template text that renders as ``literal`` (braces doubled for ``str.format``)."""
    return literal.replace("{", "{{").replace("}", "}}")


@dataclass(frozen=True)
class ContextBlock:
    """Where the context (and, if asked for, the question) sits in one message's text.

    ``text[:instruction_end]`` is the instruction, ``text[start:end]`` the context,
    ``text[question_start:question_end]`` the question (``None`` when not looked for or
    not found). ``marker`` says how the start was found: ``"tag"``, ``"label"``,
    ``"rule"`` or ``"paragraph"``.
    """

    text: str
    instruction_end: int
    start: int
    end: int
    marker: str
    question_start: int | None = None
    question_end: int | None = None
    question_label_start: int | None = None  # set when the question (and its label) comes before the context's label: where its label begins
    context_label_start: int | None = None

    @property
    def question_first(self) -> bool:
        """The question (and its label) comes before the context's label."""
        return self.question_label_start is not None

    @property
    def instruction(self) -> str:
        return self.text[: self.instruction_end]

    @property
    def context(self) -> str:
        return self.text[self.start : self.end]

    @property
    def question(self) -> str | None:
        if self.question_start is None or self.question_end is None:
            return None
        return self.text[self.question_start : self.question_end]

    @property
    def empty(self) -> bool:
        return not has_visible_text(self.context)

    def documents(self, separator: str = DOCUMENT_SEPARATOR) -> list[str]:
        """The context split at ``separator``; one document when a part would be blank."""
        parts = self.context.split(separator)
        return parts if all(has_visible_text(p) for p in parts) else [self.context]

    def template(self, *, question_here: bool) -> str:
        """A QGPM user-message template that renders this message's text exactly.

        With ``question_here=False`` (the question comes from another message) the
        question follows the context after a blank line. A message whose labelled question
        comes before its labelled context (LangChain's ``rlm/rag-prompt``: ``Question: ...
        Context: ... Answer:``) renders with the two labelled parts swapped, the question last,
        every other character kept.
        """
        t = self.text
        if self.question_first and question_here:  # the labelled parts swapped: QGPM reads relevance from a question after the context
            q_label, c_label = self.question_label_start, self.context_label_start
            return "".join(["{instruction}" if self.instruction_end else "", escape_template(t[self.instruction_end : q_label]),
                            escape_template(t[c_label : self.start]), "{context}", escape_template(t[self.question_end : c_label]),
                            escape_template(t[q_label : self.question_start]), "{question}", escape_template(t[self.end :])])
        out = ["{instruction}" if self.instruction_end else "", escape_template(t[self.instruction_end : self.start]), "{context}"]
        if question_here:
            out += [escape_template(t[self.end : self.question_start]), "{question}", escape_template(t[self.question_end :])]
        else:
            out += [escape_template(t[self.end :].rstrip()), "\n\n{question}"]
        return "".join(out)


def _question_span(text: str) -> tuple[int, int, int] | None:
    """(question start, end, start of the text around it) of a question at the end of
    ``text``: after a ``Question:``-style label, inside ``<question>`` tags, or a short last
    paragraph ending with ``?``. ``None`` if there is none."""
    # a colon-less "## Question" heading is the prompt's only after a "## Context"-style heading (a document's "## Query" is not)
    labels = [m for m in QUESTION_LABEL.finditer(text) if ":" in m.group() or _context_heading(text, m.start()) is not None]
    if labels:
        m = labels[-1]
        q0, q1 = m.end(), len(text)
        cue = _ANSWER_CUE.search(text, q0)
        if cue is not None:
            q1 = cue.start()
        q1 = q0 + len(text[q0:q1].rstrip())
        q0 += len(text[q0:q1]) - len(text[q0:q1].lstrip())  # a label on a line of its own: the line break stays template text
        # an answered "Q:" (a line "A: ..." after it) is a document's FAQ entry, not the prompt's question
        if has_visible_text(text[q0:q1]) and not _ANSWER_LINE.search(text, q0, q1):
            return q0, q1, m.start()
    tags = list(_Q_TAG.finditer(text))
    if tags:
        m = tags[-1]
        inner = m.group(2)
        lead = len(inner) - len(inner.lstrip())
        q0 = m.start(2) + lead
        q1 = q0 + len(inner.strip())
        if q1 > q0:
            return q0, q1, m.start()
    paras = list(_PARA.finditer(text))
    if paras:
        m = paras[-1]
        last = text[m.end() :]
        stripped = last.strip()
        if stripped.endswith("?") and len(stripped) <= _SHORT_QUESTION:
            q0 = m.end() + (len(last) - len(last.lstrip()))
            if "\n" in stripped:
                line0 = text.rindex("\n", q0, q0 + len(stripped)) + 1
                led = _LED_QUESTION.match(text, line0)
                if led is not None:  # "{last document}\nNow tell me: {question}": the last line is the template's question line
                    return led.end(), q0 + len(stripped), line0
            return q0, q0 + len(stripped), m.start()
    return None


def _question_line(text: str) -> tuple[int, int, int] | None:
    """(start, end, line start) of the one line of ``text`` that ends with ``?`` (an ``Answer:``
    cue at the end aside), a lead-in such as ``Now tell me: `` left out; ``None`` where no line
    or several lines end so (the other lines are the template's own: "Answer in one word.")."""
    cue = _ANSWER_CUE.search(text)
    end = cue.start() if cue else len(text)
    asked = [m for m in re.finditer(r"^[ \t]*(\S[^\n]*?\?)[ \t]*$", text[:end], re.M)]
    if len(asked) != 1:
        return None
    m = asked[0]
    led = _LED_QUESTION.match(text, m.start(), m.end(1))
    return (led.end() if led else m.start(1)), m.end(1), m.start()


def _question_first(text: str, q: tuple[int, int, int]) -> ContextBlock | None:
    """The block of a message whose labelled question comes before a context label line
    (``...\nQuestion: {question}\nContext: {context}\nAnswer:``), or ``None``."""
    q0, q1, label_start = q
    m = _LABEL.search(text, q0, q1)
    if m is None or not text[q0 : m.start()].strip():
        return None
    question_end = q0 + len(text[q0 : m.start()].rstrip())
    body = text[m.end() : q1]
    c0 = m.end() + len(body) - len(body.lstrip())
    c1 = max(c0, m.end() + len(body.rstrip()))
    return ContextBlock(text=text, instruction_end=len(text[:label_start].rstrip()), start=c0, end=c1, marker="label",
                        question_start=q0, question_end=question_end, question_label_start=label_start,
                        context_label_start=m.start())


def _context_heading(text: str, limit: int) -> re.Match | None:
    """The first ``## Context``-style heading before ``limit`` that opens the message's first or
    second paragraph (:data:`_CONTEXT_HEADING`), or ``None``."""
    m = _CONTEXT_HEADING.search(text, 0, limit)
    if m is None or len(_PARA.findall(text[: m.start()].rstrip())) > 0:
        return None
    return m


def _context_start(text: str, limit: int) -> tuple[int, int, str, str | None] | None:
    """(instruction end, context start, marker, tag name) of the first context marker before ``limit``."""
    window = text[: min(limit, HEAD_LIMIT)]
    m = _TAG.search(window)
    if m:
        return len(text[: m.start()].rstrip()), m.end(), "tag", m.group(1)
    m = next((m for m in _LABEL.finditer(window) if not _META_LINE.match(m.group())), None)
    if m:
        return len(text[: m.start()].rstrip()), m.end(), "label", None
    m = _context_heading(window, len(window))
    if m:
        return len(text[: m.start()].rstrip()), m.end(), "label", None
    first_para = _PARA.search(window)
    head = window[: first_para.start() if first_para else len(window)]  # the instruction cannot reach past its first blank line
    m = _INLINE_LABEL.search(head)
    if m:
        return len(text[: m.start()].rstrip()), m.end(), "label", None
    for m in _CUE_LINE.finditer(head):
        if _CUE.search(m.group()):
            return len(text[: m.end()].rstrip()), m.end(), "label", None
    for kind, pattern in (("rule", _RULE), ("paragraph", _PARA)):
        for m in pattern.finditer(window):
            head = text[: m.start()]
            if _CUE.search(head):
                return len(head.rstrip()), m.end(), kind, None
    return None


def _closing_tag(text: str, tag: str, start: int, end: int) -> re.Match | None:
    """The closing tag of a ``<tag>`` block opened at ``start``: the last one on a line of its own
    before ``end`` (a document quoting it mid-line stays in), else the first."""
    close = re.escape(tag)
    alone = list(re.compile(r"^[ \t]*</" + close + r">[ \t]*$", re.I | re.M).finditer(text, start, end))
    return alone[-1] if alone else re.compile(r"</" + close + r">", re.I).search(text, start, end)


def _closing_rule(text: str, rule: str, start: int, end: int) -> int | None:
    """Where the rule line ``rule`` that opened a context at ``start`` closes it again: the
    start of its last repeat on a line of its own before ``end``, when what follows it before
    ``end`` is nothing or one paragraph that mentions the context or opens as an instruction (the
    template's own text, as LlamaIndex's "Given the context information ..."); after a rule line
    inside a document come more documents, or that document's own text. ``None`` where it is not
    so repeated."""
    lines = [m for m in re.compile(r"^[ \t]*" + re.escape(rule) + r"[ \t]*$", re.M).finditer(text, start, end)]
    if not rule or not lines:
        return None
    after = text[lines[-1].end() : end].strip()
    if after and (_PARA.search(after) or not (_CUE.search(after) or _INSTRUCTION_OPENING.match(after))):  # more documents, or a document's text
        return None
    return lines[-1].start()


def _question_after_tagged_block(text: str) -> tuple[bool, tuple[int, int, int] | None]:
    """(whether the message's context sits in closed tags, its question): the question of such a
    message is looked for only after the closing tag, where a ``Q:`` line or a question inside
    the documents is not the prompt's question. Without a label, tags or a last paragraph ending
    with ``?`` there, it is the one line after the tag that ends with ``?``; else there is none."""
    found = _context_start(text, len(text))
    if found is None or found[2] != "tag":
        return False, None
    close = _closing_tag(text, found[3], found[1], len(text))
    if close is None:
        return False, None
    rest = text[close.end() :]
    q = _question_span(rest) or _question_line(rest)  # right after the tag, without a blank line: the line that asks
    return True, None if q is None else (q[0] + close.end(), q[1] + close.end(), q[2] + close.end())


def find_context_block(text: str, *, with_question: bool) -> ContextBlock | None:
    """Find a context block in one message's text (see the module docs for the markers).

    With ``with_question=True`` the message must also end with its question (after a
    ``Question:``-style label, in ``<question>`` tags, or as a short last paragraph ending
    with ``?``; see the module docs for a question right after the last document or the closing
    tag); the context then ends where the question's part begins. Returns ``None``
    where no block (or, with ``with_question``, no question after it) is found.
    """
    if not isinstance(text, str) or not text.strip():
        return None
    end = len(text)
    q = None
    if with_question:
        tagged, q = _question_after_tagged_block(text)
        if not tagged:
            q = _question_span(text)
        if q is None:
            return None
        first = _question_first(text, q)
        if first is not None:
            return first
        end = q[2]
    found = _context_start(text, end)
    if found is None:
        return None
    head_end, start, marker, tag = found
    if start > end:
        return None
    if tag is not None:
        close = _closing_tag(text, tag, start, end)
        if close is not None:
            end = close.start()
    elif marker == "rule":
        close = _closing_rule(text, text[head_end:start].strip(), start, end)
        if close is not None:
            end = close
    body = text[start:end]
    lead = len(body) - len(body.lstrip())
    c0, c1 = start + lead, start + len(body.rstrip())
    if c1 < c0:
        c1 = c0
    if marker == "paragraph" and has_visible_text(text[c0:c1]):
        if c1 - c0 < min(MIN_WEAK_CONTEXT_CHARS, max(1, head_end // 2)):
            return None
    if q is not None and tag is None and not text[q[2] : q[0]].strip() and "\n" in text[q[0] : q[1]]:
        warn_once(GLUED_QUESTION_WARNING)  # an unlabelled question of several lines may hold the last document
    return ContextBlock(
        text=text, instruction_end=head_end, start=c0, end=c1, marker=marker,
        question_start=None if q is None else q[0], question_end=None if q is None else q[1],
    )
