"""benchmarks/against_reorder.py: QGPM against Reorder task by task, on the samples both ran."""

from __future__ import annotations

import json

import pytest

from qgpm_testing import benchmark_module


def _row(index: int, h: str, correct: bool, task: str = "nolima_direct") -> dict:
    return {"task": task, "length": 4096, "depth": 0.5, "seed": index, "index": index, "config_hash": h,
            "method": "x", "answer": "Priya" if correct else "nobody", "correct": correct}


def _write(tmp_path, rows) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_indices_keep_only_the_named_contents(tmp_path, capsys):
    mod = benchmark_module("against_reorder")
    # Contents 0-1: Reorder right twice, QGPM once; content 2: QGPM right, Reorder wrong.
    rows = [_row(0, "qqq", True), _row(0, "rrr", True), _row(1, "qqq", False), _row(1, "rrr", True),
            _row(2, "qqq", True), _row(2, "rrr", False), _row(0, "qqq", True, task="qa_1"), _row(0, "rrr", True, task="qa_1")]
    args = ["--rows", _write(tmp_path, rows), "--qgpm", "qqq", "--reorder", "rrr", "--margin", "0"]
    assert mod.main(args + ["--indices", "0-1"]) == 0
    out = capsys.readouterr().out
    assert "| nolima_direct | 2 | 1 | 2 | 0/1, 1 | no |" in out
    assert "at least Reorder on every task: not met" in out
    assert mod.main(args) == 0
    out = capsys.readouterr().out
    assert "| nolima_direct | 3 | 2 | 2 | 1/1, 1 | yes |" in out
    assert "| **all** | 4 | **3** | **3** |" in out


@pytest.mark.parametrize("bad", ["11", "a-b", "12-11"])
def test_a_malformed_index_range_is_refused(tmp_path, bad):
    mod = benchmark_module("against_reorder")
    with pytest.raises(SystemExit, match="--indices"):
        mod.main(["--rows", _write(tmp_path, [_row(0, "qqq", True), _row(0, "rrr", True)]), "--qgpm", "qqq", "--reorder", "rrr", "--indices", bad])


def test_no_shared_sample_in_the_range_is_an_error(tmp_path):
    mod = benchmark_module("against_reorder")
    with pytest.raises(SystemExit):
        mod.main(["--rows", _write(tmp_path, [_row(0, "qqq", True), _row(0, "rrr", True)]), "--qgpm", "qqq", "--reorder", "rrr", "--indices", "5-9"])
