"""Seeing why QGPM answered as it did: an HTML view and a relevance plot of one result.

    result = engine.answer(context, question, method="qgpm")
    Path("why.html").write_text(result.to_html())    # self-contained page, no network
    result.plot().savefig("relevance.png")            # relevance z against position in the context

Both read only the result: the context as the prompt held it, the question, the answer and
every sentence's rank, relevance ``z``, map scores (``broad`` in the lower layers, ``sharp``
in the upper ones) and whether the plan promoted it (moved it next to the question, or to the
context's start under ``placement="ends"``, or kept it a full step under ``remap="stride"``) or
the query-term filter left it in place. All text is
escaped: nothing from the context can become markup or script, and a control character (an
escape sequence's ESC, a carriage return) is shown as its symbol on the page, in ``explain()``
and in ``qgpm ask``'s output, never sent to the terminal.
"""

from __future__ import annotations

import functools
import html
import numbers
from typing import Any, Protocol, Sequence

from .diagnostics import Diagnostics
from .methods import METHOD_SPECS, Stage

__all__ = ["render_html", "plot_relevance", "sentence_rows", "decision_note", "term_note", "no_ranking_note", "best_chunks", "ranked_by",
           "clip", "printable", "check_count", "Explained"]


class Explained(Protocol):
    """What the views read from an answer (:class:`qgpm.QGPMResult` has all of it)."""

    text: str
    method: str
    relevance: list[Any]
    details: Diagnostics
    context: str | None
    question: str | None
    usage: Any
    timings: Any
    edit: Any

_CSS = """
body{font:15px/1.55 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:980px;color:#1d232b;padding:0 1em}
h1{font-size:1.35em;margin:.2em 0}h2{font-size:1.1em;margin:1.4em 0 .4em}
.box{border:1px solid #d5dae1;border-radius:8px;padding:.8em 1em;margin:.6em 0;background:#fafbfc}
.answer{background:#eef7ee;border-color:#9ccc9c}.meta{color:#5b6572;font-size:.9em}
.ctx{white-space:pre-wrap;overflow-wrap:anywhere}.s{border-radius:3px;padding:1px 0}
.promoted{outline:2px solid #1f6fd1;outline-offset:1px}.dropped{outline:1px dashed #8a5a00;outline-offset:1px}
table{border-collapse:collapse;font-size:.92em;width:100%}td,th{border-bottom:1px solid #e3e7ec;padding:.3em .5em;text-align:left;vertical-align:top;overflow-wrap:anywhere}
th{background:#f1f3f6}.legend span{display:inline-block;padding:0 .5em;margin-right:.4em;border-radius:3px}
"""


def _shade(score: float) -> str:
    """Background for a sentence: white (least relevant) to amber (most), as an rgba string."""
    a = max(0.0, min(1.0, score))
    return f"rgba(255,176,0,{0.08 + 0.62 * a:.3f})"


def term_note(n: int) -> str:
    """What the query-term filter (``QGPMConfig.term_ratio``) did, for ``qgpm ask`` and the page."""
    return (f"term_ratio: {n} of the top-ranked sentences carried too few of the question's rare words "
            "(BM25), so they were not promoted and kept their place")


def promoted_label(promoted: bool, moved_to: str | None, *, lead: str = "") -> str:
    """What the plan did with a promoted sentence, in a word or three: ``"promoted"``, or
    ``"promoted to the start"`` for one moved to the context's start (``placement="ends"``);
    ``""`` for one not promoted."""
    if not promoted:
        return ""
    return lead + ("promoted to the start" if moved_to == "start" else "promoted")


# Control characters as visible symbols: C0 as Unicode's control pictures (ESC -> "␛"), DEL as "␡", C1 as U+FFFD;
# so are the bidirectional embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069), with which a document
# could reorder the text shown after it on a page or a bidi-aware terminal (the marks U+200E / U+200F stay).
_BIDI_CONTROLS = (*range(0x202A, 0x202F), *range(0x2066, 0x206A))
_PICTURES = ({c: 0x2400 + c for c in range(0x20)} | {0x7F: 0x2421} | {c: 0xFFFD for c in range(0x80, 0xA0)}
             | {c: 0xFFFD for c in _BIDI_CONTROLS})
_TERMINAL_KEEPS = "\n\t"
_HTML_KEEPS = "\n\t\r\x0c"  # HTML's own whitespace: harmless on a page, and every CRLF line end would show a symbol


@functools.lru_cache(maxsize=8)
def _pictures_but(keep: str) -> dict[int, int]:
    return {c: v for c, v in _PICTURES.items() if chr(c) not in keep}


def printable(text: str, keep: str = _TERMINAL_KEEPS) -> str:
    """``text`` with every control character but those in ``keep`` (line feed and tab) shown as
    a visible symbol, one character for one, so offsets still hold: context or answer text
    printed to a terminal cannot move the cursor, recolour it or run an escape sequence, nor
    reorder what follows it with a bidirectional override."""
    return text.translate(_pictures_but(keep))


def clip(text: str, n: int, *, tail: int = 0) -> str:
    """``text`` on one line (its whitespace runs folded to one space, control characters shown:
    :func:`printable`), cut to ``n`` characters with "…" where it was cut; with ``tail``, its
    last ``tail`` characters are kept after " ... " instead (where ``n`` leaves room for them).
    A cut inside a word moves back to the space before it, if that lies within 20 characters."""
    text = printable(" ".join(text.split()))
    if len(text) <= n:
        return text
    if not tail or n - tail - 5 < 1:
        return _cut_back(text, n - 1) + "…"
    end = text[len(text) - tail :]
    if text[len(text) - tail - 1] != " " and " " in end[:20]:  # mid-word
        end = end[end.index(" ") + 1 :]
    return _cut_back(text, n - tail - 5) + " ... " + end.lstrip()


def _cut_back(text: str, cut: int) -> str:
    """``text[:cut]``, moved back to a space within 20 characters where ``cut`` falls inside a word."""
    head = text[: max(cut, 0)]
    if cut < len(text) and text[cut] != " " and " " in head[-20:]:
        head = head[: head.rindex(" ")]
    return head.rstrip()


def check_count(k: Any, name: str) -> int:
    """``k`` checked as a count of top-ranked sentences or chunks to show: an integer >= 0 (a
    negative one would slice from the end); raises ``TypeError`` / ``ValueError`` saying so."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"{name} must be an int >= 0 (how many top-ranked sentences or chunks to show), got {type(k).__name__} {k!r}")
    if k < 0:
        raise ValueError(f"{name} must be >= 0 (how many top-ranked sentences or chunks to show), got {k}")
    return int(k)


def decision_note(details: Diagnostics, method: str, top_z: float | None = None) -> str | None:
    """Why a call kept vanilla positions (``details.kept_reason``: the confidence rules of
    :class:`qgpm.settings.ConfidenceRules`, the short-context rule, or nothing left relevant) or
    promoted one sentence alone, for ``explain()``, ``qgpm ask`` and the page; ``None`` where the
    call promoted sentences as its ranking and maps say. ``top_z``: the best-ranked sentence's z,
    set beside the threshold when the flat rule fired."""
    reason = details.kept_reason
    threshold = details.min_top_z
    if reason == "flat" and (threshold is None or details.tied_relevance):  # the flat call was a tie
        return f"the relevance ranked no sentence above another (every score the same), so {method} kept vanilla positions"
    if reason == "flat" or (reason is None and details.flat_relevance):
        if top_z is not None and threshold is not None and top_z < threshold:
            return f"the relevance was flat (the top z, {top_z:+.2f}, is below min_top_z {threshold:g}), so {method} kept vanilla positions"
        below = f"min_top_z {threshold:g}" if threshold is not None else "min_top_z"
        return f"the relevance was flat (top z below {below}, or every score the same), so {method} kept vanilla positions"
    if reason == "decisive" or (reason is None and details.decisive_relevance):
        return f"one sentence stood out (its z at least decisive_margin above the next), so {method} kept vanilla positions"
    if reason == "keep_length":
        return f"the context is no longer than keep_length, so {method} kept vanilla positions"
    if reason == "s_low":
        return f"s_low is 1 (no sentence is compressed or moved), so {method} kept vanilla positions"
    if reason == "nothing_promoted":
        return (f"no sentence was left to promote (after the z window, the solo rule and the query-term filter), so {method} "
                "kept vanilla positions")
    if details.solo_relevance:
        return f"the top sentence stood out (its z at least solo_margin above the next), so {method} promoted it alone"
    return None


def best_chunks(result: Explained, k: int) -> list[str]:
    """One line per chunk of a Top-K / Reorder edit that scored best (at most ``k``, best first):
    its index, its reranker score and its first characters; ``[]`` for any other result."""
    edit = result.edit
    scores = getattr(edit, "scores", None)
    if not scores or not getattr(edit, "kept", None):
        return []
    best = sorted(edit.kept, key=lambda i: (-scores[i], i))[:k]
    return [f"chunk {i} (score {scores[i]:.2f}): {clip(edit.chunks[i].text, 100)}" for i in best]


def ranked_by(result: Explained) -> str | None:
    """What ranked a result's sentences, for ``explain()``, ``qgpm ask`` and the page: the
    reranker source, the model's heads, or the Oracle's given evidence (whose other sentences
    carry no ranking: they follow in context order); ``None`` for a method without a ranking."""
    source = result.details.relevance_source
    if source:
        return f"ranked by {source}"
    spec = METHOD_SPECS.get(result.method)
    stage = spec.stage if spec is not None else None
    if stage is Stage.HEADS:
        return "ranked by the model's heads"
    if stage is Stage.EVIDENCE:
        return ("ranked by the given evidence: the sentences holding it first, the others in context order; only the evidence "
                "text moves, the rest of its sentence keeps its place")
    return None


def no_ranking_note(result: Explained) -> str:
    """What a call without a sentence ranking did to the context, for ``explain()``, ``qgpm ask``
    and the page."""
    d, edit = result.details, result.edit
    if d.empty_context:
        return "no context was given: the fixed reply, the model did not run"
    if result.method == "plain":
        return "plain chat: no context, standard positions"
    spec = METHOD_SPECS.get(result.method)
    stage = spec.stage if spec is not None else None
    if stage is Stage.EDIT and edit is not None:
        if edit.mode == "topk":
            return f"the reranker kept the best chunks: chunks {list(edit.kept)} of {len(edit.chunks)} are in the prompt, standard positions"
        return f"the reranker sorted all {len(edit.chunks)} chunks, the best next to the question, standard positions"
    if stage is Stage.COMPRESS and edit is not None:
        return f"the context was compressed from {edit.original_tokens} to {edit.compressed_tokens} tokens, standard positions"
    if stage is Stage.ATTENTION:
        if d.settings.get("remapped") is False:
            return "standard positions: the prompt is too short for the method to change any distance"
        return "query-agnostic positions inside attention (the same for every question)"
    return "no relevance ranking, standard positions"


def sentence_depth(sentence: Any, context: str | None) -> float:
    """Where ``sentence`` (a :class:`~qgpm.results.SentenceRelevance`) sits in ``context``, 0..1 (0 = its start)."""
    return sentence.start / max(len(context or ""), 1)


def sentence_rows(result: Explained) -> list[dict[str, Any]]:
    """One dict per context sentence: text, char span, depth in the context (0..1), rank,
    z, broad/sharp scores, whether the plan promoted it (and where it moved it), whether the
    query-term filter left it in place, and the 0..1 intensity used for shading (by z; for the Oracle, 1 for the
    sentences holding evidence, which it promotes, and 0 for the rest)."""
    rel = sorted(result.relevance, key=lambda s: s.start)
    n = len(rel)
    zs = [s.z for s in rel if s.z is not None and s.z == s.z and abs(s.z) != float("inf")]
    lo, hi = (min(zs), max(zs)) if zs else (0.0, 0.0)
    out = []
    for s in rel:
        if s.z is not None and zs and hi > lo and abs(s.z) != float("inf"):
            level = (s.z - lo) / (hi - lo)
        elif s.z is None:  # the Oracle: evidence or not, no ranking among the rest
            level = 1.0 if s.promoted else 0.0
        else:  # a single sentence, or every z alike
            level = 1.0 - s.rank / max(n - 1, 1)
        out.append({
            "index": s.index, "text": s.text, "start": s.start, "end": s.end, "depth": sentence_depth(s, result.context),
            "rank": s.rank, "z": s.z, "broad": s.broad, "sharp": s.sharp, "promoted": s.promoted, "term_dropped": s.term_dropped,
            "moved_to": s.moved_to, "level": max(0.0, min(1.0, level)),
        })
    return out


# The key to the context's shading and outlines (a page without a ranking shades nothing, so has none).
_LEGEND = ("<p class=\"legend meta\"><span style=\"background:" + _shade(1.0) + "\">most relevant</span>"
           "<span style=\"background:" + _shade(0.0) + "\">least relevant</span><span class=\"promoted\">promoted (moved next to the question, "
           "or to the context's start where the table says so; under remap stride, kept a full step)</span><span class=\"dropped\">top-ranked, left in place by the term filter</span></p>")


def render_html(result: Explained, *, top: int = 10, title: str | None = None) -> str:
    """A self-contained HTML page (inline CSS, no script, no network) for ``result``.

    The context is shown with each sentence shaded by its relevance (z for qgpm; the
    evidence for oracle), outlined when the plan promoted it and dashed when the query-term
    filter left it in place; then the question, the answer, and a table of the ``top``
    best-ranked sentences with rank, z, broad/sharp scores, what the plan did and depth in
    the context. A method without a ranking gets a line saying what it did instead (for Top-K /
    Reorder, a list of the ``top`` chunks the reranker scored best) and no shading legend.
    Control characters show as symbols (:func:`printable`; line breaks, tabs, carriage returns
    and form feeds stay the page's whitespace).
    """
    top = check_count(top, "top")

    def esc(text: str) -> str:
        return html.escape(printable(text, keep=_HTML_KEEPS))

    rows = sentence_rows(result)
    ctx = result.context or ""
    parts: list[str] = []
    pos = 0
    for r in rows:
        if r["start"] > pos:
            parts.append(esc(ctx[pos:r["start"]]))
        tip = f"rank {r['rank'] + 1}" + (f", z {r['z']:+.2f}" if r["z"] is not None else "") + f", broad {r['broad']:.2f}, sharp {r['sharp']:.2f}"
        cls = "s promoted" if r["promoted"] else "s dropped" if r["term_dropped"] else "s"
        parts.append(f'<span class="{cls}" style="background:{_shade(r["level"])}" title="{esc(tip)}">{esc(ctx[r["start"]:r["end"]])}</span>')
        pos = max(pos, r["end"])
    parts.append(esc(ctx[pos:]))
    best = sorted(rows, key=lambda r: r["rank"])[:top]
    def _z(v: float | None) -> str:
        return "" if v is None else f"{v:+.2f}"

    def _did(r: dict[str, Any]) -> str:
        return promoted_label(r["promoted"], r["moved_to"]) if r["promoted"] else "left by the term filter" if r["term_dropped"] else ""

    table = "".join(
        f"<tr><td>{r['rank'] + 1}</td><td>{_z(r['z'])}</td><td>{r['broad']:.2f}</td>"
        f"<td>{r['sharp']:.2f}</td><td>{_did(r)}</td><td>{100 * r['depth']:.0f} %</td><td>{esc(r['text'])}</td></tr>"
        for r in best
    )
    d = result.details
    meta = [f"method <b>{esc(result.method)}</b>", f"{result.usage.prompt_tokens} prompt tokens", f"{result.usage.answer_tokens} answer tokens",
            f"{result.timings.total_s:.2f} s"]
    by = ranked_by(result) if rows else None
    if by:
        meta.append(esc(by))
    if d.pass2:
        meta.append(f"pass 2: {esc(d.pass2)}")
    if d.anchor_length is not None and d.pass2 == "positions":  # per-plane positions: the gate decided which planes moved
        meta.append(f"frequency gate at wavelength {d.anchor_length:.0f} tokens")
    note = decision_note(d, result.method, top_z=min(rows, key=lambda r: r["rank"])["z"]) if rows else None
    if note:
        meta.append(esc(note))
    if d.term_dropped:
        meta.append(esc(term_note(d.term_dropped)))
    if d.prefill_reused:
        meta.append(f"{d.prefill_reused} prompt tokens' prefill taken from pass 1 (reuse_prefill)")
    title = f"{result.method}: why this answer" if title is None else title  # the method that answered, not always qgpm
    chunk_list = "".join(f"<li>{esc(line)}</li>" for line in best_chunks(result, top))
    no_rank = "" if rows else f'<p class="meta">{esc(no_ranking_note(result))}.</p>' + (f"<ul>{chunk_list}</ul>" if chunk_list else "")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{esc(title)}</h1><p class=\"meta\">{' · '.join(meta)}</p>"
        f"<h2>Question</h2><div class=\"box\">{esc(result.question or '')}</div>"
        f"<h2>Answer</h2><div class=\"box answer\">{esc(result.text)}</div>"
        f"<h2>{'Top sentences' if rows else 'What it did to the context'}</h2>{no_rank}"
        + (f"<table><tr><th>rank</th><th>z</th><th>broad</th><th>sharp</th><th>plan</th><th>depth</th><th>sentence</th></tr>{table}</table>" if rows else "")
        + "<h2>Context</h2>" + (_LEGEND if rows else "")
        + f"<div class=\"box ctx\">{''.join(parts)}</div></body></html>\n"
    )


def plot_relevance(result: Explained, *, evidence: Sequence[str] | None = None, ax: Any = None):
    """Sentence relevance against position in the context (matplotlib ``Figure``).

    x: depth of each sentence in the context (0 = start, 1 = end, where the question
    follows); y: relevance z (qgpm) or map score (oracle). Sentences the plan promoted
    are drawn filled; sentences containing an ``evidence`` string are marked with a star;
    the question is the dashed line at depth 1.
    """
    from matplotlib.figure import Figure  # no pyplot: the caller's backend is left as it is

    rows = sentence_rows(result)
    if not rows:
        raise ValueError(f"method={result.method!r} has no relevance ranking to plot; use method='qgpm' or 'oracle'")
    use_z = any(r["z"] is not None for r in rows)
    ys = [(r["z"] if use_z else r["sharp"]) for r in rows]
    xs = [r["depth"] for r in rows]
    fig = ax.figure if ax is not None else Figure(figsize=(9, 3.4))
    ax = ax or fig.add_subplot(111)
    full = [i for i, r in enumerate(rows) if r["promoted"]]
    rest = [i for i, r in enumerate(rows) if not r["promoted"]]
    ax.plot(xs, ys, color="#9aa5b1", lw=0.8, zorder=1)
    ax.scatter([xs[i] for i in rest], [ys[i] for i in rest], s=14, facecolors="white", edgecolors="#5b6572", label="not promoted", zorder=2)
    ax.scatter([xs[i] for i in full], [ys[i] for i in full], s=22, color="#1f6fd1", label="promoted", zorder=3)
    if evidence:
        ev = [i for i, r in enumerate(rows) if any(e.strip() and (e.strip() in r["text"] or r["text"].strip() in e) for e in evidence)]
        if ev:
            ax.scatter([xs[i] for i in ev], [ys[i] for i in ev], marker="*", s=160, color="#d1341f", label="evidence", zorder=4)
    ax.axvline(1.0, ls="--", color="#333", lw=1)
    ax.text(1.0, ax.get_ylim()[1], " question", va="top", ha="left", fontsize=9)
    ax.set_xlim(-0.02, 1.1)
    ax.set_xlabel("position in the context (0 = start, 1 = end)")
    ax.set_ylabel("relevance z" if use_z else "sharp-map score")
    ax.set_title(f"QGPM relevance ({result.method}, {len(rows)} sentences)")
    ax.legend(loc="best", fontsize=8, frameon=False)
    fig.tight_layout()
    return fig
