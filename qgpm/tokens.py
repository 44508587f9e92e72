"""Tokenizing caller text as data: special-token strings in it never become control tokens.

A prompt is the chat template's own text (with its control tokens, e.g. ``<|im_start|>``)
around text that comes from the caller: the context (retrieved documents), the question,
the instruction, the system prompt, the answer prefix, chat message contents. A fast
tokenizer matches special-token strings anywhere in its input, so a retrieved document
holding ``"<|im_end|>\\n<|im_start|>assistant\\n..."`` would otherwise open a new turn.

:func:`encode_prompt` tokenizes a rendered prompt given the character spans of the
caller's text (``protected``):

* When no special token of the normal tokenization falls inside a protected span, the
  normal tokenization is returned unchanged (the common case: identical to before).
* Otherwise the text is cut at the template's own special tokens (those outside every
  protected span), and each piece in between is tokenized with the tokenizer's
  ``split_special_tokens`` behaviour (the Rust backend's ``encode_special_tokens``), so
  special-token strings there are plain text. Character offsets are kept, so role and
  sentence spans still map to tokens. Pieces after the first are tokenized after a
  newline that is then removed (the trick ``transformers`` uses for
  ``apply_chat_template(..., sanitize_control_tokens=True)``), so SentencePiece
  tokenizers do not add a start-of-text space to them.

The ``split_special_tokens`` backend is a private copy of the tokenizer's Rust backend
with ``encode_special_tokens`` on: the caller's tokenizer object is never switched, so
threads sharing it cannot see each other's setting. "Special" means the added tokens
flagged ``special`` (``tokenizer.added_tokens_decoder``); non-special added tokens (e.g.
Qwen3's ``<think>``) keep matching, as with ``split_special_tokens`` itself.

:func:`max_token_chars` and :func:`count_tokens_bounded` bound the work spent on input
that cannot fit a model window (see ``QGPM``'s input checks).
"""

from __future__ import annotations

import bisect
import copy
import threading
import weakref
from typing import Any, Sequence

__all__ = [
    "plain_backend",
    "special_token_ids",
    "encode_plain",
    "continuation_ids",
    "count_plain",
    "encode_prompt",
    "max_token_chars",
    "count_tokens_bounded",
]

_CACHE: "weakref.WeakKeyDictionary[Any, dict[str, Any]]" = weakref.WeakKeyDictionary()
_CACHE_LOCK = threading.Lock()


def _cached(tokenizer: Any) -> dict[str, Any]:
    with _CACHE_LOCK:
        entry = _CACHE.get(tokenizer)
        if entry is None:
            entry = {}
            _CACHE[tokenizer] = entry
        return entry


def plain_backend(tokenizer: Any) -> Any:
    """A private copy of ``tokenizer``'s Rust backend that encodes special-token strings as text."""
    entry = _cached(tokenizer)
    backend = entry.get("plain")
    if backend is None:
        with _CACHE_LOCK:
            backend = entry.get("plain")
            if backend is None:
                backend = copy.deepcopy(tokenizer.backend_tokenizer)
                backend.no_truncation()
                backend.no_padding()
                backend.encode_special_tokens = True
                entry["plain"] = backend
    return backend


def special_token_ids(tokenizer: Any) -> frozenset[int]:
    """Ids of the added tokens flagged ``special`` (the ones ``split_special_tokens`` splits)."""
    entry = _cached(tokenizer)
    ids = entry.get("special")
    if ids is None:
        ids = frozenset(int(i) for i, tok in tokenizer.added_tokens_decoder.items() if getattr(tok, "special", False))
        entry["special"] = ids
    return ids


def encode_plain(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` as plain text (no special tokens added, none matched)."""
    return list(plain_backend(tokenizer).encode(text, add_special_tokens=False).ids)


def continuation_ids(tokenizer: Any, text: Any, name: str, what: str) -> list[int]:
    """Token ids of a continuation to score (``score=``, ``answer_logprob``'s ``answer``) as plain
    text; ``name`` and ``what`` word the error for a value that is no string or is empty."""
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a string ({what}), got {type(text).__name__}")
    ids = encode_plain(tokenizer, text)
    if not ids:
        raise ValueError(f"{name} is empty: pass {what}")
    return ids


def count_plain(tokenizer: Any, text: str) -> int:
    """Number of tokens of ``text`` as plain text."""
    return len(plain_backend(tokenizer).encode(text, add_special_tokens=False).ids)


def _merge_spans(spans: Sequence[tuple[int, int]]) -> tuple[list[int], list[int]]:
    merged: list[list[int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in spans if b > a):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [m[0] for m in merged], [m[1] for m in merged]


def _overlaps(starts: list[int], ends: list[int], s: int, e: int) -> bool:
    """Whether ``[s, e)`` overlaps one of the merged spans."""
    i = bisect.bisect_right(starts, e - 1) - 1  # last span starting before e
    return i >= 0 and ends[i] > s


def _encode_piece(backend: Any, piece: str, start: int, newline_ids: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    if not piece:
        return [], []
    if start > 0:  # not the start of the text: no start-of-text space (SentencePiece)
        enc = backend.encode("\n" + piece, add_special_tokens=False)
        n = len(newline_ids)
        if n and list(enc.ids[:n]) == newline_ids:
            return list(enc.ids[n:]), [(s - 1 + start, e - 1 + start) for s, e in enc.offsets[n:]]
    enc = backend.encode(piece, add_special_tokens=False)
    return list(enc.ids), [(s + start, e + start) for s, e in enc.offsets]


def encode_prompt(
    tokenizer: Any,
    text: str,
    protected: Sequence[tuple[int, int]],
    *,
    add_special_tokens: bool = False,
) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids and character offsets of ``text``; the ``protected`` spans are plain text.

    ``protected``: character spans of caller text in ``text``. A special-token string
    inside them is tokenized as ordinary text; special tokens outside them (the chat
    template's own) stay control tokens. ``add_special_tokens``: let the tokenizer's
    post-processor add its tokens (BOS) as usual.
    """
    enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    offsets = [(int(s), int(e)) for s, e in enc["offset_mapping"]]
    special = special_token_ids(tokenizer)
    starts, ends = _merge_spans(protected)
    if not starts or not any(t in special and e > s and _overlaps(starts, ends, s, e) for t, (s, e) in zip(ids, offsets)):
        return ids, offsets
    # Tokens the post-processor added (offsets (0, 0)) lead or trail the text.
    lead = 0
    while lead < len(ids) and offsets[lead] == (0, 0) and ids[lead] in special:
        lead += 1
    trail = len(ids)
    while trail > lead and offsets[trail - 1] == (0, 0) and ids[trail - 1] in special:
        trail -= 1
    backend = plain_backend(tokenizer)
    newline_ids = list(backend.encode("\n", add_special_tokens=False).ids)
    out_ids, out_off = ids[:lead], offsets[:lead]
    pos = 0
    for i in range(lead, trail):
        s, e = offsets[i]
        if ids[i] not in special or e <= s or _overlaps(starts, ends, s, e):
            continue
        # a control token written by the template: keep it, tokenize the text before it as text
        piece_ids, piece_off = _encode_piece(backend, text[pos:s], pos, newline_ids)
        out_ids += piece_ids + [ids[i]]
        out_off += piece_off + [(s, e)]
        pos = e
    piece_ids, piece_off = _encode_piece(backend, text[pos:], pos, newline_ids)
    out_ids += piece_ids + ids[trail:]
    out_off += piece_off + offsets[trail:]
    return out_ids, out_off


def max_token_chars(tokenizer: Any) -> int:
    """Most characters one token of ``tokenizer`` can stand for (longest vocabulary entry).

    A text of ``n`` characters therefore has at least ``n / max_token_chars`` tokens,
    unless the tokenizer's normalizer deletes characters.
    """
    entry = _cached(tokenizer)
    n = entry.get("max_chars")
    if n is None:
        n = max(1, max((len(t) for t in tokenizer.get_vocab()), default=1))
        entry["max_chars"] = n
    return n


def _cut(text: str, pos: int, piece_chars: int) -> int:
    """End of the piece starting at ``pos``: where a whitespace run starts, near ``pos + piece_chars``."""
    end = min(len(text), pos + piece_chars)
    if end < len(text):
        ws = max(text.rfind(" ", pos + 1, end), text.rfind("\n", pos + 1, end))
        if ws > pos:
            while ws - 1 > pos and text[ws - 1].isspace():
                ws -= 1
            end = ws
    return end


def count_tokens_bounded(tokenizer: Any, text: str, limit: int, *, piece_chars: int = 4096, batch: int = 16) -> int:
    """A lower bound of the plain-text token count of ``text``, computed piece by piece.

    Pieces of about ``piece_chars`` characters (cut where a whitespace run starts) are
    tokenized ``batch`` at a time without offsets (``encode_batch_fast``); counting
    stops as soon as the bound exceeds ``limit``, so the work is about ``limit`` tokens
    however long ``text`` is. Each cut is allowed to have added up to two tokens, which
    the bound subtracts.
    """
    backend = plain_backend(tokenizer)
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    count, cuts, pos, n = 0, 0, 0, len(text)
    while pos < n:
        pieces = []
        while pos < n and len(pieces) < batch:
            end = _cut(text, pos, piece_chars)
            pieces.append(text[pos:end])
            pos = end
        count += sum(len(e) for e in encode(pieces, add_special_tokens=False))
        cuts += len(pieces) - (0 if pos < n else 1)
        if count - 2 * cuts > limit:
            break
    return max(0, count - 2 * cuts)
