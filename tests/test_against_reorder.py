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


def test_nolima_table_groups_repeated_needles_by_question(tmp_path, capsys):
    """Two contents whose seeds draw the same question are one question in --by-question."""
    from qgpm.samples.base import split_seed
    from qgpm.samples.nolima import needle_combos

    mod = benchmark_module("nolima_table")
    seeds = [split_seed("test", i) for i in range(24)]
    template = {i: needle_combos(s)[0][0] for i, s in enumerate(seeds)}
    a, b = next((i, j) for i in range(24) for j in range(i + 1, 24) if template[i] == template[j])
    c = next(i for i in range(24) if template[i] != template[a])
    rows = []
    for i, right_q, right_r in ((a, True, False), (b, True, False), (c, False, True)):
        for d in (0.0, 0.5):
            for h, ok in (("qqq", right_q), ("rrr", right_r)):
                rows.append({"task": "nolima_direct", "length": 4096, "depth": d, "seed": seeds[i], "index": i, "config_hash": h,
                             "method": "x", "answer": "Priya" if ok else "nobody", "correct": ok, "gold": ["Priya"]})
    assert mod.main([_write(tmp_path, rows), "--series", "reorder=rrr,qgpm=qqq", "--by-question"]) == 0
    out = capsys.readouterr().out
    assert "3 contents hold" in out and "and 2 distinct questions (templates)" in out
    by_q = out.split("distinct questions (templates)")[1]
    line = next(l for l in by_q.splitlines() if l.startswith(f"| {template[a]} | "))
    assert line.startswith(f"| {template[a]} | {min(a, b)}, {max(a, b)} |") and line.endswith("| 0/4 | 4/4 |")  # reorder, qgpm
    assert "qgpm against reorder: ahead on 1 questions, behind on 1" in out


def test_nolima_table_refuses_one_index_from_two_splits(tmp_path):
    """Index 0 of the dev split and index 0 of the test split are different needles: merging
    them by index would count two samples as one."""
    from qgpm.samples.base import split_seed

    mod = benchmark_module("nolima_table")
    rows = [{"task": "nolima_direct", "length": 4096, "depth": 0.5, "seed": split_seed(split, 0), "index": 0, "config_hash": h,
             "method": "x", "answer": "nobody", "correct": False, "gold": ["Priya"]} for split in ("dev", "test") for h in ("qqq", "rrr")]
    with pytest.raises(SystemExit, match="several splits"):
        mod.main([_write(tmp_path, rows), "--series", "reorder=rrr,qgpm=qqq"])
