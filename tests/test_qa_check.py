"""benchmarks/qa_check.py: which right QA answers say nothing about reading the context."""

from __future__ import annotations

import json

import pytest

from qgpm_testing import benchmark_module

QUESTIONS = {("qa_1", 0): "Where is the home of the Sunnyside Country Club?",
             ("qa_1", 4): "Who dates rocks, precisely, within the stratigraphic section?"}
GOLD = {0: ["Sunnyside"], 4: ["Geochronologists"]}


def _row(index: int, h: str, answer: str, depth: float = 0.5) -> dict:
    gold = GOLD[index]
    return {"task": "qa_1", "length": 16384, "depth": depth, "seed": 1000 + index, "index": index, "split": "test",
            "config_hash": h, "method": "x", "metric": "string_match_part", "gold": gold, "answer": answer,
            "correct": any(g.lower() in answer.lower() for g in gold)}


def test_each_kind_of_right_answer_is_told_apart():
    mod = benchmark_module("qa_check")
    q0, q4 = QUESTIONS[("qa_1", 0)], QUESTIONS[("qa_1", 4)]
    assert mod.kinds(_row(0, "v", "The home of the Sunnyside Country Club is in the 19th century."), q0) == \
        {"right": True, "in_question": True, "late": False, "strict": False}
    recited = "The San Bernardino-Riverside area maintains the business districts. Geochronologists precisely date rocks"
    assert mod.kinds(_row(4, "q", recited), q4) == {"right": True, "in_question": False, "late": True, "strict": False}
    assert mod.kinds(_row(4, "q", "Geochronologists."), q4) == {"right": True, "in_question": False, "late": False, "strict": True}
    assert mod.kinds(_row(4, "q", "Geologists."), q4) == {"right": False, "in_question": False, "late": False, "strict": False}
    assert mod.first_sentence("  James Watt. He built it.\nMore") == "James Watt."
    assert mod.first_sentence("Answer:\n1. James Watt. He built it.") == "1. James Watt."


def test_the_table_counts_strict_answers_and_pairs_them(tmp_path, capsys, monkeypatch):
    mod = benchmark_module("qa_check")
    asked = []

    def fake_questions(samples):
        asked.append(samples)
        return {k: QUESTIONS[k] for k in samples}

    monkeypatch.setattr(mod, "questions", fake_questions)
    rows = [
        _row(0, "vvv", "The Sunnyside Country Club."), _row(0, "qqq", "The Sunnyside Country Club."),
        _row(4, "vvv", "Geologists.", 0.25), _row(4, "qqq", "Geochronologists.", 0.25),
        _row(4, "vvv", "Geochronologists.", 0.75), _row(4, "qqq", "Business districts. Geochronologists date rocks", 0.75),
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert mod.main([str(path), "--length", "16384", "--series", "vanilla=vvv,qgpm=qqq"]) == 0
    out = capsys.readouterr().out
    assert asked[0] == {("qa_1", 0): (1000, 16384, ["Sunnyside"]), ("qa_1", 4): (1004, 16384, ["Geochronologists"])}
    assert "Questions that contain their gold: qa_1 sample 0." in out
    assert "| vanilla | 2 | 1 | 0 | 1 |" in out
    assert "| qgpm | 3 | 1 | 1 | 1 (1/1, 1) |" in out
    assert mod.main([str(path), "--length", "16384", "--series", "vanilla=vvv,qgpm=qqq", "--against", "qgpm"]) == 0
    out = capsys.readouterr().out
    assert "| qgpm | 3 | 1 | 1 | 1 (1/1, 1) |" in out and "; then against qgpm)" in out
    with pytest.raises(SystemExit, match="not a label"):
        mod.main([str(path), "--length", "16384", "--series", "vanilla=vvv,qgpm=qqq", "--against", "reorder"])


def test_questions_are_drawn_again_and_checked_against_the_rows_gold():
    """The real draw: QA test sample 0's question holds its gold; a gold that differs stops the script."""
    from qgpm.samples.base import split_seed

    mod = benchmark_module("qa_check")
    seed = split_seed("test", 0)
    got = mod.questions({("qa_1", 0): (seed, 2048, ["Sunnyside"])})
    assert got == {("qa_1", 0): "Where is the home of the Sunnyside Country Club?"}
    with pytest.raises(SystemExit, match="differs from the row"):
        mod.questions({("qa_1", 0): (seed, 2048, ["Fresno"])})
