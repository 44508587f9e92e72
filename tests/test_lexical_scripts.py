"""BM25 terms (qgpm/lexical.py) by script, as its docstring lists them: words for spaced
scripts, character bigrams for scripts written without spaces (CJK, kana, Thai, Lao, Khmer,
Myanmar, CJK Extension B), a grapheme kept whole, Latin or digits running into CJK split off,
case folded, and a query of stop words alone scoring nothing."""

from __future__ import annotations

import pytest

from qgpm.lexical import bm25_scores, words


@pytest.mark.parametrize(("text", "terms"), [
    ("กขค", ["กข", "ขค"]),
    ("ກຂຄ", ["ກຂ", "ຂຄ"]),
    ("ひらがな", ["ひら", "らが", "がな"]),
    ("カタカナ", ["カタ", "タカ", "カナ"]),
    ("កខគ", ["កខ", "ខគ"]),
    ("ကခဂ", ["ကခ", "ခဂ"]),
    ("𠮷野家", ["𠮷野", "野家"]),
    ("กิน", ["กิน"]),  # a vowel sign stays with its consonant
    ("iphone的价格", ["iphone", "的价", "价格"]),
    ("2023年发布", ["2023", "年发", "发布"]),
    ("第3章", ["第", "章"]),  # a one-character run is its own term
], ids=["thai", "lao", "hiragana", "katakana", "khmer", "myanmar", "cjk-ext-b", "thai-grapheme", "latin-cjk", "digits-cjk", "cjk-digit-cjk"])
def test_terms_of_each_script(text, terms):
    assert words(text) == terms


def test_terms_match_across_case_and_stop_words_alone_score_nothing():
    assert bm25_scores("Where is the KEY?", ["the key is blue.", "nothing here."])[0] > 0
    assert bm25_scores("what is the", ["", "the of and", "The key is blue."]) == [0.0, 0.0, 0.0]
