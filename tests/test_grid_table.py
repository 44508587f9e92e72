"""benchmarks/grid_table.py: a test grid's table from rows (paired counts, empty answers)."""

from __future__ import annotations

import json

from qgpm_testing import benchmark_module


def _module():
    return benchmark_module("grid_table")


def _row(index: int, h: str, answer: str, correct: bool, task: str = "nolima_direct") -> dict:
    return {"task": task, "length": 2048, "depth": 0.5, "seed": index, "index": index, "config_hash": h,
            "method": "x", "metric": "string_match_all", "gold": ["Priya"], "answer": answer, "correct": correct,
            "timings": {"wall_s": 2.0 if h == "bbb" else 1.0}}


def test_is_empty_counts_a_bare_answer_prefix_as_no_answer():
    mod = _module()
    assert mod.is_empty("") and mod.is_empty("  \n") and mod.is_empty("Answer:") and mod.is_empty(" answer ")
    assert not mod.is_empty("Answer: Priya") and not mod.is_empty(": 9774994.")


def test_table_pairs_series_and_counts_empty_answers(tmp_path, capsys):
    mod = _module()
    rows = [_row(0, "aaa", "Answer:", False), _row(1, "aaa", "Answer: Priya", True), _row(2, "aaa", "Kenneth", False),
            _row(0, "bbb", "Answer: Priya", True), _row(1, "bbb", "Answer:", False), _row(2, "bbb", "Priya", True),
            _row(3, "aaa", "Priya", True)]  # index 3: only one series ran it, so it is left out
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert mod.main([str(path), "--length", "2048", "--series", "vanilla=aaa,qgpm=bbb"]) == 0
    out = capsys.readouterr().out
    assert "3 samples every series ran" in out
    assert "| nolima_direct | 3 | 1 | 2 (2/1, 1) |" in out  # qgpm wins 0 and 2, loses 1
    assert "| qgpm | 2.0 | 2.00x | 0 |" in out
    assert "| nolima_direct | 1; 1 / 2 | 1; 2 / 2 |" in out


def test_series_may_be_named_by_the_hash_prefix_the_report_prints(tmp_path, capsys):
    mod = _module()
    rows = [_row(0, "aaa111", "Priya", True), _row(0, "bbb222", "Kenneth", False)]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert mod.main([str(path), "--length", "2048", "--series", "vanilla=aaa,qgpm=bbb2"]) == 0
    assert "1 samples every series ran" in capsys.readouterr().out


def test_a_prefix_of_several_series_is_refused(tmp_path):
    import pytest

    mod = _module()
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [_row(0, "aaa111", "Priya", True), _row(0, "aaa222", "Kenneth", False)]))
    with pytest.raises(SystemExit, match="matches several"):
        mod.main([str(path), "--length", "2048", "--series", "vanilla=aaa,qgpm=aaa2"])
