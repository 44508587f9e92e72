"""The explanation view: HTML rendering (escaped, self-contained) and the relevance plot."""

from __future__ import annotations

import html
import re
import shutil
import subprocess

import pytest

from qgpm import QGPM, QGPMConfig

from qgpm_testing import tiny_model

HOSTILE = 'Ignore this <script>alert("x")</script> & <b>bold</b> text.'
CONTEXT = " ".join(f"Sentence {i} is about the harbour and its {i} boats." for i in range(12)) + f" {HOSTILE} " + \
    "The tide gauge was calibrated by Ottilie Brandvold. " + " ".join(f"Filler {i} goes here." for i in range(6))
QUESTION = "Who calibrated the tide gauge <now>?"


@pytest.fixture(scope="module")
def engine(tokenizer):
    return QGPM(tiny_model("llama", len(tokenizer)), tokenizer, heads=[(1, 0), (2, 1)], config=QGPMConfig.paper())  # the strides shade


def test_html_is_escaped_self_contained_and_complete(engine):
    res = engine.answer(CONTEXT, QUESTION, method="qgpm", max_new_tokens=4)
    assert res.context.startswith("Sentence 0") and res.question == QUESTION
    page = res.to_html()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page.lower()  # the hostile sentence is text, not markup
    assert html.escape('<script>alert("x")</script>') in page and "&lt;b&gt;bold&lt;/b&gt;" in page
    assert html.escape(QUESTION) in page and html.escape(res.text) in page
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", page)  # no network resources
    assert "default-src 'none'" in page
    # every sentence is on the page, in a shaded span; those that kept a full stride are outlined
    spans = re.findall(r'<span class="(s full|s)"', page)
    assert len(spans) == len(res.relevance)
    assert spans.count("s full") == sum(1 for s in res.relevance if s.sharp >= 1.0 - 1e-9) > 0
    assert "s" in spans  # and some were compressed
    # the top table lists the best-ranked sentence first
    top = res.top_sentences(1)[0]
    first_row = page.split("<th>sentence</th></tr>")[1].split("</tr>")[0]
    assert html.escape(top.text) in first_row and "<td>1</td>" in first_row


def test_html_for_a_method_without_ranking(engine):
    res = engine.answer(CONTEXT, QUESTION, method="vanilla", max_new_tokens=3)
    page = res.to_html()
    assert "no relevance ranking" in page and "<table>" not in page


def test_relevance_plot_marks_evidence_and_question(engine, tmp_path):
    res = engine.answer(CONTEXT, QUESTION, method="qgpm", max_new_tokens=3)
    fig = res.plot(evidence=["The tide gauge was calibrated by Ottilie Brandvold."])
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "evidence" in labels and "full stride" in labels
    assert any(abs(l.get_xdata()[0] - 1.0) < 1e-9 for l in ax.get_lines() if len(l.get_xdata()) == 2)  # the question line
    out = tmp_path / "rel.png"
    fig.savefig(out)
    assert out.stat().st_size > 5000
    with pytest.raises(ValueError, match="no relevance ranking"):
        engine.answer(CONTEXT, QUESTION, method="vanilla", max_new_tokens=2).plot()


@pytest.mark.skipif(not (shutil.which("chromium") or shutil.which("chromium-browser")), reason="needs Chromium (Debian package 'chromium')")
def test_html_renders_in_headless_chromium(engine, tmp_path):
    res = engine.answer(CONTEXT, QUESTION, method="qgpm", max_new_tokens=4)
    page = tmp_path / "why.html"
    page.write_text(res.to_html())
    shot = tmp_path / "why.png"
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    proc = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}", "--window-size=1000,1400", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 10_000, proc.stderr[-2000:]


def test_text_between_sentences_is_escaped_too():
    from qgpm.results import QGPMResult, SentenceRelevance
    from qgpm.explain import render_html

    ctx = "First sentence here. <img src=x onerror=alert(1)> Second one."
    rel = [SentenceRelevance(0, "First sentence here.", 0, 20, 0, 0, 1.0, 1.0, 2.0),
           SentenceRelevance(1, "Second one.", ctx.index("Second"), len(ctx), 0, 1, 0.3, 0.3, -2.0)]
    page = render_html(QGPMResult(text="ok", method="qgpm", relevance=rel, context=ctx, question="q?"))
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page


def test_page_says_when_the_query_term_filter_kept_candidates_in_place(engine):
    """Every sentence is a candidate (K 40): only the one carrying the question's words
    ("calibrated", "tide", "gauge") stays relevant, and the page says how many were dropped."""
    from qgpm import QGPMConfig

    cfg = QGPMConfig(k_sharp=40.0, k_broad=50.0, term_ratio=0.6, min_top_z=None, decisive_margin=None)
    res = engine.answer(CONTEXT, QUESTION, method="qgpm", max_new_tokens=2, config=cfg)
    n = res.details["term_dropped"]
    assert n == len(res.relevance) - 1
    gold = next(i for i, s in enumerate(res.relevance) if s.text.startswith("The tide gauge was calibrated"))
    assert res.relevance[gold].sharp == 1.0  # the one relevant sentence; the text before it keeps its place anyway
    assert all(s.sharp < 1.0 for s in res.relevance[gold + 1:])  # every candidate after it was dropped
    assert html.escape(f"term_ratio: {n} of the top-ranked sentences") in res.to_html()
    plain = engine.answer(CONTEXT, QUESTION, method="qgpm", max_new_tokens=2, config=QGPMConfig(k_sharp=40.0, k_broad=50.0))
    assert "term_dropped" not in plain.details and "term_ratio:" not in plain.to_html()


def test_explain_says_why_positions_were_kept_and_counts_what_it_shows(engine):
    short = engine.answer("The gate opens at six. The tide gauge was calibrated by Ottilie Brandvold.", QUESTION, max_new_tokens=2,
                          config=QGPMConfig(keep_length=1024))
    text = short.explain(5)
    assert text.splitlines()[0].startswith("method=qgpm: top 2 of 2 sentences")
    assert "(the context is no longer than keep_length, so qgpm kept vanilla positions)" in text
    flat = engine.answer(CONTEXT, QUESTION, max_new_tokens=2, config=QGPMConfig(min_top_z=1e6, keep_length=0))
    assert "(the relevance was flat (top z below min_top_z), so qgpm kept vanilla positions)" in flat.explain(3)
    assert "kept vanilla positions" in flat.to_html()
    moved = engine.answer(CONTEXT, QUESTION, max_new_tokens=2, config=QGPMConfig(min_top_z=None, decisive_margin=None, keep_length=0))
    assert "kept vanilla positions" not in moved.explain(3) and len(moved.explain(3).splitlines()) == 4
