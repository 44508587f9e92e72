"""The sentence splitter's run-on rule (``run_ons=True``, ``QGPMConfig.split_run_ons``):
text cut mid-sentence and joined to the next sentence splits where that sentence starts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qgpm import QGPM, QGPMConfig
from qgpm.segment import RUN_ON_OPENERS, split_documents, split_sentences
from qgpm_testing import tiny_model

GLUED = ("The essays were long. (The philosophy's there, but it's woven into the story "
         "One of the special magic numbers for jazzy-model is: 9834562.")


def _texts(text: str, **kw) -> list[str]:
    return [s.text for s in split_sentences(text, **kw)]


def _tiles(sents, text: str, offset: int = 0) -> None:
    assert sents[0].start == offset and sents[-1].end == offset + len(text)
    for a, b in zip(sents, sents[1:]):
        assert a.end == b.start


def test_a_needle_glued_to_a_cut_sentence_becomes_its_own_unit():
    assert _texts(GLUED) == ["The essays were long.", "(The philosophy's there, but it's woven into the story One of the special "
                                                      "magic numbers for jazzy-model is: 9834562."]
    cut = split_sentences(GLUED, run_ons=True)
    assert [s.text for s in cut] == ["The essays were long.", "(The philosophy's there, but it's woven into the story",
                                     "One of the special magic numbers for jazzy-model is: 9834562."]
    _tiles(cut, GLUED)
    # the space before the opener belongs to the new unit, as the space after a full stop does
    assert GLUED[cut[2].start] == " " and GLUED[cut[2].start + 1 :].startswith("One of")
    # a one-word fragment ("If") before the needle is split off too
    assert _texts("It rained. If One of the numbers is: 5.", run_ons=True) == ["It rained.", "If", "One of the numbers is: 5."]


@pytest.mark.parametrize("text", [
    "I think vitamin A is fine and I said so.",         # "I" and "A" are not openers
    "We asked NASA The question twice.",                # an opener after an upper-case word
    "They came, The others stayed.",                    # after punctuation: the rule needs a lowercase word
    "He met Oneida and Thebes and Iffy people.",        # an opener only as a whole word
    "the story\nOne more line.",                        # a line break already splits; nothing added
])
def test_what_the_rule_leaves_alone(text):
    assert _texts(text, run_ons=True) == _texts(text)


def test_titles_with_an_opener_are_split_too_as_documented():
    assert _texts("We met in The Hague.", run_ons=True) == ["We met in", "The Hague."]
    assert "The" in RUN_ON_OPENERS and "I" not in RUN_ON_OPENERS and "A" not in RUN_ON_OPENERS


def test_split_documents_passes_the_rule_on_and_never_crosses_documents():
    docs = ["A cut fragment of the story", "One more document here", "it is woven into the story One of them is: 7."]
    text, plain, _ = split_documents(docs)
    text2, cut, spans = split_documents(docs, run_ons=True)
    assert text == text2 and len(cut) == len(plain) + 1
    assert [s.text for s in cut][-2:] == ["it is woven into the story", "One of them is: 7."]
    assert [s.doc for s in cut] == [0, 1, 2, 2]
    _tiles(cut, text)


def test_bad_flag_is_refused():
    with pytest.raises(TypeError, match="run_ons must be a bool"):
        split_sentences("One. Two.", run_ons="yes")
    with pytest.raises(TypeError, match="split_run_ons must be a bool"):
        QGPMConfig(split_run_ons=1)


_WORD = st.sampled_from(["alpha", "beta", "One", "The", "If", "I", "A", "Dr.", "end.", "why?", "NASA", ",", "\n", "ok", "the"])


@settings(max_examples=80, deadline=None)
@given(words=st.lists(_WORD, min_size=1, max_size=40))
def test_property_the_rule_only_adds_boundaries(words):
    """With the rule the units still tile the text, every boundary of the plain split stays a
    boundary, and each new one sits before an opener that follows a lowercase letter."""
    text = " ".join(words)
    plain = split_sentences(text)
    cut = split_sentences(text, run_ons=True)
    if not plain:
        assert cut == []
        return
    _tiles(cut, text)
    starts = {s.start for s in cut}
    assert {s.start for s in plain} <= starts
    for b in starts - {s.start for s in plain}:
        rest = text[b:].lstrip(" ")
        assert text[b - 1].islower() and any(rest.startswith(o) and not rest[len(o):len(o) + 1].isalpha() for o in RUN_ON_OPENERS)


@pytest.fixture(scope="module")
def tiny(tokenizer):
    return QGPM(tiny_model("llama", len(tokenizer), max_position_embeddings=1024), tokenizer, heads=[(1, 0), (2, 1)])


def test_engine_units_follow_the_setting_and_replan_refuses_to_change_it(tiny):
    filler = " ".join(f"The stall number {w} sold fresh bread and cheese all day long." for w in ("one", "two", "three", "four", "five"))
    ctx = filler + " It was woven into the story One of the special magic numbers for jazzy-model is: 9834562."
    question = "What is the special magic number for jazzy-model?"
    cfg = tiny.config.with_(k_sharp=2.0, remap="reorder", split_layer=0, min_top_z=None, decisive_margin=None, split_run_ons=False)
    plain = tiny.prepare(ctx, question, method="qgpm", config=cfg)
    cut = tiny.prepare(ctx, question, method="qgpm", config=cfg.with_(split_run_ons=True))
    assert len(cut.prompt.sentences) == len(plain.prompt.sentences) + 1
    assert cut.prompt.sentences[-1].text == "One of the special magic numbers for jazzy-model is: 9834562."
    assert cut.prompt.sentences[-2].text == "It was woven into the story"
    assert torch.equal(cut.input_ids, plain.input_ids)  # the same tokens, other units
    assert len(cut.relevance) == len(cut.prompt.sentences)
    with pytest.raises(ValueError, match="split_run_ons change pass 1"):
        tiny.replan(plain, cfg.with_(split_run_ons=True))


def test_rows_made_before_the_setting_keep_their_hash():
    from qgpm.eval.hashes import config_dict

    assert "split_run_ons" not in config_dict(QGPMConfig())
    assert config_dict(QGPMConfig(split_run_ons=True))["split_run_ons"] is True


# ----------------------------------------------------------------------------- text beyond English prose


@pytest.mark.parametrize("text, want", [
    ("彼は「こんにちは。」と言った。", ["彼は「こんにちは。」", "と言った。"]),
    ("他说：“你好。”然后走了。", ["他说：“你好。”", "然后走了。"]),
    ("（注意。）次の文。", ["（注意。）", "次の文。"]),
    ("これはペンです．あれは本です．", ["これはペンです．", "あれは本です．"]),
    ("भारत एक देश है। दिल्ली राजधानी है।", ["भारत एक देश है।", "दिल्ली राजधानी है।"]),
])
def test_full_width_terminators_take_their_closing_quotes_and_brackets(text, want):
    sents = split_sentences(text)
    assert [s.text for s in sents] == want
    _tiles(sents, text)


def test_lines_of_invisible_characters_join_the_next_sentence():
    text = "Paris is the capital.\n\u200b\n\u200c\u200d\n\ufeff\nBerlin is big."
    sents = split_sentences(text)
    assert [s.text for s in sents] == ["Paris is the capital.", "\u200b\n\u200c\u200d\n\ufeff\nBerlin is big."]
    _tiles(sents, text)
    assert split_sentences("\u200b \ufeff\n") == []  # nothing visible: no sentence
    _, docs_sents, _ = split_documents(["Alpha one.", "\u200b", "Beta two."])
    assert [s.text for s in docs_sents] == ["Alpha one.", "Beta two."]


@pytest.mark.parametrize("text", ["e\u0301" * 100, "\u0e01\u0e34" * 100, "x\u200dx" * 60])
def test_a_cut_inside_text_without_spaces_keeps_a_letter_with_its_mark(text):
    """Cut at exactly max_chars, these texts would start a unit with an accent, a Thai vowel sign or a joiner."""
    sents = split_sentences("a" + text, max_chars=40)
    assert len(sents) > 1
    for s in sents[1:]:
        assert ("a" + text)[s.start] not in "\u0301\u0e34\u200d"


@given(st.text(alphabet="xe\u0301\u0e01\u0e34\u200d", min_size=1, max_size=1500))
@settings(max_examples=150, deadline=None)
def test_the_hard_cut_never_leaves_a_combining_mark_at_the_start_of_a_unit(text):
    """Text with no space (URLs, base64, Thai) is cut at max_chars, but not between a letter and
    the marks that belong to it."""
    sents = split_sentences("a" + text, max_chars=40)
    _tiles(sents, "a" + text)
    for s in sents[1:]:
        first = ("a" + text)[s.start]
        assert first.strip() == "" or first not in "\u0301\u0e34\u200d", (s.start, repr(first))
