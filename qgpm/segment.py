"""Sentence segmentation and token alignment (paper App. B).

Rules
-----
* A sentence ends after ``.``, ``!`` or ``?`` (optionally followed by closing quotes or
  brackets) when whitespace follows; common abbreviations (``Dr.``, ``e.g.``, single
  initials, ...) do not end a sentence. Full-width terminators (CJK ``。！？．``, half-width
  ``｡``, the Devanagari danda) end a sentence without needing whitespace, with the closing
  quotes and brackets that follow them (``」』”’）】》〉``).
* A line break also ends a sentence: list items, table rows and JSON records are
  separate units even without punctuation.
* A unit longer than ``max_chars`` characters (a text with no punctuation at all) is cut
  at whitespace (in text without spaces: between graphemes, never before a combining mark)
  into pieces of at most ``max_chars`` characters, so relevance can still be graded inside it.
* Pieces with nothing visible (whitespace, zero-width characters) join the next sentence.
* Optional run-on rule (``run_ons=True``, ``QGPMConfig.split_run_ons``): a capitalized
  sentence opener from :data:`RUN_ON_OPENERS` (``One``, ``The``, ``If``, ...) right after a
  lowercase word, with only spaces between, also starts a unit. Text cut mid-sentence and
  joined to the next text (a retrieved chunk cut at a word count, RULER's haystack cut
  before a needle: "... woven into the story One of the special magic numbers ...") then
  splits where the next sentence starts. A title that holds such a word ("in The Hague")
  is split too; nothing else changes.
* Sentence spans tile the text with no gap: the whitespace between two sentences belongs
  to the *next* sentence, and a token belongs to the sentence holding its first
  character.

Everything works on Python ``str`` character offsets, which is what fast tokenizers'
``offset_mapping`` reports.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from dataclasses import dataclass
from typing import Sequence

__all__ = [
    "Sentence",
    "split_sentences",
    "split_documents",
    "assign_tokens_to_sentences",
    "has_visible_text",
    "ABBREVIATIONS",
    "RUN_ON_OPENERS",
]

ABBREVIATIONS: frozenset[str] = frozenset(
    {
        "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "ft", "no", "vs", "etc",
        "e.g", "i.e", "cf", "al", "fig", "figs", "eq", "eqs", "vol", "pp", "p", "ch", "sec",
        "approx", "dept", "inc", "ltd", "co", "corp", "jan", "feb", "mar", "apr", "jun",
        "jul", "aug", "sep", "sept", "oct", "nov", "dec", "gen", "gov", "sen", "rep", "col",
        "lt", "capt", "sgt", "u.s", "u.k", "a.m", "p.m", "ph.d", "est", "ave", "blvd", "rd",
    }
)

RUN_ON_OPENERS: tuple[str, ...] = (
    "One", "The", "If", "In", "It", "Its", "This", "That", "These", "Those", "There", "Then", "They", "We", "He",
    "She", "You", "But", "And", "So", "When", "While", "What", "Why", "How", "After", "Before", "Some", "Many",
    "Most", "Our", "My", "His", "Her", "Their", "Your", "Although", "Because", "Since", "However",
)
"""Capitalized words that open a sentence and are rarely capitalized inside one: the run-on
rule of :func:`split_sentences` starts a unit at one of them when it follows a lowercase
word (``"I"`` and ``"A"`` are left out: ``"vitamin A is"``)."""

_RUN_ON = re.compile(r"(?<=[a-z])[ \t]+(?=(?:" + "|".join(RUN_ON_OPENERS) + r")\b)")

# Terminator (+ optional closers) followed by whitespace, or a full-width terminator (CJK: 。！？．,
# half-width ｡; Devanagari danda) with the closing quotes and brackets that follow it (」』”’）】》〉).
_END = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*(?=\s)|[\u3002\uff01\uff1f\uff0e\uff61\u0964\u0965][\u300d\u300f\u201d\u2019\uff09\u3011\u300b\u3009]*")
_WORD_BEFORE = re.compile(r"([A-Za-z][A-Za-z.]*)\.$")
# Characters that show nothing: whitespace, control characters, zero-width and other
# invisible format characters (Unicode Cf), variation selectors and blank fillers.
_INVISIBLE = (
    r"\s\x00-\x1f\x7f-\x9f\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f"
    r"\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff9-\ufffb"
    r"\U0001d173-\U0001d17a\U000e0000-\U000e0fff"
)
_VISIBLE = re.compile(f"[^{_INVISIBLE}]")


def has_visible_text(text: str) -> bool:
    """Whether ``text`` holds a character that shows (not whitespace, control or zero-width)."""
    return _VISIBLE.search(text) is not None


@dataclass(frozen=True)
class Sentence:
    """One segment of the context.

    ``start``/``end`` are character offsets into the full context string; the span
    includes the whitespace that precedes the sentence (so spans tile the text).
    ``text`` is the stripped sentence text. ``doc`` is the index of the document it
    came from (0 when the context was a single string).
    """

    index: int
    start: int
    end: int
    text: str
    doc: int = 0


def _is_abbreviation(text: str, end_of_dot: int) -> bool:
    """True when the ``.`` ending at ``end_of_dot`` closes an abbreviation or initial."""
    m = _WORD_BEFORE.search(text[max(0, end_of_dot - 12) : end_of_dot])
    if not m:
        return False
    word = m.group(1).lower()
    if word in ABBREVIATIONS:
        return True
    # Single initials ("J. K. Rowling") and dotted acronyms ("U.S.A.").
    return len(word.replace(".", "")) == 1 or bool(re.fullmatch(r"(?:[a-z]\.)+[a-z]", word))


def _breakpoints(text: str, run_ons: bool = False) -> list[int]:
    """Character offsets where a new unit may start (end of a sentence or a line; with
    ``run_ons``, also the spaces before a sentence opener that follows a lowercase word)."""
    cuts: set[int] = set()
    for m in _END.finditer(text):
        end = m.end()
        if text[m.start()] == "." and m.group().rstrip("\"'\u201d\u2019)]") == "." and _is_abbreviation(text, m.start() + 1):
            continue
        cuts.add(end)
    for m in re.finditer(r"\n", text):
        cuts.add(m.start())  # the line break itself leads the next unit
    if run_ons:
        for m in _RUN_ON.finditer(text):
            cuts.add(m.start())  # the spaces lead the next unit, as after a terminator
    return sorted(c for c in cuts if 0 < c < len(text))


def _joins_previous(char: str) -> bool:
    """Whether ``char`` belongs to the grapheme before it: a combining mark (Thai and Devanagari
    vowel signs, accents), a variation selector, or a zero-width (non-)joiner."""
    return unicodedata.category(char) in ("Mn", "Mc", "Me") or char in "\u200c\u200d" or "\ufe00" <= char <= "\ufe0f"


def _cut_long(text: str, start: int, end: int, max_chars: int) -> list[int]:
    """Extra cut points so that no unit in ``text[start:end]`` exceeds ``max_chars``: at the last
    space or tab, else (text without any: a URL, base64, Thai, CJK) before the last character that
    starts a grapheme (never before a combining mark or a joiner)."""
    cuts = []
    pos = start
    while end - pos > max_chars:
        window = text[pos : pos + max_chars]
        ws = max(window.rfind(" "), window.rfind("\t"))
        cut = pos + ws if ws > 0 else pos + max_chars
        while cut - pos > 1 and _joins_previous(text[cut]):
            cut -= 1
        cuts.append(cut)
        pos = cut
    return cuts


def split_sentences(text: str, *, offset: int = 0, doc: int = 0, max_chars: int = 600, first_index: int = 0,
                    run_ons: bool = False) -> list[Sentence]:
    """Split ``text`` into sentences whose spans tile ``[offset, offset + len(text))``.

    ``run_ons``: also start a unit at a sentence opener (:data:`RUN_ON_OPENERS`) that
    follows a lowercase word with no punctuation between (off by default; see the module
    docstring).

    Units with nothing visible (whitespace, zero-width and other invisible characters) are
    merged into the following sentence (or the previous one at the end of the text), so every
    returned sentence has visible text. Returns an empty list for a text with nothing visible.
    """
    if max_chars < 20:
        raise ValueError(f"max_chars must be at least 20, got {max_chars}")
    if not isinstance(run_ons, bool):
        raise TypeError(f"run_ons must be a bool, got {type(run_ons).__name__}")
    if not has_visible_text(text):
        return []
    bounds = [0, *_breakpoints(text, run_ons), len(text)]
    pieces: list[tuple[int, int]] = []
    for a, b in zip(bounds, bounds[1:]):
        inner = [a, *_cut_long(text, a, b, max_chars), b]
        pieces.extend(zip(inner, inner[1:]))
    # Merge pieces with nothing visible (whitespace, zero-width characters) forward: they belong to the next sentence.
    merged: list[list[int]] = []
    pending_start: int | None = None
    for a, b in pieces:
        if pending_start is not None:
            a = pending_start
            pending_start = None
        if not has_visible_text(text[a:b]):
            pending_start = a
            continue
        merged.append([a, b])
    if pending_start is not None:  # trailing whitespace joins the last sentence
        merged[-1][1] = len(text)
    return [
        Sentence(index=first_index + i, start=offset + a, end=offset + b, text=text[a:b].strip(), doc=doc)
        for i, (a, b) in enumerate(merged)
    ]


def split_documents(documents: Sequence[str], separator: str = "\n\n", *, max_chars: int = 600,
                    run_ons: bool = False) -> tuple[str, list[Sentence], list[tuple[int, int]]]:
    """Join ``documents`` with ``separator`` and segment each one on its own.

    Sentences never cross a document boundary; the separator belongs to the first
    sentence of the next document. Returns ``(joined_text, sentences, doc_spans)``
    where ``doc_spans[i]`` is the char span of document ``i`` inside the joined text.
    Empty documents are skipped (they keep an empty span). ``run_ons``: as in
    :func:`split_sentences`.
    """
    parts: list[str] = []
    raw: list[Sentence] = []
    doc_spans: list[tuple[int, int]] = []
    pos = 0
    for d, doc in enumerate(documents):
        if not isinstance(doc, str):
            raise TypeError(f"document {d} is {type(doc).__name__}, expected str")
        if parts:
            parts.append(separator)
            pos += len(separator)
        raw.extend(split_sentences(doc, offset=pos, doc=d, max_chars=max_chars, run_ons=run_ons))
        doc_spans.append((pos, pos + len(doc)))
        parts.append(doc)
        pos += len(doc)
    joined = "".join(parts)
    # Close the gaps (separators, empty documents): they belong to the next sentence.
    sentences = []
    for i, s in enumerate(raw):
        start = 0 if i == 0 else raw[i - 1].end
        end = len(joined) if i == len(raw) - 1 else s.end
        sentences.append(Sentence(index=i, start=start, end=end, text=s.text, doc=s.doc))
    return joined, sentences, doc_spans


def assign_tokens_to_sentences(token_starts: Sequence[int], sentences: Sequence[Sentence]) -> list[int]:
    """Sentence index for each token, by the token's first character; -1 outside all.

    ``token_starts`` are character offsets in the same coordinates as the sentence
    spans (use the tokenizer's ``offset_mapping``).
    """
    starts = [s.start for s in sentences]
    out: list[int] = []
    for c in token_starts:
        i = bisect.bisect_right(starts, c) - 1
        out.append(i if i >= 0 and c < sentences[i].end else -1)
    return out
