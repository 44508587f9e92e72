"""What ``qgpm ask`` prints for each method: its answer with the timings, and why it answered so
(the sentences QGPM or the Oracle ranked best and what the plan did with them; for the other
methods, what they did to the context instead). Every text from the context, the question or an
answer is shown through :func:`qgpm.explain.printable`."""

from __future__ import annotations

import re

from .explain import best_chunks, clip, decision_note, no_ranking_note, printable, ranked_by, sentence_rows, term_note
from .methods import Stage, method_spec
from .sources import parse_source

__all__ = ["holds_answer", "print_answer", "print_why"]


def holds_answer(text: str, expected: str) -> bool:
    """Whether ``text`` holds ``expected`` as words of its own, case aside: "3 November" is not
    in "13 November", nor "412" in "4120"."""
    return re.search(r"(?<!\w)" + re.escape(expected.strip()) + r"(?!\w)", text, flags=re.IGNORECASE) is not None


def print_answer(method: str, result, *, width: int, expected: str | None = None) -> None:
    """One method's answer with its timing, aligned with the others; with ``expected`` (a bundled
    example), whether the answer holds it."""
    t = result.timings
    stage = "pass 1" if parse_source(result.details.relevance_source or "heads").heads else "ranking"
    timing = f"{t.total_s:.1f} s, first token {t.first_token_s:.1f} s" + (f" ({stage} {t.pass1_s:.1f} s)" if t.pass1_s else "")
    answer = printable(" ".join(result.text.split())) or "(empty answer)"
    if expected is not None:
        answer += "   <- has the expected answer" if holds_answer(result.text, expected) else "   <- not the expected answer"
    print(f"\n{method:<{width}}  {answer}\n{'':<{width}}  [{result.usage.prompt_tokens} prompt tokens, {result.usage.answer_tokens} answer tokens; {timing}]")


def print_why(method: str, result, top: int) -> None:
    """What a method did to the context: the sentences QGPM/Oracle ranked best (rank, relevance,
    score, what the plan did, depth in the context); for a method without a ranking, what it
    did instead (the chunks Top-K/Reorder kept, the compression, a baseline's settings)."""
    if result.relevance:
        rows = sorted(sentence_rows(result), key=lambda r: r["rank"])[:top]
        d = result.details
        by = ranked_by(result)
        said = d.relevance_source or method_spec(method).stage is Stage.EVIDENCE  # the heads, the default, go unsaid
        ranked = f", {by}" if by and said else ""
        print(f"\n{method} ranked (top {len(rows)} of {len(result.relevance)} sentences{ranked}; {d.promoted or 0} promoted):")
        if result.config is not None:
            print(f"  settings: {printable(' '.join(result.config.provenance.split()))}")  # the preset, then any overrides: all of it
        print("  z: how far the sentence's relevance to the question stands above the context's average, in standard deviations")
        print("  score: its weight in the position plan, 1 = a full position step; lower: compressed on the fast rotary planes "
              "(remap stride) or left in place (reorder); text before the first relevant sentence also scores 1 and stays in place")
        print("  plan: promoted = moved next to the question (reorder, move; 'promoted, start': to the context's start, placement ends) "
              "or kept a full step (stride); term filter = top-ranked, left in place by the query-term filter")
        print("  depth: where the sentence sits in the context, 0 % = its start")
        print("  rank      z  score  plan             depth  sentence")
        for r in rows:
            z = "      " if r["z"] is None else f"{r['z']:+6.2f}"
            did = ("promoted" + (", start" if r["moved_to"] == "start" else "")) if r["promoted"] else "term filter" if r["term_dropped"] else ""
            print(f"  #{r['rank'] + 1:<3} {z}  {r['sharp']:5.2f}  {did:<15}  {100 * r['depth']:4.0f} %  {clip(r['text'], 110)}")
        note = decision_note(d, method, top_z=rows[0]["z"] if rows else None)
        if note:
            print(f"  ({note})")
        if d.term_dropped:
            print(f"  ({term_note(d.term_dropped)})")
        return
    print(f"\n{method}: {no_ranking_note(result)}")
    for line in best_chunks(result, top):
        print(f"  {line}")
    settings = result.details.settings
    if method_spec(method).options and settings:
        print(f"{method} settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
