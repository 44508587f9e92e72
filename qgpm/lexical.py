"""Lexical relevance: Okapi BM25, the one scorer behind the query-term filter
(``QGPMConfig.term_ratio``, :func:`qgpm.plan.term_filter`) and :class:`qgpm.rerank.BM25Reranker`.

BM25 (Lucene variant) through ``bm25s``: the passages of each call form the corpus (IDF is
computed over them); tokens come from :func:`words`: the text NFKC-normalized and lowercased,
words of two or more characters (a letter keeps its combining marks: Devanagari and Thai
vowel signs), and in scripts written without spaces (Chinese, Japanese, Thai, Lao, Khmer,
Myanmar) overlapping pairs of characters, as Lucene's CJK analyzer does. English stopwords
are removed (common words of other languages weigh little through IDF over a real context);
no stemming. A passage that shares no (non-stopword) term with the query scores exactly
``0.0``; a query with no such term gives all zeros.
"""

from __future__ import annotations

import functools
import logging
import re
import unicodedata
from typing import Any, Sequence

__all__ = ["bm25_scores", "require_bm25", "words", "BM25S_HINT"]

BM25S_HINT = "It is one of qgpm's own dependencies: reinstall qgpm (`pip install -e .`) or run `pip install 'bm25s>=0.2,<0.4'`."

_QUIETED = False


def require_bm25(what: str) -> Any:
    """The ``bm25s`` module, or ``ImportError`` saying that ``what`` needs it and how to install it.

    ``bm25s`` sets its own logger to DEBUG on import, so an application that logs at INFO would
    print "Building index from IDs" on every call; the first time, a DEBUG level on that logger
    is put back to NOTSET (the root's level applies). Any other level, and any set later, is kept."""
    global _QUIETED
    try:
        import bm25s  # heavy: bm25s loads scipy.sparse (about 0.1 s here), only when something is scored by BM25
    except ImportError as exc:
        raise ImportError(f"{what} needs the package 'bm25s'. {BM25S_HINT}") from exc
    if not _QUIETED:
        log = logging.getLogger(bm25s.__name__)
        if log.level == logging.DEBUG:
            log.setLevel(logging.NOTSET)
        _QUIETED = True
    return bm25s


# Scripts written without spaces between words: runs of them are indexed as overlapping character pairs.
_NO_SPACE = ("\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
             "\uf900-\ufaff\uff66-\uff9f\U00020000-\U0002fa1f")


_NO_SPACE_CHAR = re.compile(f"[{_NO_SPACE}]")


@functools.cache
def _patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(a word: word characters with their combining marks; one grapheme of a no-space script, or a stretch of other characters)."""
    marks = "".join(chr(c) for c in range(0x10000) if unicodedata.category(chr(c)) in ("Mn", "Mc", "Me"))  # the BMP: 0.1 s, once
    mark_class = re.escape(marks)
    word = re.compile(f"[\\w{mark_class}]+")
    grapheme = re.compile(f"[{_NO_SPACE}][{mark_class}]*|[^{_NO_SPACE}]+")
    return word, grapheme


def words(text: str) -> list[str]:
    """The BM25 terms of ``text`` (lowercase it first, as ``bm25s`` does): NFKC-normalized words of
    two or more characters; a run in a script written without spaces becomes its overlapping pairs
    of graphemes (a single one stays as it is)."""
    word, grapheme = _patterns()
    out: list[str] = []
    for run in word.findall(unicodedata.normalize("NFKC", text)):
        if not _NO_SPACE_CHAR.search(run):  # most words: no grapheme walk
            if len(run) >= 2:
                out.append(run)
            continue
        chunk: list[str] = []  # the graphemes of the current no-space stretch
        for part in grapheme.findall(run) + [""]:
            if part and _NO_SPACE_CHAR.match(part):
                chunk.append(part)
                continue
            if chunk:
                out.extend([chunk[0]] if len(chunk) == 1 else [a + b for a, b in zip(chunk, chunk[1:])])
                chunk = []
            if len(part) >= 2:
                out.append(part)
    return out


def bm25_scores(query: str, passages: Sequence[str], *, k1: float = 1.5, b: float = 0.75,
                stopwords: str | list[str] | None = "en") -> list[float]:
    """BM25 score of each of ``passages`` for ``query`` (``k1``: term-frequency saturation,
    ``b``: length normalization, ``stopwords``: a ``bm25s`` stopword list name or list,
    ``None`` keeps every word)."""
    bm25s = require_bm25("BM25 scoring")
    if not passages:
        return []
    tokenizer = bm25s.tokenization.Tokenizer(lower=True, splitter=words, stopwords=stopwords or [])
    corpus_ids = tokenizer.tokenize(list(passages), update_vocab=True, return_as="ids", show_progress=False)
    vocab = tokenizer.get_vocab_dict()
    query_tokens = tokenizer.tokenize([query], update_vocab=False, return_as="string", show_progress=False)[0]
    query_ids = [vocab[t] for t in query_tokens if t and t in vocab]
    if not query_ids:
        return [0.0] * len(passages)
    retriever = bm25s.BM25(k1=k1, b=b)
    retriever.index((corpus_ids, vocab), show_progress=False)
    return [float(v) for v in retriever.get_scores(query_ids).tolist()]
