"""The explanation view: HTML rendering (escaped, self-contained) and the relevance plot."""

from __future__ import annotations

import html
import re
import shutil
import subprocess

import pytest
import torch

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
    # every sentence is on the page, in a shaded span; those the plan promoted are outlined
    spans = re.findall(r'<span class="(s promoted|s dropped|s)"', page)
    assert len(spans) == len(res.relevance)
    assert spans.count("s promoted") == sum(s.promoted for s in res.relevance) == res.details.promoted > 0
    assert "s" in spans  # and some were not
    # the top table lists the best-ranked sentence first
    top = res.top_sentences(1)[0]
    first_row = page.split("<th>sentence</th></tr>")[1].split("</tr>")[0]
    assert html.escape(top.text) in first_row and "<td>1</td>" in first_row


def test_html_for_a_method_without_ranking(engine):
    res = engine.answer(CONTEXT, QUESTION, method="vanilla", max_new_tokens=3)
    page = res.to_html()
    assert "no relevance ranking, standard positions" in page and "<table>" not in page
    assert "most relevant" not in page and "most relevant" in engine.answer(CONTEXT, QUESTION, max_new_tokens=2).to_html()  # no legend to unshaded text
    ranked = engine.answer(CONTEXT, QUESTION, max_new_tokens=2).to_html()
    assert "<title>vanilla: why this answer</title>" in page and "<h2>What it did to the context</h2>" in page  # the method that answered
    assert "<title>qgpm: why this answer</title>" in ranked and "<h2>Top sentences</h2>" in ranked and "Top sentences" not in page


def test_relevance_plot_marks_evidence_and_question(engine, tmp_path):
    res = engine.answer(CONTEXT, QUESTION, method="qgpm", max_new_tokens=3)
    fig = res.plot(evidence=["The tide gauge was calibrated by Ottilie Brandvold."])
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "evidence" in labels and "promoted" in labels
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
    top_z = flat.top_sentences(1)[0].z
    assert f"(the relevance was flat (the top z, {top_z:+.2f}, is below min_top_z 1e+06), so qgpm kept vanilla positions)" in flat.explain(3)
    assert "kept vanilla positions" in flat.to_html()
    tied = engine.answer("Alice lives in Paris. Bob works at the bank. Carol plays the violin.", "What is it?", max_new_tokens=2,
                         config=QGPMConfig(relevance="bm25", min_top_z=None, keep_length=0))
    assert "(the relevance ranked no sentence above another (every score the same), so qgpm kept vanilla positions)" in tied.explain(3)
    moved = engine.answer(CONTEXT, QUESTION, max_new_tokens=2, config=QGPMConfig(min_top_z=None, decisive_margin=None, keep_length=0))
    assert "kept vanilla positions" not in moved.explain(3) and len(moved.explain(3).splitlines()) == 4


def test_the_page_marks_the_sentences_the_plan_moved_under_reorder(engine):
    """Under remap="reorder" (the recipe's placement) a promoted sentence is one the plan moved
    next to the question: exactly the units of its slot order that come after the context's
    other sentences. The text before the first relevant sentence scores 1 but stays in place
    and is not marked."""
    cfg = QGPMConfig.paper().with_(remap="reorder", split_layer=0, min_top_z=None, decisive_margin=None, keep_length=0)
    call = engine.prepare(CONTEXT, QUESTION, config=cfg)
    promoted = sorted(s.index for s in call.relevance if s.promoted)
    assert promoted and call.details.promoted == len(promoted) and call.details.kept_reason is None
    # the moved sentences' tokens take the last context slots, in the plan's slot order
    order = call.plan.orders[0]
    ts = call.prompt.token_sentence
    ctx = (ts >= 0).nonzero().reshape(-1)
    slots = order[ctx]
    last = ctx[slots.argsort()][-int(sum((ts == i).sum() for i in promoted)):]
    assert sorted(set(ts[last].tolist())) == promoted
    in_place = [s for s in call.relevance if s.sharp == 1.0 and not s.promoted]
    assert in_place  # the protected prefix: score 1, not moved
    res = engine.answer(CONTEXT, QUESTION, max_new_tokens=2, config=cfg)
    assert sorted(s.index for s in res.relevance if s.promoted) == promoted
    assert res.to_html().count('class="s promoted"') == len(promoted)
    assert min(res.relevance, key=lambda s: s.rank).promoted


def test_a_call_that_promotes_nothing_says_so_and_why(engine):
    """The notes follow the plan, not the rule flags: the solo rule with the query-term filter
    dropping the top sentence promotes nothing; a short context is not term-filtered."""
    from qgpm.diagnostics import Diagnostics
    from qgpm.explain import decision_note
    from qgpm.plan import KEPT_REASONS, build_plan
    from qgpm.rope import RotaryInfo

    inv = 1.0 / (1e4 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16))
    units = torch.arange(5).repeat_interleave(4)
    cfg = QGPMConfig(remap="reorder", split_layer=0, solo_margin=1.0, term_ratio=0.6, keep_length=0)
    z, lexical = torch.tensor([3.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64), torch.tensor([0.0, 5.0, 5.0, 5.0, 5.0], dtype=torch.float64)
    solo = build_plan(units, z, config=cfg, rotary=RotaryInfo(inv, 1.0, "default", 16), n_layers=4, unit_lexical=lexical)
    assert solo.solo and solo.term_dropped == (0,) and solo.promoted == () and solo.kept_reason == "nothing_promoted"
    kept = build_plan(units, z, config=cfg, rotary=RotaryInfo(inv, 1.0, "default", 16), n_layers=4, unit_lexical=torch.ones(5, dtype=torch.float64))
    assert kept.promoted == (0,) and kept.kept_reason is None  # the filter keeps it: promoted alone
    # the filter is credited only with candidates the solo rule left: here none but the top, which it keeps
    ranked, words = torch.tensor([3.0, 0.4, 0.3, 0.2, 0.1], dtype=torch.float64), torch.tensor([5.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    alone = build_plan(units, ranked, config=cfg, rotary=RotaryInfo(inv, 1.0, "default", 16), n_layers=4, unit_lexical=words)
    assert alone.solo and alone.promoted == (0,) and alone.term_dropped == ()
    every = build_plan(units, ranked, config=cfg.with_(solo_margin=None), rotary=RotaryInfo(inv, 1.0, "default", 16), n_layers=4,
                       unit_lexical=words)
    assert not every.solo and every.promoted == (0,) and len(every.term_dropped) >= 1
    note = decision_note(Diagnostics(solo_relevance=True, kept_reason="nothing_promoted"), "qgpm")
    assert "no sentence was left to promote" in note and "promoted it alone" not in note
    assert "promoted it alone" in decision_note(Diagnostics(solo_relevance=True), "qgpm")
    short = engine.answer("The gate opens at six. The tide gauge was calibrated by Ottilie Brandvold.", QUESTION, max_new_tokens=2,
                          config=QGPMConfig(keep_length=1024, term_ratio=0.6))
    assert short.details.kept_reason == "keep_length" and short.details.term_dropped == 0 and short.details.promoted == 0
    assert "term_ratio:" not in short.explain(3) and not any(s.promoted or s.term_dropped for s in short.relevance)
    floor = engine.answer(CONTEXT, QUESTION, max_new_tokens=2, config=QGPMConfig(keep_length=0, s_low=1.0, min_top_z=None,
                                                                                   decisive_margin=None))
    assert floor.details.kept_reason == "s_low" and "s_low is 1" in floor.explain(3) and "keep_length" not in floor.explain(3)
    assert set(KEPT_REASONS) == {"flat", "decisive", "keep_length", "s_low", "nothing_promoted"}


def test_methods_without_a_ranking_say_what_they_did(engine):
    from qgpm import StringOptions
    from qgpm.explain import clip

    topk = engine.answer(CONTEXT, QUESTION, method="topk", reranker="bm25", k=1, max_new_tokens=2)
    assert f"chunks {topk.edit.kept} of {len(topk.edit.chunks)} are in the prompt" in topk.explain()
    assert html.escape(f"chunks {topk.edit.kept} of {len(topk.edit.chunks)}") in topk.to_html()
    (kept,) = topk.edit.kept  # the kept chunk, named with its score and text
    assert topk.explain().splitlines()[1] == f"  chunk {kept} (score {topk.edit.scores[kept]:.2f}): {clip(topk.edit.chunks[kept].text, 100)}"
    docs = [f"Paragraph {i} tells of the harbour's {i} boats." for i in range(6)] + ["The tide gauge was calibrated by Ottilie Brandvold."]
    reorder = engine.answer(docs, QUESTION, method="reorder", reranker="bm25", max_new_tokens=2)
    lines = reorder.explain(2).splitlines()
    assert lines[0] == "method=reorder: the reranker sorted all 7 chunks, the best next to the question, standard positions"
    best = sorted(range(7), key=lambda i: (-reorder.edit.scores[i], i))[:2]
    assert best[0] == 6 and len(lines) == 3 and [line.split(" (")[0] for line in lines[1:]] == [f"  chunk {i}" for i in best]
    assert reorder.to_html(top=2).count("<li>chunk ") == 2 and reorder.explain(0) == lines[0]
    lined = engine.answer(["Report header\n\nThe tide gauge was calibrated\nby Ottilie Brandvold.", "Other\nnotes."], QUESTION,
                          method="reorder", reranker="bm25", max_new_tokens=2)
    assert len(lined.explain(2).splitlines()) == 3  # one line per chunk, its line breaks folded
    poe = engine.answer(CONTEXT, QUESTION, method="ms-poe", max_new_tokens=2)
    assert "query-agnostic positions inside attention" in poe.explain() and "query-agnostic" in poe.to_html()
    short = engine.answer("The gate opens at six.", QUESTION, method="string", options=StringOptions(shift=None), max_new_tokens=2)
    assert short.details.settings.get("remapped") is False and "standard positions: the prompt is too short" in short.explain()
    assert clip("x" * 200, 120).endswith("…") and len(clip("x" * 200, 120)) == 120 and clip("short", 120) == "short"
    words = " ".join(f"word{i:02d}" for i in range(40))
    assert clip(words, 60, tail=20) == "word00 word01 word02 word03 word04 ... word37 word38 word39"  # cut between words: as it is
    assert clip(words, 63, tail=22) == "word00 word01 word02 word03 word04 ... word37 word38 word39"  # both cuts mid-word: moved to a space
    assert clip(words, 17) == "word00 word01…" and clip("abcdefghijklmn", 10, tail=20) == "abcdefghi…"  # no room for the tail


def test_control_characters_from_the_context_reach_no_terminal(engine, capsys):
    """An escape sequence in a document (or an answer) is shown as its symbols in explain(),
    the page and qgpm ask's lines, one character for one, so offsets and clipping still hold."""
    from qgpm import ask_output
    from qgpm.explain import clip, printable

    hostile = "The vault code is 7731 \x1b[31mRED\x1b[0m\r and more. "
    res = engine.answer(hostile * 3 + CONTEXT, QUESTION, max_new_tokens=3, config=QGPMConfig.paper().with_(keep_length=0))
    assert "\x1b" in res.context and "\x1b[31m" in "".join(s.text for s in res.relevance)
    text = res.explain(len(res.relevance))
    assert "\x1b" not in text and "\r" not in text and "␛[31mRED␛[0m" in text
    page = res.to_html()
    assert "\x1b" not in page and "␛[31mRED␛[0m\r" in page  # a carriage return is the page's whitespace, not a symbol
    ask_output.print_why("qgpm", res, top=len(res.relevance))
    res.text = "answer \x1b]0;title\x07 end"
    ask_output.print_answer("qgpm", res, width=4)
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "␛[31mRED" in out and "␛]0;title␇ end" in out
    assert printable("tab\tand\nline ÿ é") == "tab\tand\nline ÿ é" and printable("\x85\x7f\r") == "\ufffd␡␍"
    assert clip("\x1b" * 5, 3) == "␛␛…" and clip("two\r\nlines\x0c here", 40) == "two lines here"


def test_a_bidirectional_override_in_the_context_reorders_nothing_shown(engine):
    """A right-to-left override (or embedding / isolate) in a document is shown as a symbol in
    explain() and on the page, so it cannot reorder the text after it; the marks stay."""
    from qgpm.explain import printable

    hostile = "The vault code is \u202e1377\u202c and the \u2067note\u2069 says so. "
    res = engine.answer(hostile * 3 + CONTEXT, QUESTION, max_new_tokens=3, config=QGPMConfig.paper().with_(keep_length=0))
    for shown in (res.explain(len(res.relevance)), res.to_html()):
        assert not any(c in shown for c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
        assert "\ufffd1377\ufffd" in shown
    assert printable("שלום\u200f abc \u200e") == "שלום\u200f abc \u200e"


def test_the_count_of_top_sentences_is_checked(engine):
    res = engine.answer(CONTEXT, QUESTION, max_new_tokens=2, config=QGPMConfig.paper().with_(keep_length=0))
    for bad in (-1, -3):
        for call in (lambda: res.top_sentences(bad), lambda: res.explain(bad), lambda: res.to_html(top=bad)):
            with pytest.raises(ValueError, match="must be >= 0"):
                call()
    for bad in (True, 2.0, "3"):
        with pytest.raises(TypeError, match="must be an int >= 0"):
            res.explain(bad)
    import numpy as np

    assert res.top_sentences(np.int64(2)) == res.top_sentences(2) and "<td>2</td>" in res.to_html(top=np.int64(2))
    assert res.top_sentences(0) == [] and res.explain(0).splitlines()[0].startswith(f"method=qgpm: top 0 of {len(res.relevance)} sentences")
    assert len(res.explain(0).splitlines()) == 1 + bool(res.details.kept_reason)


def test_the_oracle_says_its_ranking_is_the_evidence_and_the_rest_is_context_order(engine, capsys):
    from qgpm import ask_output

    gold = "The tide gauge was calibrated by Ottilie Brandvold."
    res = engine.answer(CONTEXT, QUESTION, method="oracle", evidence=[gold], max_new_tokens=2, config=QGPMConfig.paper().with_(keep_length=0))
    top = res.top_sentences(len(res.relevance))
    assert top[0].text == gold and [s.index for s in top[1:]] == sorted(s.index for s in top[1:])  # context order after the evidence
    said = ("ranked by the given evidence: the sentences holding it first, the others in context order; only the evidence text "
            "moves, the rest of its sentence keeps its place")
    assert said in res.explain(3).splitlines()[0] and html.escape(said) in res.to_html()
    ask_output.print_why("oracle", res, top=3)
    heads = engine.answer(CONTEXT, QUESTION, max_new_tokens=2, config=QGPMConfig.paper().with_(keep_length=0))
    assert "ranked by the model's heads" in heads.explain(3)
    ask_output.print_why("qgpm", heads, top=3)
    out = capsys.readouterr().out.splitlines()
    oracle_head, qgpm_head = [line for line in out if " ranked (top " in line]
    assert said in oracle_head and "ranked by" not in qgpm_head  # qgpm ask leaves the default source, the heads, unsaid
    assert out.count("  settings: the paper's settings (App. C): remap stride, two maps") == 2  # which config planned the call


def test_placement_ends_says_which_sentences_went_to_the_start(engine, capsys):
    """Under placement="ends" every second moved sentence opens the context: those are marked
    moved_to="start" (and "promoted to the start" on the page), exactly the units whose slots
    come first; the others moved_to="question"."""
    cfg = QGPMConfig.paper().with_(remap="reorder", split_layer=0, placement="ends", min_top_z=None, decisive_margin=None,
                                   keep_length=0)
    call = engine.prepare(CONTEXT, QUESTION, config=cfg)
    promoted = [s for s in call.relevance if s.promoted]
    start = sorted(s.index for s in promoted if s.moved_to == "start")
    assert start and all(s.moved_to in ("start", "question") for s in promoted)
    assert all(s.moved_to is None for s in call.relevance if not s.promoted)
    ts = call.prompt.token_sentence
    ctx = (ts >= 0).nonzero().reshape(-1)
    first = ctx[call.plan.orders[0][ctx].argsort()][: int(sum((ts == i).sum() for i in start))]
    assert sorted(set(ts[first].tolist())) == start  # they hold the context's first slots
    res = engine.answer(CONTEXT, QUESTION, max_new_tokens=2, config=cfg)
    assert res.to_html().count("<td>promoted to the start</td>") == len([s for s in res.top_sentences(10) if s.moved_to == "start"])
    assert "promoted to the start" in res.explain(len(res.relevance))
    placed = engine.prepare(CONTEXT, QUESTION, config=cfg.with_(placement="question"))
    assert {s.moved_to for s in placed.relevance if s.promoted} == {"question"}
    stride = engine.prepare(CONTEXT, QUESTION, config=QGPMConfig.paper().with_(min_top_z=None, decisive_margin=None, keep_length=0))
    assert any(s.promoted for s in stride.relevance) and all(s.moved_to is None for s in stride.relevance)


def test_sentence_offsets_point_at_the_sentence_text(engine):
    docs = ["The gate opens at six.  The tide gauge was calibrated by Ottilie Brandvold.", "\n  Filler one.\n\nFiller two."]
    res = engine.answer(docs, QUESTION, max_new_tokens=2)
    assert len(res.relevance) >= 4
    assert all(res.context[s.start : s.end] == s.text for s in res.relevance)


def test_a_single_sentence_context_is_called_what_it_is(engine, caplog):
    with caplog.at_level("WARNING", logger="qgpm"):
        one = QGPM(engine.model, engine.tokenizer, heads=[(1, 0)], config=QGPMConfig(keep_length=0, min_top_z=2.5)).answer(
            "The tide gauge was calibrated by Ottilie Brandvold.", QUESTION, max_new_tokens=2)
    assert one.details.kept_reason == "flat" and one.details.tied_relevance is True
    assert "ranked no sentence above another" in one.explain(1) and "below min_top_z" not in one.explain(1)
    assert any("holds a single sentence" in r.getMessage() for r in caplog.records)


def test_a_changed_config_says_what_changed_in_its_provenance():
    base = QGPMConfig.paper()
    changed = base.with_(remap="reorder", split_layer=0, k_sharp=base.k_sharp)
    assert changed.provenance == f"{base.provenance}; then overridden: remap='reorder', split_layer=0"
    assert base.with_(k_sharp=base.k_sharp).provenance == base.provenance  # nothing changed, nothing said
    assert base.with_(remap="reorder", provenance="mine").provenance == "mine"


def test_explain_gives_each_sentence_its_depth_so_repeated_sentences_read_apart(engine):
    repeated = "The depot opens at six. " * 4 + CONTEXT
    res = engine.answer(repeated, QUESTION, max_new_tokens=2, config=QGPMConfig.paper().with_(keep_length=0))
    lines = res.explain(len(res.relevance)).splitlines()[1:1 + len(res.relevance)]
    for s, line in zip(res.top_sentences(len(res.relevance)), lines):
        assert f" depth={100 * s.start / len(res.context):.0f}%" in line
    depths = [line.split(" depth=")[1].split("%")[0] for line in lines if "The depot opens at six." in line]
    assert len(depths) == 4 and len(set(depths)) == 4  # the four copies, each at its own place
