"""The model's chat template applied to a conversation, with each message's content located in it.

:func:`render_chat` renders the messages with the generation prompt and returns the character
span of every message's content in the text, so that the role spans of a prompt
(:mod:`qgpm.prompt`) survive the template.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

__all__ = ["render_chat"]


_MARK = "\ue000qgpm-message-{}\ue001"
_MARK_RE = re.compile("\ue000qgpm-message-(\\d+)\ue001")


def render_chat(tokenizer: Any, messages: Sequence[dict[str, str]]) -> tuple[str, list[tuple[int, int]] | None]:
    """The chat template applied to ``messages`` (with the generation prompt), and the
    char span of each message's content in it (``None`` where they cannot be located).

    Spans come from a second rendering with a marker in place of each content: when putting
    the contents back into it, as given or stripped of surrounding whitespace (a template that
    trims, as Llama 3's and Gemma 3's do), gives the real rendering, the spans are exact.
    Otherwise (a template that changes the content in another way) they are searched for, and
    kept only where the text around them is the template's own text; a template that cannot
    render the markers (one that inspects the content) leaves the search unchecked.
    """
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    contents = [m["content"] for m in messages]
    try:
        skeleton = tokenizer.apply_chat_template(
            [dict(m, content=_MARK.format(i)) for i, m in enumerate(messages)], tokenize=False, add_generation_prompt=True
        )
    except Exception:  # a template that inspects the content: fall back to searching
        skeleton = None
    if skeleton is not None:
        for fill in (contents, [c.strip() for c in contents]):
            spans = _fill_skeleton(skeleton, fill, text)
            if spans is not None:
                return text, spans
    found = _find_in_order(text, contents)
    if found is not None and skeleton is not None and _outside(text, found) != _MARK_RE.sub("", skeleton):
        return text, None  # a span found inside the template's own text: not located
    return text, found


def _fill_skeleton(skeleton: str, contents: Sequence[str], text: str) -> list[tuple[int, int]] | None:
    """The spans of ``contents`` put in place of the skeleton's markers, if that gives ``text``."""
    out: list[str] = []
    spans: list[tuple[int, int] | None] = [None] * len(contents)
    pos = last = 0
    for m in _MARK_RE.finditer(skeleton):
        piece = skeleton[last : m.start()]
        out.append(piece)
        pos += len(piece)
        i = int(m.group(1))
        value = contents[i] if i < len(contents) else ""
        if i < len(contents) and spans[i] is None:
            spans[i] = (pos, pos + len(value))
        out.append(value)
        pos += len(value)
        last = m.end()
    out.append(skeleton[last:])
    if "".join(out) == text and all(sp is not None or not c for sp, c in zip(spans, contents)):
        return [sp if sp is not None else (0, 0) for sp in spans]
    return None


def _outside(text: str, spans: Sequence[tuple[int, int]]) -> str:
    """``text`` without the characters inside ``spans`` (in order, not overlapping)."""
    out, last = [], 0
    for a, b in spans:
        out.append(text[last:a])
        last = max(last, b)
    out.append(text[last:])
    return "".join(out)


def _find_in_order(text: str, parts: Sequence[str]) -> list[tuple[int, int]] | None:
    spans = []
    pos = 0
    for part in parts:
        if not part.strip():
            spans.append((pos, pos))
            continue
        at = text.find(part, pos)
        if at < 0:
            part = part.strip()
            at = text.find(part, pos)
        if at < 0:
            return None
        spans.append((at, at + len(part)))
        pos = at + len(part)
    return spans
