"""benchmarks/merge_runs.py: run folders merged into a results folder (rows deduplicated, manifest entries noted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qgpm_testing import benchmark_module

REPO = Path(__file__).resolve().parents[1]


def _module():
    return benchmark_module("merge_runs")


def _row(index: int, method: str = "qgpm", h: str = "aaa") -> dict:
    return {"task": "qa_1", "length": 4096, "depth": 0.5, "seed": index, "index": index, "method": method, "config_hash": h,
            "correct": True}


def _run(folder: Path, rows: list[dict], command: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "rows.rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))  # the same rows again
    (folder / "manifest.json").write_text(json.dumps({"configs": {"aaa": {"method": "qgpm"}}, "runs": [{"command": command}]}))
    return folder


def test_merge_adds_rows_once_and_notes_the_commands(tmp_path, monkeypatch, capsys):
    mod = _module()
    monkeypatch.setattr(mod.subprocess, "call", lambda *a, **k: 0)  # no report regeneration here
    into = tmp_path / "results"
    into.mkdir()
    (into / "rows.jsonl").write_text(json.dumps(_row(0)) + "\n")
    (into / "manifest.json").write_text(json.dumps({"configs": {}, "runs": [{"command": "old"}]}))
    a = _run(tmp_path / "a", [_row(0), _row(1)], "eval a")
    b = _run(tmp_path / "b", [_row(2, method="vanilla", h="bbb")], "eval b")
    assert mod.merge(into, [a, b], "script.sh I") == 0
    rows = [json.loads(line) for line in (into / "rows.jsonl").read_text().splitlines()]
    assert sorted((r["seed"], r["method"]) for r in rows) == [(0, "qgpm"), (1, "qgpm"), (2, "vanilla")]
    assert "1 rows before, 3 after (2 new of 3 merged)" in capsys.readouterr().out
    text = (into / "manifest.json").read_text()
    assert text.startswith('{\n  "configs"'), "the committed manifests keep indent 2"
    man = json.loads(text)
    assert [r["command"] for r in man["runs"]] == ["old", "eval a (script.sh I)", "eval b (script.sh I)"]
    assert "aaa" in man["configs"]


def test_merge_refuses_an_unfinished_run(tmp_path):
    mod = _module()
    (tmp_path / "into").mkdir()
    (tmp_path / "run").mkdir()
    with pytest.raises(SystemExit, match="manifest"):
        mod.merge(tmp_path / "into", [tmp_path / "run"], None)


def test_a_resumed_run_folder_merged_again_adds_only_its_new_entries(tmp_path, monkeypatch):
    mod = _module()
    monkeypatch.setattr(mod.subprocess, "call", lambda *a, **k: 0)
    into = tmp_path / "results"
    into.mkdir()
    (into / "rows.jsonl").write_text("")
    (into / "manifest.json").write_text(json.dumps({"configs": {}, "runs": []}))
    run = _run(tmp_path / "a", [_row(0)], "eval a")
    first = {"command": "eval a", "finished": "2026-12-05T19:42:38+00:00"}
    (run / "manifest.json").write_text(json.dumps({"configs": {}, "runs": [first]}))
    assert mod.merge(into, [run], "first stage") == 0
    # the folder is resumed with more rows and a second entry, then merged again with another note
    (run / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [_row(0), _row(1)]))
    second = {"command": "eval a", "finished": "2026-12-06T00:54:10+00:00"}
    (run / "manifest.json").write_text(json.dumps({"configs": {}, "runs": [first, second]}))
    assert mod.merge(into, [run], "resumed (stage 2, shards I = 0, 1)") == 0
    man = json.loads((into / "manifest.json").read_text())
    assert [(r["finished"], r["command"]) for r in man["runs"]] == [
        ("2026-12-05T19:42:38+00:00", "eval a (first stage)"), ("2026-12-06T00:54:10+00:00", "eval a (resumed (stage 2, shards I = 0, 1))")]
    assert len((into / "rows.jsonl").read_text().splitlines()) == 2


def test_a_committed_answer_is_kept_and_an_error_row_is_replaced(tmp_path, monkeypatch, capsys):
    """A run that answers a committed key again (the same series rerun elsewhere) does not
    overwrite the committed answer, and says so; a committed error row gives way to an answer."""
    mod = _module()
    monkeypatch.setattr(mod.subprocess, "call", lambda *a, **k: 0)
    into = tmp_path / "results"
    into.mkdir()
    committed, failed = dict(_row(0), answer="committed"), dict(_row(1), answer=None, error="ContextTooLongError", correct=False)
    (into / "rows.jsonl").write_text(json.dumps(committed) + "\n" + json.dumps(failed) + "\n")
    (into / "manifest.json").write_text(json.dumps({"configs": {}, "runs": []}))
    run = _run(tmp_path / "a", [dict(_row(0), answer="rerun", correct=False), dict(_row(1), answer="now answered")], "eval a")
    assert mod.merge(into, [run], None) == 0
    rows = {r["seed"]: r for r in map(json.loads, (into / "rows.jsonl").read_text().splitlines())}
    assert rows[0]["answer"] == "committed" and rows[0]["correct"] is True
    assert rows[1]["answer"] == "now answered" and "error" not in rows[1]
    assert "1 merged rows have a committed answer under the same key; the committed ones are kept" in capsys.readouterr().out


def test_tune_shards_merge_keeps_a_retry_over_its_error_row(tmp_path, monkeypatch):
    """qgpm tune appends a retried answer after its error row: the merge keeps the answer."""
    import sys

    mod = benchmark_module("merge_tune_shards")
    shard = tmp_path / "s0"
    shard.mkdir()
    base = {"task": "qa_1", "length": 4096, "depth": 0.5, "seed": 3}
    rows = [dict(base, method="vanilla", config_hash="v", correct=True),
            dict(base, method="qgpm", config_hash="q", correct=False, error="RuntimeError: boom"),
            dict(base, method="qgpm", config_hash="q", correct=True)]
    (shard / "tune_rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (shard / "trials.jsonl").write_text(json.dumps({"config_hash": "q", "config": {"k_sharp": 4.0}}) + "\n")
    monkeypatch.setattr(sys, "argv", ["merge_tune_shards.py", str(tmp_path / "out"), str(shard)])
    mod.main()
    kept = [json.loads(line) for line in (tmp_path / "out" / "tune_rows.jsonl").read_text().splitlines()]
    assert [(r["method"], r.get("error")) for r in kept] == [("vanilla", None), ("qgpm", None)]


def test_a_trials_difference_to_vanilla_is_paired():
    """A trial with an error row: its accuracy and vanilla's are taken over the samples both answered."""
    from qgpm.eval.trials import trial_summary

    def row(seed, ok, **kw):
        return dict({"task": "qa_1", "length": 4096, "depth": 0.5, "seed": seed, "correct": ok, "score": float(ok)}, **kw)

    vanilla = {(r["task"], r["length"], r["depth"], r["seed"]): r for r in (row(0, True), row(1, False), row(2, False))}
    trial = [row(0, True), row(1, True), row(2, False, error="boom")]
    t = trial_summary(trial, vanilla)
    assert t["n"] == 2 and t["errors"] == 1 and (t["b"], t["c"]) == (1, 0)
    assert t["delta_vs_vanilla"] == pytest.approx(0.5)  # 1.0 against 0.5 on seeds 0 and 1 (unpaired: 1.0 - 1/3)


def test_merge_into_a_new_folder_creates_it(tmp_path, monkeypatch):
    mod = _module()
    monkeypatch.setattr(mod.subprocess, "call", lambda *a, **k: 0)
    a = _run(tmp_path / "a", [_row(0)], "eval a")
    assert mod.main(["--into", str(tmp_path / "new" / "results"), str(a)]) == 0
    assert len((tmp_path / "new" / "results" / "rows.jsonl").read_text().splitlines()) == 1


def test_same_answers_reports_an_error_row_instead_of_failing(tmp_path, capsys, monkeypatch):
    import sys

    mod = benchmark_module("same_answers")
    good = dict(_row(0), answer="Priya", method="vanilla")
    failed = dict(good, answer=None, error="RuntimeError: out of memory")
    for name, row in (("committed", good), ("run", failed)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rows.jsonl").write_text(json.dumps(row) + "\n")
    monkeypatch.setattr(sys, "argv", ["same_answers.py", str(tmp_path / "run"), str(tmp_path / "committed")])
    assert mod.main() == 1
    assert "(error: RuntimeError: out of memory)" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["same_answers.py", str(tmp_path / "run"), str(tmp_path / "nowhere")])
    with pytest.raises(SystemExit):
        mod.main()
    assert "holds no rows" in capsys.readouterr().err
