"""Input-editing baselines: Top-K and Reorder over reranked chunks (paper Sec. 5.3).

The context is split into sentence-aligned chunks (:func:`chunk_sentences`), each
chunk is scored against the question by a reranker (:mod:`qgpm.rerank`), and the
context is rewritten:

* **Top-K** (:func:`topk_edit`) keeps the ``k`` best chunks (default 5) in their
  original order and drops the rest.
* **Reorder** (:func:`reorder_edit`) keeps every chunk, sorted by ascending score so
  that the most relevant chunk comes last, right before the question.

The two rules themselves are :func:`topk_order` and :func:`reorder_order`: pure functions
from scores to indices, shared by the engine (through :func:`edit_context`) and by the
LangChain / LlamaIndex adapters, which reorder documents or nodes instead of chunks.

Chunks of the edited context are joined by ``"\\n\\n"``. The model then answers over the
edited context with standard RoPE. Ties in score are broken by original order: Top-K
prefers the earlier chunk, and Reorder keeps tied chunks in their original relative
order (so all-equal scores leave the context order unchanged).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

from .defaults import DEFAULT_K, DEFAULT_RERANKER
from .rerank import Reranker, get_reranker
from .segment import Sentence, split_documents, split_sentences

__all__ = [
    "Chunk",
    "EditedContext",
    "check_k",
    "chunk_sentences",
    "topk_order",
    "reorder_order",
    "topk_edit",
    "reorder_edit",
    "edit_context",
    "CHUNK_SEPARATOR",
]

CHUNK_SEPARATOR = "\n\n"
"""String placed between chunks in an edited context."""


@dataclass(frozen=True)
class Chunk:
    """A run of consecutive sentences of one document.

    Attributes:
        index: Position of the chunk in the original context (0-based).
        start: Start character offset in the context string (inclusive).
        end: End character offset in the context string (exclusive). Chunk spans tile
            the context like sentence spans do (leading whitespace belongs to the chunk).
        text: The chunk's text, stripped (``context[start:end].strip()``).
        doc: Index of the document the chunk comes from (0 for a single string).
    """

    index: int
    start: int
    end: int
    text: str
    doc: int = 0


@dataclass
class EditedContext:
    """Result of a Top-K or Reorder edit.

    Attributes:
        text: The edited context: the chunks in ``order``, stripped and joined by
            ``"\\n\\n"`` (``""`` when there are no chunks).
        chunks: All chunks of the original context, in original order.
        scores: Reranker score of each chunk, indexed like ``chunks``.
        kept: Indices of the chunks present in ``text``, in the order they appear
            there (for Top-K this is ascending; for Reorder it is every chunk).
        order: Chunk indices in the order they appear in ``text`` (identical to
            ``kept``; kept as a separate name for readability at call sites).
        mode: ``"topk"`` or ``"reorder"``.
    """

    text: str
    chunks: list[Chunk]
    scores: list[float]
    kept: list[int]
    order: list[int]
    mode: str
    spans: list[tuple[int, int]] = field(default_factory=list)
    """Character span of each chunk of ``order`` inside ``text`` (filled automatically)."""

    def __post_init__(self) -> None:
        if not self.spans and self.order:
            pos = 0
            spans = []
            for i in self.order:
                n = len(self.chunks[i].text)
                spans.append((pos, pos + n))
                pos += n + len(CHUNK_SEPARATOR)
            self.spans = spans

    @property
    def dropped(self) -> list[int]:
        """Indices of chunks that are not in the edited text (ascending)."""
        present = set(self.kept)
        return [c.index for c in self.chunks if c.index not in present]


def _word_count(text: str) -> int:
    return len(text.split())


def chunk_sentences(
    text: str,
    sentences: Sequence[Sentence],
    *,
    chunk_tokens: int = 128,
    count_tokens: Callable[[str], int] | None = None,
) -> list[Chunk]:
    """Group consecutive sentences into chunks of at most about ``chunk_tokens`` tokens.

    Greedy: sentences are added to the current chunk while the running token count
    (the sum of the sentences' counts) stays within ``chunk_tokens``; a sentence that is
    longer than ``chunk_tokens`` on its own becomes its own chunk. A chunk never crosses
    a document boundary (``Sentence.doc``).

    Args:
        text: The context string the sentence spans refer to.
        sentences: Sentences of ``text`` in order (from :func:`qgpm.segment.split_sentences`
            or :func:`qgpm.segment.split_documents`).
        chunk_tokens: Token budget per chunk.
        count_tokens: Token counter for a sentence's text; defaults to a whitespace
            word count. Pass e.g. ``lambda s: len(tok.encode(s, add_special_tokens=False))``
            to count model tokens.

    Returns:
        Chunks in order, with spans from the first sentence's start to the last
        sentence's end (so they tile ``text`` when the sentences do).

    Raises:
        ValueError: If ``chunk_tokens < 1`` or a sentence span lies outside ``text``.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    count = count_tokens or _word_count
    chunks: list[Chunk] = []
    group: list[Sentence] = []
    used = 0

    def flush() -> None:
        nonlocal group, used
        if group:
            start, end = group[0].start, group[-1].end
            chunks.append(Chunk(index=len(chunks), start=start, end=end, text=text[start:end].strip(), doc=group[0].doc))
        group, used = [], 0

    prev_end = None
    for s in sentences:
        if not (0 <= s.start <= s.end <= len(text)):
            raise ValueError(f"sentence {s.index} span ({s.start}, {s.end}) lies outside the text (length {len(text)})")
        if prev_end is not None and s.start < prev_end:
            raise ValueError(f"sentence {s.index} overlaps the previous sentence: sentences must be in order")
        prev_end = s.end
        n = max(0, int(count(s.text)))
        if group and (s.doc != group[0].doc or used + n > chunk_tokens):
            flush()
        group.append(s)
        used += n
    flush()
    return chunks


def _finite(scores: Sequence[float]) -> list[float]:
    out = [float(s) for s in scores]
    bad = [i for i, s in enumerate(out) if not math.isfinite(s)]
    if bad:
        raise ValueError(f"non-finite scores for chunks {bad}")
    return out


def _check_scores(chunks: Sequence[Chunk], scores: Sequence[float]) -> list[float]:
    if len(scores) != len(chunks):
        raise ValueError(f"got {len(scores)} scores for {len(chunks)} chunks")
    return _finite(scores)


def check_k(k: int) -> int:
    """``k`` (how many chunks Top-K keeps) as an int; ``TypeError`` for a non-int (a bool or a
    float such as 2.0 included), ``ValueError`` below 1."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return int(k)


def topk_order(scores: Sequence[float], k: int) -> list[int]:
    """Indices of the ``k`` highest scores, in ascending (original) order: the Top-K rule.

    Ties are broken by original order (the earlier item wins). With ``k`` at least
    ``len(scores)`` every index is kept.

    Raises:
        TypeError: If ``k`` is not an int.
        ValueError: If ``k < 1`` or a score is not finite.
    """
    check_k(k)
    s = _finite(scores)
    return sorted(sorted(range(len(s)), key=lambda i: (-s[i], i))[:k])


def reorder_order(scores: Sequence[float]) -> list[int]:
    """Every index, sorted by ascending score so the best item comes last: the Reorder rule.

    Sorting is stable: items with equal scores keep their original relative order.

    Raises:
        ValueError: If a score is not finite.
    """
    s = _finite(scores)
    return sorted(range(len(s)), key=lambda i: (s[i], i))


def _build(text: str, chunks: Sequence[Chunk], scores: list[float], order: list[int], mode: str) -> EditedContext:
    edited = CHUNK_SEPARATOR.join(chunks[i].text for i in order)
    return EditedContext(text=edited, chunks=list(chunks), scores=scores, kept=list(order), order=list(order), mode=mode)


def topk_edit(text: str, chunks: Sequence[Chunk], scores: Sequence[float], k: int = 5) -> EditedContext:
    """Keep the ``k`` highest-scoring chunks, in their original order.

    Ties are broken by original order (the earlier chunk wins). With ``k`` at least
    the number of chunks, every chunk is kept in original order.

    Args:
        text: The original context (the chunk spans refer to it).
        chunks: Chunks of ``text`` in order.
        scores: One score per chunk (higher = more relevant).
        k: Number of chunks to keep.

    Returns:
        The edited context with ``mode="topk"``.

    Raises:
        ValueError: If ``k < 1``, or ``scores`` does not match ``chunks`` or has
            non-finite values.
    """
    check_k(k)
    s = _check_scores(chunks, scores)
    return _build(text, chunks, s, topk_order(s, k), "topk")


def reorder_edit(text: str, chunks: Sequence[Chunk], scores: Sequence[float]) -> EditedContext:
    """Keep every chunk, sorted by ascending score so the best chunk comes last.

    The most relevant chunk thus ends right before the question. Sorting is stable:
    chunks with equal scores keep their original relative order.

    Args:
        text: The original context (the chunk spans refer to it).
        chunks: Chunks of ``text`` in order.
        scores: One score per chunk (higher = more relevant).

    Returns:
        The edited context with ``mode="reorder"``.

    Raises:
        ValueError: If ``scores`` does not match ``chunks`` or has non-finite values.
    """
    s = _check_scores(chunks, scores)
    return _build(text, chunks, s, reorder_order(s), "reorder")


def edit_context(
    context: str | Sequence[str],
    question: str,
    *,
    mode: Literal["topk", "reorder"],
    reranker: Reranker | str = DEFAULT_RERANKER,
    k: int = DEFAULT_K,
    chunk_tokens: int = 128,
    count_tokens: Callable[[str], int] | None = None,
) -> EditedContext:
    """Segment, chunk, rerank and edit a context for the Top-K or Reorder baseline.

    Args:
        context: One string, or a list of documents (joined with ``"\\n\\n"`` by
            :func:`qgpm.segment.split_documents`; chunks never cross documents).
        question: The question the chunks are scored against.
        mode: ``"topk"`` or ``"reorder"``.
        reranker: A :class:`qgpm.rerank.Reranker` or a spec for
            :func:`qgpm.rerank.get_reranker` (``"bm25"``, ``"minilm"``, ``"judge"``, ...).
        k: Chunks kept by Top-K (ignored by Reorder, but still validated).
        chunk_tokens: Token budget per chunk.
        count_tokens: Token counter (defaults to a whitespace word count).

    Returns:
        The edited context. An empty or whitespace-only context gives an
        ``EditedContext`` with empty ``text`` and no chunks (the reranker is not called).

    Raises:
        ValueError: For an unknown ``mode``, ``k < 1``, ``chunk_tokens < 1`` or an empty
            question.
    """
    if mode not in ("topk", "reorder"):
        raise ValueError(f"mode must be 'topk' or 'reorder', got {mode!r}")
    check_k(k)
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if not isinstance(question, str) or not question.strip():
        raise ValueError("question is empty: the input-editing baselines need a question to rank chunks")
    if isinstance(context, str):
        text = context
        sentences = split_sentences(text)
    else:
        text, sentences, _ = split_documents(list(context))
    chunks = chunk_sentences(text, sentences, chunk_tokens=chunk_tokens, count_tokens=count_tokens)
    if not chunks:
        return EditedContext(text="", chunks=[], scores=[], kept=[], order=[], mode=mode)
    scores = get_reranker(reranker).score(question, [c.text for c in chunks])
    if mode == "topk":
        return topk_edit(text, chunks, scores, k=k)
    return reorder_edit(text, chunks, scores)
