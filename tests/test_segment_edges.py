"""The sentence splitter's rules at their edges (qgpm/segment.py), each expectation read from
the module docstring (Rules) and the functions' docstrings: closers after a terminator,
abbreviations and initials, line breaks and cut whitespace leading the next unit, cuts of
at most ``max_chars`` that keep a letter with its marks, document spans, and token
assignment outside every sentence. Pure text: no tokenizer, no model."""

from __future__ import annotations

import pytest

from qgpm.segment import Sentence, assign_tokens_to_sentences, has_visible_text, split_documents, split_sentences


def _texts(text: str, **kw) -> list[str]:
    return [s.text for s in split_sentences(text, **kw)]


def _tiles(sents, text: str) -> None:
    assert sents[0].start == 0 and sents[-1].end == len(text)
    for a, b in zip(sents, sents[1:]):
        assert a.end == b.start


def test_closing_quotes_and_brackets_after_a_terminator_end_with_the_sentence():
    text = 'He said "Stop." She left. (It rained.) Then it was \u201cover!\u201d Done.'
    assert _texts(text) == ['He said "Stop."', "She left.", "(It rained.)", "Then it was \u201cover!\u201d", "Done."]


def test_abbreviations_and_initials_do_not_end_a_sentence():
    text = ("Dr. Smith met Prof. Jones at St. Mary's church. They talked, e.g. about dates, i.e. nothing. "
            "J. K. Rowling wrote it. The U.S.A. is big. Approx. ten people came.")
    assert _texts(text) == [
        "Dr. Smith met Prof. Jones at St. Mary's church.",
        "They talked, e.g. about dates, i.e. nothing.",
        "J. K. Rowling wrote it.",
        "The U.S.A. is big.",
        "Approx. ten people came.",
    ]


def test_a_line_break_leads_the_next_unit():
    """The whitespace between two units belongs to the next one: a line break too."""
    text = "Line one\nLine two\n\nLine three"
    sents = split_sentences(text)
    assert [(s.start, s.end) for s in sents] == [(0, 8), (8, 17), (17, len(text))]
    assert [text[s.start] for s in sents[1:]] == ["\n", "\n"]


@pytest.mark.parametrize("gap, max_chars", [(" ", 40), ("\t", 42)])
def test_a_cut_at_whitespace_leaves_it_to_the_next_piece(gap, max_chars):
    """A long unit without sentence ends is cut at a space or a tab, which opens the next piece."""
    words = gap.join(["word"] * 30)
    sents = split_sentences(words, max_chars=max_chars)
    _tiles(sents, words)
    assert len(sents) > 1
    for s in sents:
        assert s.end - s.start <= max_chars and set(s.text.split(gap)) == {"word"}
    assert all(words[s.start] == gap for s in sents[1:])


def test_trailing_whitespace_joins_the_last_sentence():
    text = "One here. Two there.  \n \n"
    sents = split_sentences(text, offset=7)
    assert [s.text for s in sents] == ["One here.", "Two there."]
    assert sents[0].start == 7 and sents[0].end == sents[1].start and sents[-1].end == 7 + len(text)


@pytest.mark.parametrize("unit", ["x" * 40, " ".join(["abcd"] * 8) + "!"])
def test_a_unit_of_exactly_max_chars_is_not_cut(unit):
    assert len(unit) == 40
    assert _texts(unit, max_chars=40) == [unit]
    assert len(split_sentences(unit + "y", max_chars=40)) == 2


def test_max_chars_below_twenty_is_refused():
    with pytest.raises(ValueError, match="max_chars must be at least 20, got 19"):
        split_sentences("One. Two.", max_chars=19)
    with pytest.raises(ValueError, match="max_chars must be at least 20"):
        split_documents(["One. Two."], max_chars=5)
    assert _texts("One. Two.", max_chars=20) == ["One.", "Two."]


def test_a_hard_cut_keeps_a_devanagari_vowel_sign_with_its_letter():
    """Spacing vowel signs (category Mc) belong to the letter before them, like accents."""
    text = "a" + "\u0915\u093f" * 40  # KA + vowel sign I, no spaces
    sents = split_sentences(text, max_chars=21)
    _tiles(sents, text)
    assert len(sents) > 2
    assert all(text[s.start] != "\u093f" for s in sents)


def test_half_width_ideographic_full_stop_ends_a_sentence():
    text = "これはペンです｡あれは本です｡"
    assert _texts(text) == ["これはペンです｡", "あれは本です｡"]


def test_a_zero_width_space_alone_shows_nothing():
    assert not has_visible_text("\u200b")
    assert not has_visible_text(" \u200b\n")
    assert split_sentences("\u200b\u200b") == []
    assert has_visible_text("\u200bx")


def test_document_spans_are_the_documents_as_given():
    docs = ["Alpha one.  ", "", "  Beta two.\n", "Gamma."]
    text, sents, spans = split_documents(docs, separator="\n--\n")
    assert [text[a:b] for a, b in spans] == docs
    assert [s.doc for s in sents] == [0, 2, 3]


def test_trailing_empty_documents_join_the_last_sentence():
    docs = ["A one.", "", "B two.", ""]
    text, sents, spans = split_documents(docs)
    assert text == "A one.\n\n\n\nB two.\n\n"
    _tiles(sents, text)
    assert [s.text for s in sents] == ["A one.", "B two."]
    assert spans[-1] == (len(text), len(text))


def test_tokens_outside_every_sentence_get_minus_one():
    sents = [Sentence(index=0, start=5, end=10, text="a"), Sentence(index=1, start=10, end=20, text="b")]
    starts = [0, 4, 5, 9, 10, 19, 20, 25]
    assert assign_tokens_to_sentences(starts, sents) == [-1, -1, 0, 0, 1, 1, -1, -1]
