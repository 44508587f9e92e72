"""Tests for the evaluation harness: runner, stats, report, tune and the eval CLI.

Fast tests use a tiny random Llama with the SmolLM2 tokenizer (answers are gibberish,
the plumbing is real); one ``real_model`` smoke test runs every task on SmolLM2.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from qgpm_testing import FALLBACK_HEADS, tiny_model

from qgpm import QGPM
from qgpm.config import QGPMConfig
from qgpm.eval import runner as runner_mod
from qgpm.eval import work as work_mod
from qgpm.eval.report import report
from qgpm.eval.rows import merge_rows, read_rows, row_key
from qgpm.eval.answering import answer_sample, answer_stop, gold_continuation
from qgpm.eval.hashes import method_fingerprint
from qgpm.eval.runner import run_eval
from qgpm.plan import KEPT_REASONS
from qgpm.eval.significance import bootstrap_ci, mcnemar_exact, paired_bootstrap_diff, wilson_interval
from qgpm.eval.stats import accuracy, group_accuracy, group_paired, paired
from qgpm.samples.base import split_seed
from qgpm.samples.tasks import TASKS, generate

LENGTH = 256  # every task fits (prompt + 4 new tokens)
# Hard-cut maps (T = 0) where a test changes the config: min-max rescaled soft scores can
# exceed 1 by an ulp in qgpm.shaping.sentence_scores (torch divides by a 0-dim tensor via
# its reciprocal), which positions.strides rejects; see the harness notes.
HARD = dict(t_broad=0.0, t_sharp=0.0)
NEW = 4
HEADS = [(1, 0), (2, 3)]
ALL_METHODS = ["vanilla", "qgpm", "oracle", "topk", "reorder"]


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs the tiny model on one thread (see conftest.one_thread)."""


@pytest.fixture(scope="module")
def tiny_engine(tokenizer):
    return QGPM(tiny_model("llama", len(tokenizer)), tokenizer, heads=HEADS, name="tiny-llama")


def _run(engine, out, **kw):
    args = dict(tasks=["niah_multikey_1"], lengths=[LENGTH], depths=[0.0, 1.0], n=1, methods=ALL_METHODS,
                out_dir=out, max_new_tokens=NEW, progress=False, on_error="raise")
    args.update(kw)
    return run_eval(engine, **args)


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (Path(out) / "rows.jsonl").read_text().splitlines()]


# ----------------------------------------------------------------------------- runner


def test_runner_writes_a_row_per_sample_and_method(tiny_engine, tmp_path):
    out = _run(tiny_engine, tmp_path / "run", tasks=["niah_multikey_1", "kv_retrieval"])
    rows = _rows(out)
    assert len(rows) == 2 * 2 * len(ALL_METHODS)  # tasks x depths x methods
    assert len({row_key(r) for r in rows}) == len(rows)
    for r in rows:
        for field in ("task", "length", "depth", "seed", "index", "method", "answer", "correct", "score", "gold",
                      "logprob_gold", "prompt_tokens", "timings", "split", "config_hash"):
            assert field in r, field
        assert r["split"] == "test" and r["seed"] == split_seed("test", 0) and r["index"] == 0
        assert r["prompt_tokens"] + NEW <= LENGTH or r["method"] in ("topk", "reorder")
        assert isinstance(r["correct"], bool) and 0.0 <= r["score"] <= 1.0
        assert r["logprob_gold"] < 0 and math.isfinite(r["logprob_gold"])
        assert r["timings"]["wall_s"] > 0
    by_method = {m: [r for r in rows if r["method"] == m] for m in ALL_METHODS}
    assert all(len(v) == 4 for v in by_method.values())
    for r in by_method["qgpm"]:
        assert 1 <= len(r["top_sentences"]) <= 3 and r["timings"]["pass1_s"] > 0
        assert r["evidence_rank"] is not None and 0 <= r["evidence_rank"] < r["num_sentences"]
    for r in by_method["qgpm"] + by_method["oracle"]:  # what the plan did: sentences moved, or the rule that kept none
        assert r["kept_reason"] in (None, *KEPT_REASONS) and (r["promoted"] == 0) == (r["kept_reason"] is not None)
    assert all("kept_reason" not in r for r in by_method["vanilla"])
    assert {r["depth"] for r in rows} == {0.0, 1.0}
    # vanilla's hash ignores the QGPM config; qgpm's includes config and heads
    assert len({r["config_hash"] for r in rows}) == len(ALL_METHODS)
    man = json.loads((out / "manifest.json").read_text())
    assert set(man["latest"]["config_hashes"]) == set(ALL_METHODS)
    assert man["configs"][man["latest"]["config_hashes"]["qgpm"]]["heads"] == [list(h) for h in HEADS]
    # the report is written with the run; its header names the relevance source, also the default one
    assert (out / "report.md").is_file() and (out / "stats.json").is_file()
    assert f"relevance source `{tiny_engine.config.relevance}`" in (out / "report.md").read_text()
    heads = _run(tiny_engine, tmp_path / "heads", methods=["qgpm"], depths=[0.0], config=tiny_engine.config.with_(relevance="heads"))
    assert "relevance source `heads`" in (heads / "report.md").read_text()  # the default, left out of the stored config
    # a resumed folder's header describes its rows, not only the latest run
    _run(tiny_engine, out, methods=["vanilla"], depths=[0.5])
    header = (out / "report.md").read_text().split("## ", 1)[0]
    assert "- split: **test**\n" in header and "depths: [0.0, 0.5, 1.0]" in header and "written by 2 runs" in header
    assert "series: vanilla, qgpm, oracle, topk, reorder; samples per (task, length, depth) and series: 1;" in header
    assert (out / "plots" / f"depth_kv_retrieval_{LENGTH}.png").stat().st_size > 1000


def test_runner_matches_engine_answer_and_logprob(tiny_engine):
    s = generate("nolima_direct", n=1, length=LENGTH, tokenizer=tiny_engine.tokenizer, seed=split_seed("test", 3), depths=[0.5], max_new_tokens=NEW)[0]
    for m in ("qgpm", "oracle", "topk"):
        got = answer_sample(tiny_engine, s, m)
        kw = dict(method=m, instruction=s.instruction, template=s.template, answer_prefix=s.answer_prefix,
                  evidence=s.evidence if m == "oracle" else None)
        ref = tiny_engine.answer(s.context, s.question, max_new_tokens=s.max_new_tokens, **kw)
        assert got["answer"] == ref.text
        ref_lp = tiny_engine.answer_logprob(s.context, s.question, gold_continuation(s), **kw)
        assert got["logprob_gold"] == pytest.approx(ref_lp, abs=1e-3)


def test_gold_continuation_spacing(tiny_engine):
    s = generate("niah_single_2", n=1, length=LENGTH, tokenizer=tiny_engine.tokenizer, seed=0, max_new_tokens=NEW)[0]
    assert s.answer_prefix.endswith("is") and gold_continuation(s) == " " + s.answers[0]
    s.answer_prefix = ""
    assert gold_continuation(s) == s.answers[0]


def test_resume_skips_done_rows_and_reruns_only_changed_methods(tiny_engine, tmp_path, monkeypatch):
    out = tmp_path / "run"
    _run(tiny_engine, out, methods=["vanilla", "qgpm"])
    first = _rows(out)
    assert len(first) == 4

    calls = []
    real = work_mod.generate

    def counting(task, **kw):
        calls.append((task, kw["seed"], tuple(kw["depths"] or ())))
        return real(task, **kw)

    monkeypatch.setattr(work_mod, "generate", counting)
    _run(tiny_engine, out, methods=["vanilla", "qgpm"])
    assert calls == []  # nothing left to do: no sample even generated
    assert _rows(out) == first

    # n=2: only sample 1 (both depths) is new
    _run(tiny_engine, out, methods=["vanilla", "qgpm"], n=2)
    assert sorted(calls) == [("niah_multikey_1", split_seed("test", 1), (0.0,)), ("niah_multikey_1", split_seed("test", 1), (1.0,))]
    assert len(_rows(out)) == 8

    # a new QGPM config: qgpm reruns, vanilla rows are reused
    calls.clear()
    cfg = QGPMConfig(k_sharp=1.0, **HARD)
    _run(tiny_engine, out, methods=["vanilla", "qgpm"], n=2, config=cfg)
    assert len(calls) == 4
    rows = _rows(out)
    assert sum(r["method"] == "vanilla" for r in rows) == 4
    assert sum(r["method"] == "qgpm" for r in rows) == 8  # two configs x 4 samples
    assert len({r["config_hash"] for r in rows if r["method"] == "qgpm"}) == 2
    text = (out / "report.md").read_text()
    assert "qgpm@" in text  # two qgpm configs -> labelled series

    # no-resume starts afresh, its manifest too
    _run(tiny_engine, out, methods=["vanilla"], resume=False)
    assert len(_rows(out)) == 2
    from qgpm.eval.rows import read_manifest

    man = read_manifest(out)
    assert len(man["runs"]) == 1 and list(man["configs"]) == [_rows(out)[0]["config_hash"]]


def test_error_rows_are_recorded_and_retried(tiny_engine, tmp_path, monkeypatch):
    out = tmp_path / "run"
    real = runner_mod.answer_sample

    def flaky(engine, sample, method, **kw):
        if method == "oracle":
            raise RuntimeError("boom")
        return real(engine, sample, method, **kw)

    monkeypatch.setattr(runner_mod, "answer_sample", flaky)
    _run(tiny_engine, out, methods=["vanilla", "oracle"], depths=[0.5], on_error="record")
    rows = _rows(out)
    err = [r for r in rows if r.get("error")]
    assert len(err) == 1 and "boom" in err[0]["error"] and err[0]["method"] == "oracle"
    assert "## Errors" in (out / "report.md").read_text()
    monkeypatch.setattr(runner_mod, "answer_sample", real)
    _run(tiny_engine, out, methods=["vanilla", "oracle"], depths=[0.5])
    rows = _rows(out)
    assert len(rows) == 2 and not any(r.get("error") for r in rows)


def test_manual_shards_partition_the_work(tiny_engine, tmp_path):
    out = tmp_path / "run"
    _run(tiny_engine, out, methods=["vanilla"], depths=[0.0, 0.5, 1.0], shard=(0, 2), write_report=False)
    a = read_rows(out, include_ranks=False)
    assert {r["depth"] for r in a} == {0.0, 1.0}  # items 0 and 2
    _run(tiny_engine, out, methods=["vanilla"], depths=[0.0, 0.5, 1.0], shard=(1, 2))
    rows = _rows(out)
    assert [r["depth"] for r in rows] == [0.0, 0.5, 1.0]
    assert {r["rank"] for r in rows} == {0, 1}


def test_runner_rejects_bad_arguments(tiny_engine, tmp_path):
    with pytest.raises(ValueError, match="unknown methods"):
        _run(tiny_engine, tmp_path, methods=["vanilla", "magic"])
    with pytest.raises(ValueError, match="unknown tasks"):
        _run(tiny_engine, tmp_path, tasks=["nope"])


# ----------------------------------------------------------------------------- stats


def test_mcnemar_exact_known_values():
    # b=1, c=9: two-sided binomial p = 2 * (1 + 10) / 2**10
    assert mcnemar_exact(1, 9) == pytest.approx(22 / 1024)
    assert mcnemar_exact(9, 1) == pytest.approx(22 / 1024)
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(5, 5) == pytest.approx(1.0)
    assert mcnemar_exact(0, 6) == pytest.approx(2 / 64)


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(5, 10)
    assert (lo, hi) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    assert wilson_interval(10, 10)[1] == 1.0
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_bootstrap_intervals_contain_the_mean_and_are_seeded():
    x = [1, 0, 1, 1, 0, 1, 0, 1, 1, 1, 0, 1]
    lo, hi = bootstrap_ci(x, seed=3)
    assert lo <= sum(x) / len(x) <= hi and 0 <= lo < hi <= 1
    assert bootstrap_ci(x, seed=3) == (lo, hi)
    d, dlo, dhi = paired_bootstrap_diff([1, 1, 1, 0, 1, 1], [0, 1, 0, 0, 0, 1], seed=0)
    assert d == pytest.approx(0.5) and dlo <= d <= dhi and dlo >= 0.0


def test_the_paired_interval_resamples_whole_contents():
    """Four contents at five depths each: three won everywhere, one lost everywhere. Resampled
    by content, a draw holds j lost contents and the difference is (4 - 2j) / 4: P(j >= 3) =
    13/256 (5 %) and P(j = 0) = 81/256, so the 95 % interval runs from -0.5 to +1; resampled
    by pair it stays in a narrow band around +0.5."""
    a = [1.0] * 15 + [0.0] * 5
    b = [0.0] * 15 + [1.0] * 5
    contents = [i // 5 for i in range(20)]
    d, lo, hi = paired_bootstrap_diff(a, b, seed=0, contents=contents)
    _, plo, phi = paired_bootstrap_diff(a, b, seed=0)
    assert d == pytest.approx(0.5)
    assert lo == pytest.approx(-0.5) and hi == pytest.approx(1.0)
    assert 0.0 < plo and phi < 1.0
    # the pooled statistic weighs contents by their pairs: one content of 3 pairs (+1 each) and one of 1 (-1)
    assert paired_bootstrap_diff([1, 1, 1, 0], [0, 0, 0, 1], seed=0, contents=["x", "x", "x", "y"])[0] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="one content per pair"):
        paired_bootstrap_diff([1.0], [0.0], contents=[])


def test_scipy_statistics_match_the_closed_forms():
    """Wilson and the percentile bootstrap come from scipy; pin them to the textbook formulas
    (the committed reports were made with these formulas written out)."""
    import math

    import numpy as np
    from scipy.stats import norm

    from qgpm.eval.significance import _rng

    z = float(norm.ppf(0.975))
    for n in (1, 3, 10, 75, 150):
        for k in range(n + 1):
            p = k / n
            den = 1 + z * z / n
            centre, half = (p + z * z / (2 * n)) / den, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
            lo, hi = wilson_interval(k, n)
            assert lo == pytest.approx(0.0 if k == 0 else centre - half, abs=1e-12)
            assert hi == pytest.approx(1.0 if k == n else centre + half, abs=1e-12)
    x = np.array([1, 0, -1, 0, 0, 1, 1, 0, -1, 1, 0, 0, 1], dtype=float)
    idx = _rng("seed").integers(0, x.size, size=(10_000, x.size))  # the resamples scipy draws from this generator
    ref = tuple(np.quantile(x[idx].mean(axis=1), [0.025, 0.975]))
    assert bootstrap_ci(x, seed="seed") == pytest.approx(ref, abs=1e-12)
    assert bootstrap_ci([0.5]) == (0.5, 0.5) and all(math.isnan(v) for v in bootstrap_ci([]))
    assert bootstrap_ci(x, seed=1, stat=lambda s: s.max(axis=1)) == (1.0, 1.0)


def test_committed_report_statistics_regenerate_unchanged(tmp_path):
    """`qgpm report` on the committed SmolLM2 test grid reproduces its stats.json byte for byte, and
    report.md up to the plot section (plots are skipped here for time)."""
    import shutil

    from qgpm.eval.report import report

    src = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "eval_smollm2_test"
    out = tmp_path / "grid"
    shutil.copytree(src, out)
    report(out, plots=False)
    assert (out / "stats.json").read_bytes() == (src / "stats.json").read_bytes()
    committed = (src / "report.md").read_text().split("\n## Accuracy vs depth\n")[0]
    assert (out / "report.md").read_text() == committed


def _hand_rows() -> list[dict]:
    """20 paired samples: both right 6, only qgpm right 9, only vanilla right 1, both wrong 4."""
    rows = []
    outcomes = [(1, 1)] * 6 + [(1, 0)] * 9 + [(0, 1)] * 1 + [(0, 0)] * 4
    for i, (q, v) in enumerate(outcomes):
        base = dict(task="niah_multikey_1", length=1024, depth=[0.0, 0.5, 1.0, 0.5][i % 4], seed=i, index=i, split="test")
        rows.append(dict(base, method="vanilla", config_hash="v0", correct=bool(v), score=float(v), logprob_gold=-2.0 - v))
        rows.append(dict(base, method="qgpm", config_hash="q0", correct=bool(q), score=float(q), logprob_gold=-1.0))
    return rows


def test_paired_stats_on_hand_made_rows():
    rows = _hand_rows()
    q = [r for r in rows if r["method"] == "qgpm"]
    v = [r for r in rows if r["method"] == "vanilla"]
    a = accuracy(q)
    assert (a.n, a.correct, a.acc) == (20, 15, 0.75) and a.lo < 0.75 < a.hi
    p = paired(q, v)
    assert (p.n, p.b, p.c) == (20, 9, 1)
    assert p.diff == pytest.approx(0.75 - 0.35) and p.lo <= p.diff <= p.hi
    assert p.p == pytest.approx(22 / 1024)
    assert p.logprob_diff == pytest.approx(1.0 + 0.35)
    groups = group_paired(rows, ("task", "length", "depth"))
    assert sum(g.n for g in groups.values()) == 20
    assert set(k[-1] for k in groups) == {"qgpm"}  # the baseline is not compared with itself
    # rows with an error are left out of the pairs
    q[0] = dict(q[0], error="x")
    assert paired(q, v).n == 19
    # a sample answered twice (a resumed run) is one pair and one answer: the later row counts
    q = [r for r in rows if r["method"] == "qgpm"]
    again = dict(q[0], correct=not q[0]["correct"])
    assert paired(q + [again], v).n == 20 and paired(q + [again], v).b == paired([again] + q[1:], v).b
    assert {k: a.n for k, a in group_accuracy(rows + [again], ("*",)).items()} == {("all", "qgpm"): 20, ("all", "vanilla"): 20}


def test_content_sign_flip_counts_needle_contents_not_pairs():
    from qgpm.eval.significance import content_sign_flip

    # two contents, each won at five depths: McNemar sees 10 independent wins, the contents are two
    d = [1.0] * 10
    c = ["a"] * 5 + ["b"] * 5
    assert mcnemar_exact(10, 0) < 0.01
    assert content_sign_flip(d, c) == pytest.approx(2 / 4)
    # six contents, each ahead: the smallest p six contents allow
    assert content_sign_flip([1.0, 1.0, 0.0] * 6, [i // 3 for i in range(18)]) == pytest.approx(2 / 64)
    # one pair per content: the sign-flip test is McNemar's exact binomial test
    assert content_sign_flip([1.0] * 9 + [-1.0] + [0.0] * 10, list(range(20))) == pytest.approx(mcnemar_exact(9, 1))
    assert content_sign_flip([0.0, 1.0, -1.0], ["a", "b", "b"]) == 1.0  # every content's sum is 0
    # whole-number sums are exact for any number of contents: 60 contents all ahead is 2 / 2**60, not a Monte Carlo floor
    assert content_sign_flip([1.0] * 60, list(range(60))) == pytest.approx(2 / 2**60, rel=1e-12)
    # uneven sums: contents of 1, 2, 3 and -1 pairs ahead; brute force over the 16 sign patterns
    sums = [1, 2, 3, -1]
    brute = sum(abs(sum(s * (1 - 2 * ((m >> i) & 1)) for i, s in enumerate(sums))) >= abs(sum(sums)) for m in range(16)) / 16
    assert content_sign_flip([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -1.0], [0, 1, 1, 2, 2, 2, 3]) == pytest.approx(brute)
    # fractional sums (score differences) past 16 contents: a seeded Monte Carlo estimate
    many = content_sign_flip([0.5] * 20, list(range(20)), n_resamples=2000, seed=3)
    assert many == pytest.approx(1 / 2001) and many == content_sign_flip([0.5] * 20, list(range(20)), n_resamples=2000, seed=3)
    with pytest.raises(ValueError, match="one content per difference"):
        content_sign_flip([1.0], [])


def test_paired_reports_contents_and_their_p(tmp_path):
    rows = []
    for seed in range(3):  # 3 contents x 4 depths: qgpm right everywhere, vanilla nowhere
        for d in (0.0, 0.25, 0.5, 0.75):
            base = dict(task="niah_multivalue", length=1024, depth=d, seed=seed, index=seed, split="test")
            rows.append(dict(base, method="vanilla", config_hash="v0", correct=False, score=0.0, logprob_gold=None))
            rows.append(dict(base, method="qgpm", config_hash="q0", correct=True, score=1.0, logprob_gold=None))
    p = paired([r for r in rows if r["method"] == "qgpm"], [r for r in rows if r["method"] == "vanilla"])
    assert (p.n, p.b, p.contents) == (12, 12, 3) and p.p < 0.001 and p.content_p == pytest.approx(2 / 8)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = report(tmp_path).read_text()
    assert "| contents | content p |" in text and "| 12 | 0 | 4.9e-04 | 3 | 0.250 |" in text


def test_report_from_hand_made_rows(tmp_path):
    rows = _hand_rows()
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = report(tmp_path)
    text = path.read_text()
    assert "| niah_multikey_1 | 1024 | 35.0 (18–57) n=20 | 75.0 (53–89) n=20 |" in text
    assert "| niah_multikey_1 | 1024 | qgpm | 20 | 75.0 | 35.0 | +40.0 [" in text and "| 9 | 1 | 0.021 |" in text
    assert "## Accuracy by depth" in text and "| niah_multikey_1 | 1024 | 0.5 |" in text
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["paired"][0]["p"] == pytest.approx(22 / 1024)
    png = tmp_path / "plots" / "depth_niah_multikey_1_1024.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_header_names_only_the_settings_the_latest_runs_methods_read(tmp_path):
    rows = [r for r in _hand_rows() if r["method"] == "vanilla"]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    latest = {"command": "qgpm eval ...", "n": 20, "reranker": "minilm", "k": 5, "heads": [[1, 2]], "config": {"relevance": "heads"},
              "config_provenance": "preset"}

    def header(methods):
        (tmp_path / "manifest.json").write_text(json.dumps({"runs": [], "latest": dict(latest, methods=methods)}))
        return [line for line in report(tmp_path, plots=False).read_text().splitlines() if line.startswith("- the latest run") or line.startswith("- its QGPM")]

    assert header(["vanilla"]) == ["- the latest run: `qgpm eval ...` (methods vanilla; n = 20 per (task, length, depth))"]
    assert header(["vanilla", "reorder"])[0].endswith("(methods vanilla, reorder; n = 20 per (task, length, depth); reranker (reorder) minilm)")
    qgpm = header(["vanilla", "qgpm", "topk"])
    assert qgpm[0].endswith("reranker (topk) minilm, k=5; heads `[[1, 2]]`; relevance source `heads`)") and qgpm[1].startswith("- its QGPM config")
    oracle = header(["oracle"])  # the Oracle reads the config, not the heads or the relevance source
    assert oracle[0].endswith("(methods oracle; n = 20 per (task, length, depth))") and oracle[1].startswith("- its QGPM config")
    latest["config"] = {"relevance": "minilm"}
    assert header(["qgpm"])[0].endswith("(task, length, depth); relevance source `minilm`)")  # the minilm source reads no heads
    assert "reranker (topk/reorder) minilm, k=5; heads" in header(["vanilla", "a-method-since-renamed"])[0]  # unknown: every setting


def test_report_draws_no_plot_for_a_task_whose_answers_all_errored(tmp_path, recwarn):
    """A (task, length) where every answer errored has nothing to plot: no empty figure and no
    legend warning; the other task's plot and the errors section are still written."""
    rows = _hand_rows()
    base = dict(task="qa_1", length=1024, depth=0.5, seed=0, index=0, split="test", correct=False, score=0.0, error="ValueError: x")
    rows += [dict(base, method=m, config_hash=h) for m, h in (("vanilla", "v0"), ("qgpm", "q0"))]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = report(tmp_path).read_text()
    assert (tmp_path / "plots" / "depth_niah_multikey_1_1024.png").exists()
    assert not (tmp_path / "plots" / "depth_qa_1_1024.png").exists()
    assert "## Errors" in text and "qa_1 @1024" in text
    assert not [w for w in recwarn if "legend" in str(w.message)]


def test_report_counts_the_calls_a_rule_kept_at_vanilla_positions(tmp_path):
    """Rows that record kept_reason: a section counts, per task, length and series, the calls
    that moved nothing and the rule that kept each; rows without it (older runs) add nothing."""
    rows = _hand_rows()
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "kept the model's own positions" not in report(tmp_path, plots=False).read_text()
    for i, r in enumerate(x for x in rows if x["method"] == "qgpm"):
        r["kept_reason"] = ["keep_length", "flat", None, None][i % 4]
        r["promoted"] = 0 if r["kept_reason"] else 2
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = report(tmp_path, plots=False).read_text()
    assert "## Calls that kept the model's own positions" in text
    assert "| task | length | series | calls | flat | keep_length |" in text
    assert "| niah_multikey_1 | 1024 | qgpm | 20 | 5 | 5 |" in text


def test_cost_table_averages_the_log_prob_time_over_scored_answers_only(tmp_path):
    """Rows run with --no-logprob hold no gold log-prob: their log-prob time (0.0 in older rows)
    does not pull the mean down; a series that scored none shows a dash."""
    rows = _hand_rows()
    for i, r in enumerate(rows):
        scored = r["method"] == "vanilla" or i % 4 == 1
        r["logprob_gold"] = -1.0 if scored else None
        r["timings"] = {"edit_s": 0.0, "pass1_s": 0.5 if r["method"] == "qgpm" else 0.0, "prefill_s": 2.0, "decode_s": 1.0,
                        "logprob_s": 1.5 if scored else 0.0, "wall_s": 3.0}
    for r in rows[:2]:
        r["timings"]["logprob_s"] = None  # newer unscored rows write None
        r["logprob_gold"] = None
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = report(tmp_path, plots=False).read_text()
    assert "| series | answers | prompt tokens | answer tokens | edit s | ranking s | prefill s | decode s | log-prob s | wall s |" in text
    assert "| vanilla | 20 | 0 | 0.0 | 0.000 | 0.000 | 2.000 | 1.000 | 1.500 | 3.000 |" in text
    assert "| qgpm | 20 | 0 | 0.0 | 0.000 | 0.500 | 2.000 | 1.000 | 1.500 | 3.000 |" in text
    for r in rows:
        r["logprob_gold"] = None
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "| vanilla | 20 | 0 | 0.0 | 0.000 | 0.000 | 2.000 | 1.000 | – | 3.000 |" in report(tmp_path, plots=False).read_text()


def test_merge_dedupes_and_prefers_successful_rows(tmp_path):
    good = dict(task="qa_1", length=512, depth=None, seed=0, index=0, method="vanilla", config_hash="h", correct=True, score=1.0)
    bad = dict(good, correct=False, score=0.0, error="E")
    (tmp_path / "rows.rank0.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    (tmp_path / "rows.rank1.jsonl").write_text(json.dumps(dict(good, seed=1)) + "\n{torn line")
    rows = merge_rows(tmp_path)
    assert len(rows) == 2 and all(not r.get("error") for r in rows)
    assert len(_rows(tmp_path)) == 2


# ----------------------------------------------------------------------------- tune


def test_tune_caches_pass1_and_writes_summary(tiny_engine, tmp_path, monkeypatch):
    from qgpm.eval import tune as tune_mod
    from qgpm.eval.tune import Pass1Cache, load_config, tune

    grid = {"k_sharp": [1.0, 2.0], "s_low": [0.1, 0.3]}
    base = QGPMConfig(**HARD, pass1_dtype="float32")  # a pass-1 field too (the tiny model is float32): the preset line must carry it
    summary = tune(tiny_engine, tasks=["niah_multikey_1"], lengths=[LENGTH], depths=[0.0, 1.0], n=1, out_dir=tmp_path,
                   grid=grid, base_config=base, max_new_tokens=NEW, progress=False, command="test", oracle=True)
    assert summary["trials"] == 4  # base (k_sharp=2, s_low=0.1) + 3 others
    assert summary["pass1_runs"] == 2  # once per sample, not per trial
    assert summary["split"] == "dev" and summary["seeds"] == [split_seed("dev", 0)] * 2
    trials = [json.loads(x) for x in (tmp_path / "trials.jsonl").read_text().splitlines()]
    assert len(trials) == 4 and trials[0]["changes"] == {}
    assert all(t["oracle"]["n"] == 2 and t["oracle"]["mean_logprob"] is not None for t in trials)
    assert all(t["n"] == 2 and t["errors"] == 0 and t["mean_logprob"] is not None for t in trials)
    md = (tmp_path / "tune_summary.md").read_text()
    assert "dev" in md and "provenance=" in md and "command: `test`" in md and "oracle acc %" in md
    best = load_config(tmp_path / "best_config.json")
    assert "tuned on the dev split" in best.provenance
    line = md.split("```python\n", 1)[1].split("\n```", 1)[0]
    assert eval(line, {"QGPMConfig": QGPMConfig}) == best  # the preset line builds the best config, every field of it
    rows = [json.loads(x) for x in (tmp_path / "tune_rows.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * (4 + 4 + 1) and all(r["split"] == "dev" for r in rows)
    # the oracle rows are the Oracle's answers under each trial's config (evidence labels, not heads)
    from qgpm.eval.answering import prepare_kwargs

    s0 = generate("niah_multikey_1", n=1, length=LENGTH, tokenizer=tiny_engine.tokenizer, seed=split_seed("dev", 0), depths=[1.0], max_new_tokens=NEW)[0]
    refs = {}
    for m in ("oracle", "qgpm"):
        ref = tiny_engine.generate_prepared(tiny_engine.prepare(s0.context, s0.question, **prepare_kwargs(s0, m, config=base)),
                                            max_new_tokens=s0.max_new_tokens, score=gold_continuation(s0))
        h = trials[0]["oracle"]["config_hash"] if m == "oracle" else trials[0]["config_hash"]
        row = next(r for r in rows if r["method"] == m and r["depth"] == 1.0 and r["config_hash"] == h)
        assert row["logprob_gold"] == pytest.approx(ref.details["score_logprob"], abs=1e-4) and row["answer"] == ref.text
        refs[m] = ref.details["score_logprob"]
    assert abs(refs["oracle"] - refs["qgpm"]) > 5e-4  # the two differ on this sample, so the check above tells them apart

    # resume: nothing recomputed
    monkeypatch.setattr(tune_mod, "_answer_cached", lambda *a, **k: pytest.fail("recomputed a done trial"))
    tune(tiny_engine, tasks=["niah_multikey_1"], lengths=[LENGTH], depths=[0.0, 1.0], n=1, out_dir=tmp_path,
         grid=grid, base_config=base, max_new_tokens=NEW, progress=False, oracle=True)

    # the cached plan is the engine's plan
    s = generate("niah_multikey_1", n=1, length=LENGTH, tokenizer=tiny_engine.tokenizer, seed=split_seed("dev", 0), depths=[0.5], max_new_tokens=NEW)[0]
    cfg = QGPMConfig(k_sharp=1.0, s_low=0.3, **HARD)
    cache = Pass1Cache(tiny_engine)
    cache.call(s, QGPMConfig(**HARD), "qgpm")  # cached under another shaping config: replanned below
    mine = cache.call(s, cfg, "qgpm").plan
    assert cache.misses == 1
    ref = tiny_engine.prepare(s.context, s.question, method="qgpm", instruction=s.instruction, template=s.template,
                              answer_prefix=s.answer_prefix, config=cfg).plan
    assert mine.layer_map == ref.layer_map
    for a, b in zip(mine.positions, ref.positions):
        assert torch.equal(a, b)


def test_the_default_grid_leaves_out_what_the_base_config_does_not_read(tiny_engine, tmp_path, caplog):
    from qgpm.config import PRESETS, RECIPE
    from qgpm.eval.tune import DEFAULT_GRID, default_grid, tune

    assert default_grid(QGPMConfig()) == DEFAULT_GRID  # the paper's two maps under stride read every field of it
    for base in (RECIPE, *PRESETS.values()):  # one map, remap="reorder": the broad map and the gate are not read
        assert sorted(default_grid(base)) == ["k_sharp", "s_low", "t_sharp"]
    base = QGPMConfig(**{**HARD, "split_layer": 0, "remap": "reorder"})
    with caplog.at_level("WARNING", logger="qgpm"):
        summary = tune(tiny_engine, tasks=["niah_multikey_1"], lengths=[LENGTH], depths=[0.0], n=1, out_dir=tmp_path,
                       grid={"eps": [0.05, 0.5], "s_low": [0.1]}, base_config=base, max_new_tokens=NEW, progress=False, command="test")
    warned = [r.getMessage() for r in caplog.records if "changes no position" in r.getMessage()]
    assert len(warned) == 1 and "varies eps" in warned[0]
    from qgpm.eval.tune import warn_inert

    caplog.clear()
    with caplog.at_level("WARNING", logger="qgpm"):  # a grid that also tries stride with two maps reads eps and k_broad there
        warn_inert({"remap": ["reorder", "stride"], "split_layer": [0, None], "eps": [0.05, 0.5], "k_broad": [8.0, 16.0]}, RECIPE)
        warn_inert({"remap": ["reorder", "move"], "tau": [0.0, 1.0], "t_broad": [2.0, 4.0]}, RECIPE)  # move reads tau; no grid point reads t_broad
    assert [r.getMessage().split(",")[0] for r in caplog.records] == ["qgpm tune: the grid varies t_broad"]
    assert summary["trials"] >= 2
    summary = tune(tiny_engine, tasks=["niah_multikey_1"], lengths=[LENGTH], depths=[0.0], n=1, out_dir=tmp_path / "default",
                   base_config=base, trials=1, max_new_tokens=NEW, progress=False, command="test")
    assert sorted(summary["grid"]) == ["k_sharp", "s_low", "t_sharp"]  # no grid given: the base config's default


def test_tune_resumes_after_a_torn_row_and_refuses_an_empty_shard(tiny_engine, tmp_path, monkeypatch, capsys):
    import qgpm.eval.cli as eval_cli
    from qgpm.eval.tune import tune

    kw = dict(tasks=["niah_multikey_1"], lengths=[LENGTH], depths=[0.0], n=1, out_dir=tmp_path, grid={"k_sharp": [1.0, 2.0]},
              base_config=QGPMConfig(**HARD), max_new_tokens=NEW, progress=False, command="test", logprob=False)
    tune(tiny_engine, **kw)
    path = tmp_path / "tune_rows.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1] + [lines[-1][:40]]))  # killed while writing the last row
    tune(tiny_engine, **kw)
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.startswith("{") and x.endswith("}")]
    assert len(rows) == len(lines)  # the torn row answered again, on a line of its own
    tune(tiny_engine, **kw)
    assert len(path.read_text().splitlines()) == len(lines) + 1  # nothing more to answer: the torn fragment stays, skipped
    with pytest.raises(ValueError, match="shard 1/2 gets no sample: the run has 1"):
        tune(tiny_engine, **{**kw, "out_dir": tmp_path / "s1"}, shard=(1, 2))
    monkeypatch.setattr(eval_cli, "_engine_and_config", lambda *a, **k: pytest.fail("the model loaded"))
    assert eval_cli.main(["tune", "--tasks", "qa_1", "--lengths", "1024", "--depths", "0.5", "--n", "1", "--shard", "1/2",
                          "--out", str(tmp_path / "s2"), "--no-progress"]) == 2
    assert "gets no sample" in capsys.readouterr().err


def test_tune_says_when_every_answer_kept_vanilla_positions(tiny_engine, tmp_path):
    from qgpm.eval.tune import tune

    summary = tune(tiny_engine, tasks=["niah_multikey_1"], lengths=[LENGTH], depths=[0.0, 1.0], n=1, out_dir=tmp_path,
                   grid={"k_sharp": [1.0, 2.0]}, base_config=QGPMConfig(**HARD, keep_length=1024), max_new_tokens=NEW,
                   progress=False, command="test", logprob=False)
    assert summary["kept_vanilla"] == {"answers": 4, "by_reason": {"keep_length": 4}}  # 2 trials x 2 samples, all within keep_length
    md = (tmp_path / "tune_summary.md").read_text()
    assert "**every answer kept vanilla positions** (keep_length 4 of 4): the trials cannot differ" in md
    assert "relevance computed 2 times" in md


def test_tune_oracle_only_in_shards_merges_to_the_unsharded_summary(tiny_engine, tmp_path, monkeypatch):
    from qgpm.eval import tune as tune_mod
    from qgpm.eval.tune import tune

    kw = dict(tasks=["niah_multikey_1"], lengths=[LENGTH], depths=[0.0, 0.5, 1.0], n=1, grid={"s_low": [0.1, 0.3]},
              base_config=QGPMConfig(**HARD), max_new_tokens=NEW, progress=False, command="test", methods=["oracle"])
    parts = [tune(tiny_engine, out_dir=tmp_path / f"s{i}", shard=(i, 2), **kw) for i in range(2)]
    assert [p["samples"] for p in parts] == [2, 1] and parts[0]["methods"] == ["oracle"]
    rows = []
    for i in range(2):
        rows += (tmp_path / f"s{i}" / "tune_rows.jsonl").read_text().splitlines()
    parsed = [json.loads(r) for r in rows]
    assert {r["method"] for r in parsed} == {"vanilla", "oracle"}  # no qgpm answers: the heads are not used
    assert len(parsed) == 3 * (1 + 2)
    (tmp_path / "all").mkdir()
    (tmp_path / "all" / "tune_rows.jsonl").write_text("\n".join(rows) + "\n")
    monkeypatch.setattr(tune_mod, "_answer_cached", lambda *a, **k: pytest.fail("recomputed a sharded answer"))
    monkeypatch.setattr(tune_mod, "answer_sample", lambda *a, **k: pytest.fail("recomputed a sharded answer"))
    full = tune(tiny_engine, out_dir=tmp_path / "all", **kw)
    assert full["samples"] == 3 and full["best"]["n"] == 3 and "oracle" not in full["best"]
    assert "trials answered by: oracle" in (tmp_path / "all" / "tune_summary.md").read_text()
    with pytest.raises(ValueError, match="qgpm and/or oracle"):
        tune(tiny_engine, out_dir=tmp_path / "x", **{**kw, "methods": ["topk"]})
    with pytest.raises(ValueError, match="shard"):
        tune(tiny_engine, out_dir=tmp_path / "x", shard=(2, 2), **kw)


def test_tune_refuses_the_test_split(tiny_engine, tmp_path):
    from qgpm.eval.tune import tune

    with pytest.raises(ValueError, match="dev split only"):
        tune(tiny_engine, tasks=["qa_1"], lengths=[LENGTH], n=1, out_dir=tmp_path, split="test")


def test_grid_and_config_parsing(tmp_path):
    from qgpm.eval.tune import expand_grid, load_config, parse_grid

    g = parse_grid("k_sharp=1,2,8;t_sharp=0,0.5;split_layer=none")
    assert g == {"k_sharp": [1, 2, 8], "t_sharp": [0, 0.5], "split_layer": [None]}
    valid, invalid = expand_grid(g, QGPMConfig())
    assert len(valid) == 4 and len(invalid) == 2  # k_sharp=8 is not < k_broad=8
    same, _ = expand_grid(parse_grid("k_sharp=4,4.0,2"), QGPMConfig())
    assert [c.k_sharp for c in same] == [4, 2]  # 4 and 4.0 are one config
    with pytest.raises(ValueError, match=r"grid value k_sharp='abc'.*must be a number"):  # a typo is an error, found as the grid is read
        parse_grid("k_sharp=2,abc")
    with pytest.raises(ValueError, match=r"grid point \{'k_sharp': 'abc'\}"):  # a grid built in code is checked as it expands
        expand_grid({"k_sharp": ["abc"]}, QGPMConfig())
    assert parse_grid("k_sharp=9") == {"k_sharp": [9]}  # not < the default k_broad=8, but another grid field may raise k_broad
    for typo, says in (("remap=stride,strde", "remap must be 'stride'"), ("relevance=minlm", "minlm"), ("min_top_z=calibratd", "min_top_z")):
        with pytest.raises(ValueError, match=f"grid value .* is taken by no config: .*{says}"):  # a choice misspelt
            parse_grid(typo)
    assert parse_grid("moved_order=text;local_layers=vanilla") == {"moved_order": ["text"], "local_layers": ["vanilla"]}  # each valid on some base
    with pytest.raises(ValueError, match="unknown QGPMConfig field"):
        parse_grid("k_sharpp=1")
    p = tmp_path / "c.json"
    p.write_text(json.dumps(QGPMConfig(s_low=0.2).to_dict()))
    assert load_config(p, ["tau=2"]) == QGPMConfig(s_low=0.2, tau=2.0)
    assert load_config(p, ["tau=2"]).provenance == "config file c.json (initial defaults (untuned)); then overridden: tau=2"  # the file is named
    p.write_text(json.dumps({"keep_length": 0}))  # a file that sets one field: the others are QGPMConfig()'s, and the settings say so
    assert load_config(p).provenance.startswith("config file c.json; the ") and "fields it does not set: QGPMConfig() defaults" in load_config(p).provenance
    p.write_text(json.dumps({"s_low": 0.2, "provenance": 5}))
    with pytest.raises(ValueError, match="provenance must be text"):
        load_config(p)
    assert load_config(None) is None
    p.write_text(json.dumps({"config": {"s_low": 0.2, "k_sharpp": 1}}))
    with pytest.raises(ValueError, match="'k_sharpp'"):  # a misspelt key is not dropped
        load_config(p)
    p.write_text(json.dumps([0.2]))
    with pytest.raises(ValueError, match="JSON object"):
        load_config(p)


def test_config_args_are_checked_before_loading_against_every_base(tmp_path):
    """The CLI's check before the model loads: an override valid on the model's preset but not
    on the generic defaults (moved_order=text needs remap=reorder) passes, and is then built on
    the preset; one valid on no base, or on top of a file that rejects it, fails."""
    from qgpm.config import PRESETS
    from qgpm.config_files import check_config_args, load_config

    smol = next(c for c in PRESETS.values() if c.remap == "reorder")
    check_config_args(None, ["moved_order=text"])
    assert load_config(None, ["moved_order=text"], base=smol).moved_order == "text"
    with pytest.raises(ValueError, match="moved_order"):
        load_config(None, ["moved_order=text"])  # the generic defaults alone reject it
    with pytest.raises(ValueError, match="s_low"):
        check_config_args(None, ["s_low=-1"])
    with pytest.raises(ValueError, match="unknown QGPMConfig field"):
        check_config_args(None, ["k_sharpp=1"])
    p = tmp_path / "stride.json"
    p.write_text(json.dumps(QGPMConfig().to_dict()))
    with pytest.raises(ValueError, match="moved_order"):
        check_config_args(p, ["moved_order=text"])


# ----------------------------------------------------------------------------- CLI


def test_cli_parses_eval_arguments():
    from qgpm.eval.cli import build_parser, main_eval

    args = build_parser().parse_args(
        "eval --model smollm2 --tasks niah_multikey_1,qa_1 --lengths 2048,4096 --depths 0,0.25,0.5,0.75,1 --n 10 "
        "--methods vanilla,qgpm,oracle,topk,reorder --out runs/x --device cuda --dtype bfloat16 --set k_sharp=1".split())
    assert args.func is main_eval
    assert args.tasks == ["niah_multikey_1", "qa_1"] and args.lengths == [2048, 4096]
    assert args.depths == [0.0, 0.25, 0.5, 0.75, 1.0] and args.n == 10 and len(args.methods) == 5
    assert (args.device, args.dtype, args.overrides) == ("cuda", "bfloat16", ["k_sharp=1"])
    args = build_parser().parse_args(["eval", "--tasks", "all", "--depths", "random", "--out", "x"])
    assert args.tasks == list(TASKS) and args.depths is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["tune", "--split", "test", "--out", "x"])


@pytest.mark.parametrize("command", ["eval", "tune"])
@pytest.mark.parametrize("bad, message", [
    (["--n", "0"], "argument --n: must be >= 1, got 0"),
    (["--max-new-tokens", "0"], "argument --max-new-tokens: must be >= 1, got 0"),
    (["--depths", "0.5,2"], "argument --depths: depths lie in [0, 1]"),
    (["--depths", ","], "argument --depths: no depth given"),
    (["--lengths", "0,2048"], "argument --lengths: lengths are token budgets >= 1, got 0"),
    (["--lengths", ","], "argument --lengths: no length given"),
])
def test_cli_sample_arguments_out_of_range_fail_as_the_command_line_is_parsed(command, bad, message, capsys):
    """Samples a run cannot build, and a generation budget of nothing, are refused by the
    parser (exit code 2, the argument named), before any model loads."""
    from qgpm.eval.cli import build_parser

    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([command, *bad, "--out", "x"])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_cli_calibrate_writes_head_set_found_by_model_name(tiny_dir, tmp_path, monkeypatch, capsys, caplog):
    from qgpm.eval.cli import main
    from qgpm.heads import stored_head_set_path

    from transformers.utils import logging as hf_logging

    monkeypatch.setenv("QGPM_HOME", str(tmp_path / "home"))
    hf_logging.enable_progress_bar()
    try:
        assert main(["calibrate", "--model", str(tiny_dir), "--n", "2", "--holdout", "2", "--top", "3", "--lengths", "512", "--device", "cpu", "--no-progress"]) == 0
        assert not hf_logging.is_progress_bar_enabled()  # --no-progress hides transformers' weight-loading bar too
    finally:
        hf_logging.enable_progress_bar()
    text = capsys.readouterr().out
    assert "held-out fused MRR" in text and "vs random 3-head sets" in text
    # a weak threshold's advice is said once: in the logged warning, not again in the summary
    assert "calibrate on more samples" in caplog.text and "calibrate on more samples" not in text
    assert "(weak: see the warning above)" in text
    path = stored_head_set_path(tiny_dir.name)
    assert path is not None and str(path).startswith(str(tmp_path / "home"))
    engine = QGPM.from_pretrained(str(tiny_dir))
    assert len(engine.heads) == 3


def test_cli_calibrate_shallow_tolerance_records_both_sets_and_keeps_by_the_numbers(tiny_dir, tmp_path, capsys):
    """--shallow-tolerance: the best set in the lower half of the layers against the best
    unrestricted set, on the held-out samples; tolerance 1 always keeps the shallow set (every
    head in layers < n_layers // 2), tolerance 0 keeps it only when it is not worse."""
    from qgpm.eval.cli import main
    from qgpm.heads import HeadSet

    n_layers = QGPM.from_pretrained(str(tiny_dir), heads=[(0, 0)]).n_layers
    for tol in ("1", "0"):
        out = tmp_path / f"heads_{tol}.json"
        assert main(["calibrate", "--model", str(tiny_dir), "--n", "2", "--holdout", "2", "--top", "3", "--lengths", "512",
                     "--device", "cpu", "--no-progress", "--shallow-tolerance", tol, "--out", str(out)]) == 0
        hs = HeadSet.load(out)
        sh = hs.meta["shallow"]
        assert sh["max_layer"] == n_layers // 2 and all(l < n_layers // 2 for l, _ in sh["shallow_heads"])
        want = "shallow" if sh["shallow_holdout_fused_mrr"] >= sh["unrestricted_holdout_fused_mrr"] - float(tol) else "unrestricted"
        assert sh["kept"] == want
        assert [list(h) for h in hs.heads] == sh[f"{want}_heads"]
        assert hs.meta["holdout_fused_mrr"] == sh[f"{want}_holdout_fused_mrr"]
        if tol == "1":
            assert want == "shallow"
        assert f"kept the {want} set" in capsys.readouterr().out
    out = tmp_path / "capped.json"
    assert main(["calibrate", "--model", str(tiny_dir), "--n", "2", "--holdout", "0", "--top", "2", "--lengths", "512",
                 "--device", "cpu", "--no-progress", "--max-layer", "1", "--out", str(out)]) == 0
    assert all(l == 0 for l, _ in HeadSet.load(out).heads)


def test_cli_calibrate_scores_from_reuses_stored_scores_and_shallow_bound_sets_the_depth(tiny_dir, tmp_path, capsys, monkeypatch):
    """--scores-from: the per-head MRRs of an earlier calibration pick the heads (no sample
    is scored again, only the held-out check runs); --shallow-bound moves the shallow set's
    layer bound, and the stored set records both sets and where its scores came from."""
    import qgpm.calibrate as cal
    from qgpm.calibrate import HeadScores
    from qgpm.eval.cli import main
    from qgpm.heads import HeadSet

    first = tmp_path / "first.json"
    assert main(["calibrate", "--model", str(tiny_dir), "--n", "2", "--holdout", "0", "--top", "3", "--lengths", "512",
                 "--device", "cpu", "--no-progress", "--out", str(first)]) == 0
    stored = HeadScores.from_head_set(HeadSet.load(first))

    def no_scoring(*a, **k):
        raise AssertionError("--scores-from must not score the calibration samples again")

    monkeypatch.setattr(cal, "score_heads", no_scoring)
    out = tmp_path / "again.json"
    assert main(["calibrate", "--model", str(tiny_dir), "--holdout", "2", "--top", "3", "--lengths", "512", "--device", "cpu",
                 "--no-progress", "--scores-from", str(first), "--shallow-tolerance", "1", "--shallow-bound", "1",
                 "--out", str(out)]) == 0
    hs = HeadSet.load(out)
    sh = hs.meta["shallow"]
    assert sh["max_layer"] == 1 and sh["kept"] == "shallow"  # tolerance 1 always keeps it
    assert [tuple(h) for h in sh["unrestricted_heads"]] == stored.best(3)
    assert [tuple(h) for h in hs.heads] == stored.best(3, max_layer=1) and all(l == 0 for l, _ in hs.heads)
    assert hs.meta["per_head_mrr"] == HeadSet.load(first).meta["per_head_mrr"] and hs.samples == 2
    assert hs.meta["scores_from"]["path"] == str(first) and "layers < 1" in hs.method
    assert "kept the shallow set" in capsys.readouterr().out
    assert hs.meta["confidence"]["samples"] == 2  # the flat-relevance threshold, from the held-out samples (scores were reused)
    # --holdout 0 scores no sample: the same heads keep the threshold measured with them, and the CLI says which
    earlier = HeadSet.load(first)
    earlier.meta["confidence"] = {**earlier.meta["confidence"], "min_top_z": 1.23, "youden_j": 0.5}  # as a set with evidence stores it
    with_threshold = earlier.save(tmp_path / "with_threshold.json")
    same = tmp_path / "same.json"
    capsys.readouterr()
    assert main(["calibrate", "--model", str(tiny_dir), "--holdout", "0", "--top", "3", "--lengths", "512", "--device", "cpu",
                 "--no-progress", "--scores-from", str(with_threshold), "--out", str(same)]) == 0
    kept = HeadSet.load(same).meta["confidence"]
    assert kept["min_top_z"] == 1.23 and kept["from"] == str(with_threshold)
    assert "confidence threshold (min_top_z='calibrated'): 1.23 in this model's z units" in capsys.readouterr().out
    other = tmp_path / "other.json"  # other heads: the threshold is not theirs, and none is stored
    assert main(["calibrate", "--model", str(tiny_dir), "--holdout", "0", "--top", "2", "--lengths", "512", "--device", "cpu",
                 "--no-progress", "--scores-from", str(with_threshold), "--out", str(other)]) == 0
    assert HeadSet.load(other).meta["confidence"]["min_top_z"] is None
    assert "confidence threshold: none stored" in capsys.readouterr().out


def test_calibration_keeps_to_the_window_and_says_what_its_threshold_rests_on(tiny_engine, tiny_dir, tmp_path, monkeypatch, capsys, caplog):
    import qgpm.samples
    from qgpm.calibrate import HeadScores, calibrate_heads, confidence_summary, fitting_lengths
    from qgpm.eval.cli import main

    with caplog.at_level("WARNING", logger="qgpm"):
        assert fitting_lengths((1024, 2048), 4096) == [1024, 2048] and fitting_lengths((1024, 2048), 0) == [1024, 2048]
        assert not caplog.records  # nothing changed, nothing said
        assert fitting_lengths((1024, 2048), 1500) == [1024] and fitting_lengths((1024, 2048), 512) == [512]
    assert [r.getMessage() for r in caplog.records][-1] == "qgpm: calibration samples of [512] tokens (not [1024, 2048]): the model's window is 512 tokens"
    caplog.clear()
    # the CLI refuses lengths beyond the window before it builds a sample
    import qgpm.eval.cli as eval_cli

    monkeypatch.setattr(eval_cli, "calibration_samples", lambda *a, **k: pytest.fail("a sample was built"))
    assert main(["calibrate", "--model", str(tiny_dir), "--lengths", "512,99999", "--device", "cpu", "--no-progress",
                 "--out", str(tmp_path / "x.json")]) == 2
    assert "calibration samples of [99999] tokens do not fit" in capsys.readouterr().err
    monkeypatch.undo()
    # no --lengths: the default lengths the window holds (a 700-token window: one of 700)
    real = qgpm.samples.calibration_samples
    built = []
    monkeypatch.setattr(eval_cli, "calibration_samples", lambda tok, **k: built.append(k["lengths"]) or real(tok, n=2, lengths=k["lengths"]))
    monkeypatch.setattr(type(tiny_engine), "max_length", property(lambda self: 700))
    monkeypatch.setattr(eval_cli, "_engine", lambda *a, **k: tiny_engine)
    assert main(["calibrate", "--model", str(tiny_dir), "--n", "2", "--holdout", "0", "--top", "2", "--device", "cpu", "--no-progress",
                 "--out", str(tmp_path / "y.json")]) == 0
    assert built == [[700]]
    monkeypatch.undo()
    # heads="calibrate" on a model whose window is shorter than the default lengths: samples that fit
    seen = []
    monkeypatch.setattr(qgpm.samples, "calibration_samples", lambda tok, **k: seen.append(k.get("lengths")) or real(tok, n=2, lengths=k["lengths"]))
    monkeypatch.setattr(type(tiny_engine), "max_length", property(lambda self: 700))
    tiny_engine.set_heads("calibrate")
    assert seen == [[700]]
    with pytest.raises(ValueError, match="calibration samples of \\[1024\\] tokens do not fit .* window of 700 tokens"):
        calibrate_heads(tiny_engine, real(tiny_engine.tokenizer, n=1, lengths=[1024]), progress=False)
    monkeypatch.undo()
    # more heads asked for than there are: all kept, said
    with caplog.at_level("WARNING", logger="qgpm"):
        assert len(HeadScores(torch.zeros(2, 2), 1).best(10)) == 4
    assert any("top=10 asks for more heads than the 4 there are" in r.getMessage() for r in caplog.records)
    # the threshold's record, said in one sentence
    weak = {"min_top_z": 1.4, "youden_j": 0.14, "found_top_z": [1.5, 2.0, 2.2], "missed_top_z": [0.5] * 21}
    assert "3 of 24 scored samples had their evidence ranked first. A weak separation" in confidence_summary(weak)
    said_once = confidence_summary(weak, advice=False)  # the CLI's line after calibrate_heads logged the advice
    assert said_once.endswith("(weak: see the warning above)") and "calibrate on more samples" not in said_once
    strong = {"min_top_z": 1.4, "youden_j": 0.9, "found_top_z": [2.0] * 10, "missed_top_z": [0.5] * 10}
    assert "weak" not in confidence_summary(strong)
    none = {"min_top_z": None, "found_top_z": [], "missed_top_z": [0.75, 0.97]}
    assert "the ranking put no sample's evidence first (0 of 2 scored samples" in confidence_summary(none)
    assert "give --holdout" in confidence_summary({"min_top_z": None, "found_top_z": [], "missed_top_z": []})


def test_calibrate_heads_rejects_samples_beside_stored_scores(tiny_dir):
    """Samples given with stored scores would go unscored: an error, not a silent choice."""
    import torch

    from qgpm.calibrate import HeadScores, calibrate_heads

    engine = QGPM.from_pretrained(str(tiny_dir), heads=[(0, 0)])
    scores = HeadScores(torch.rand(engine.n_layers, engine.model.config.num_attention_heads), 2)
    with pytest.raises(ValueError, match="pass one of them"):
        calibrate_heads(engine, ["not scored"], scores=scores, progress=False)
    assert calibrate_heads(engine, [], scores=scores, top=2, progress=False).heads == scores.best(2)


def test_scores_from_another_model_shape_is_rejected(tiny_dir, tmp_path, capsys):
    from qgpm.eval.cli import main
    from qgpm.heads import HeadSet

    bad = HeadSet(model="other", heads=[(0, 0)], mrr=[0.5], random_mrr=None, method="hand", samples=1,
                  meta={"per_head_mrr": [[0.1, 0.2]]}, fingerprint={})
    path = bad.save(tmp_path / "other.json")
    assert main(["calibrate", "--model", str(tiny_dir), "--holdout", "1", "--lengths", "512", "--device", "cpu",
                 "--no-progress", "--scores-from", str(path), "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "(1, 2) (layers, heads)" in err and "another model" in err
    assert not (tmp_path / "x.json").exists()
    nothing = HeadSet(model="m", heads=[(0, 0)], mrr=[0.5], random_mrr=None, method="hand", samples=1, meta={}, fingerprint={})
    assert main(["calibrate", "--model", str(tmp_path / "never_loaded"), "--no-progress",
                 "--scores-from", str(nothing.save(tmp_path / "hand.json"))]) == 2
    assert "stores no per-head MRRs" in capsys.readouterr().err


@pytest.mark.parametrize("extra, says", [
    (["--shallow-tolerance", "0.05", "--holdout", "0"], "--holdout > 0"),
    (["--shallow-tolerance", "0.05", "--max-layer", "2"], "not both"),
    (["--shallow-tolerance", "2"], "in [0, 1]"),
    (["--max-layer", "0"], ">= 1"),
    (["--shallow-bound", "3"], "give shallow_tolerance too"),
    (["--scores-from", "x.json", "--n", "4"], "give one of them"),
    (["--shallow-tolerance", "0.05", "--shallow-bound", "0"], "shallow_bound must be >= 1"),
    (["--out", "."], "--out . is a folder: give the head-set file to write"),
])
def test_cli_calibrate_rejects_bad_depth_options_before_loading(extra, says, tmp_path, capsys):
    from qgpm.eval.cli import main

    missing = tmp_path / "no_such_model"  # never loaded: the check comes first
    rc = main(["calibrate", "--model", str(missing), "--no-progress", *extra])
    assert rc == 2 and says in capsys.readouterr().err


def test_cli_eval_and_report_on_a_saved_model(tiny_dir, tmp_path):
    from qgpm.eval.cli import main

    out = tmp_path / "run"
    rc = main(["eval", "--model", str(tiny_dir), "--heads", "1:0,2:1", "--tasks", "qa_1", "--lengths", str(LENGTH), "--depths", "0.5",
               "--n", "1", "--methods", "vanilla,qgpm", "--max-new-tokens", str(NEW), "--out", str(out), "--device", "cpu",
               "--dtype", "float32", "--no-progress", "--no-logprob", "--set", "k_sharp=1", "--set", "relevance=heads"])
    assert rc == 0
    rows = _rows(out)
    assert [r["method"] for r in rows] == ["vanilla", "qgpm"] and rows[0]["logprob_gold"] is None
    man = json.loads((out / "manifest.json").read_text())
    assert man["latest"]["config"]["k_sharp"] == 1.0 and " eval --model " in man["latest"]["command"]
    (out / "report.md").unlink()
    assert main(["report", "--out", str(out)]) == 0 and (out / "report.md").is_file()
    assert main(["report", "--out", str(out), "--baseline", "nope"]) == 2  # no such method in the rows: one line, exit 2
    # a call that falls back reuses pass 1's prefill unless --no-reuse-prefill; the manifest says which
    runs = {}
    for name, extra in (("on", []), ("off", ["--no-reuse-prefill"]), ("bf16", ["--set", "pass1_dtype=bfloat16"])):
        runs[name] = tmp_path / name
        assert main(["eval", "--model", str(tiny_dir), "--heads", "1:0,2:1", "--tasks", "qa_1", "--lengths", str(LENGTH), "--depths", "0.5",
                     "--n", "1", "--methods", "qgpm", "--max-new-tokens", str(NEW), "--out", str(runs[name]), "--device", "cpu",
                     "--dtype", "float32", "--no-progress", "--no-logprob", "--set", "min_top_z=1e6", "--set", "relevance=heads", *extra]) == 0
    on, off = _rows(runs["on"])[0], _rows(runs["off"])[0]
    assert on["prefill_reused"] == on["prompt_tokens"] - 1 and off["prefill_reused"] == 0 and on["answer"] == off["answer"]
    assert [json.loads((runs[n] / "manifest.json").read_text())["latest"]["reuse_prefill"] for n in ("on", "off")] == [True, False]
    # a bfloat16 pass 1 never reuses, answers as the full pass 2, and is its own config
    bf = _rows(runs["bf16"])[0]
    assert bf["prefill_reused"] == 0 and bf["answer"] == off["answer"] and bf["config_hash"] != on["config_hash"] == off["config_hash"]
    man = json.loads((runs["bf16"] / "manifest.json").read_text())
    assert man["latest"]["config"]["pass1_dtype"] == "bfloat16" and man["configs"][bf["config_hash"]]["pass1_precision"] == "bfloat16"


def test_only_answers_the_named_samples_and_refuses_unknown_ones(tiny_engine, tmp_path):
    from qgpm.eval.cli import main
    from qgpm.eval.work import read_sample_ids

    ids = tmp_path / "ids.jsonl"
    ids.write_text(json.dumps({"task": "niah_multikey_1", "length": LENGTH, "depth": 1.0, "index": 1, "note": "extra keys are fine"}) + "\n\n")
    assert read_sample_ids(ids) == [("niah_multikey_1", LENGTH, 1.0, 1)]
    out = _run(tiny_engine, tmp_path / "run", methods=["vanilla"], n=2, only=read_sample_ids(ids))
    assert [(r["depth"], r["index"]) for r in _rows(out)] == [(1.0, 1)]
    with pytest.raises(ValueError, match="outside this run"):
        _run(tiny_engine, tmp_path / "run2", methods=["vanilla"], n=1, only=read_sample_ids(ids))  # index 1 needs n >= 2
    assert not (tmp_path / "run2" / "rows.jsonl").exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task": "qa_1", "length": 512}\n')
    with pytest.raises(ValueError, match="line 1: expected a JSON object with task, length, depth and index"):
        read_sample_ids(bad)
    assert main(["eval", "--model", str(tmp_path / "never_loaded"), "--tasks", "qa_1", "--out", str(tmp_path / "r3"), "--only", str(bad)]) == 2


def test_eval_refuses_what_it_can_check_before_the_model_loads(tmp_path, monkeypatch, capsys):
    import qgpm.eval.cli as eval_cli

    monkeypatch.setattr(eval_cli, "_engine_and_config", lambda *a, **k: pytest.fail("the model loaded"))
    ids = tmp_path / "ids.jsonl"
    ids.write_text(json.dumps({"task": "qa_1", "length": 1024, "depth": 0.5, "index": 5}) + "\n")
    tested = tmp_path / "tested"
    tested.mkdir()
    (tested / "rows.jsonl").write_text(json.dumps({"task": "qa_1", "length": 1024, "depth": 0.5, "seed": 0, "split": "test", "method": "vanilla",
                                                   "config_hash": "x", "correct": True}) + "\n")
    base = ["eval", "--tasks", "qa_1", "--lengths", "1024", "--depths", "0.5", "--n", "1", "--no-progress"]
    for extra, out, said in ((["--methods", "topk", "--reranker", "bogus"], "a", "unknown reranker 'bogus'"),
                             (["--methods", "topk", "--k", "0"], "b", "k must be >= 1"),
                             (["--methods", "vanilla", "--only", str(ids)], "c", "outside this run"),
                             (["--methods", "vanilla", "--split", "dev"], "tested", "holds rows of the test split and this run is on dev"),
                             (["--methods", "vanilla", "--vllm-timeout", "5"], "d", "--vllm-timeout only apply with --vllm-url"),
                             (["--methods", "vanilla", "--vllm-url", "http://127.0.0.1:9", "--vllm-timeout", "-5"], "e",
                              "--vllm-timeout must be a positive number of seconds, got -5.0")):
        assert eval_cli.main([*base, *extra, "--out", str(tmp_path / out)]) == 2
        assert said in capsys.readouterr().err
        assert out == "tested" or not (tmp_path / out).exists()  # no folder left behind
    assert eval_cli.main(["tune", "--tasks", "qa_1", "--lengths", "1024", "--n", "1", "--grid", "k_sharp=abc", "--out", str(tmp_path / "t")]) == 2
    assert "grid value k_sharp='abc'" in capsys.readouterr().err


def test_eval_refuses_lengths_beyond_the_window_before_any_answer(tiny_engine, tmp_path):
    out = _run(tiny_engine, tmp_path / "run", methods=["vanilla"], n=1, depths=[0.5])
    with pytest.raises(ValueError, match=f"longer than the model's window of {tiny_engine.max_length} tokens"):
        _run(tiny_engine, out, methods=["vanilla"], n=1, lengths=[tiny_engine.max_length + 1], resume=False)
    assert len(_rows(out)) == 1  # refused before --no-resume cleared the folder
    # the samples a run answers decide: a longer length that --only leaves out is no reason to refuse
    only = [("niah_multikey_1", LENGTH, 0.5, 0)]
    _run(tiny_engine, tmp_path / "only", methods=["vanilla"], n=1, depths=[0.5], lengths=[LENGTH, tiny_engine.max_length + 1], only=only)
    # reranker=None is the default reranker, as before
    _run(tiny_engine, tmp_path / "none", methods=["topk"], n=1, depths=[0.5], reranker=None)


@pytest.mark.skipif(shutil.which("accelerate") is None and not (Path(sys.executable).parent / "accelerate").exists(), reason="accelerate CLI missing")
def test_two_process_accelerate_run_merges(tiny_dir, tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2` on CPU (gloo): each process writes its
    rank file, the main process merges. (`--cpu` alone starts a single process.)"""
    exe = shutil.which("accelerate") or str(Path(sys.executable).parent / "accelerate")
    out = tmp_path / "run"
    cmd = [exe, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
           "--dynamo_backend", "no", "--main_process_port", "29631", "-m", "qgpm.eval.cli", "eval", "--model", str(tiny_dir),
           "--heads", "1:0", "--tasks", "niah_multikey_1", "--lengths", str(LENGTH), "--depths", "0,0.5,1", "--n", "1",
           "--methods", "vanilla,qgpm", "--max-new-tokens", str(NEW), "--out", str(out), "--device", "cpu", "--no-progress"]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0 = [json.loads(x) for x in (out / "rows.rank0.jsonl").read_text().splitlines()]
    r1 = [json.loads(x) for x in (out / "rows.rank1.jsonl").read_text().splitlines()]
    assert len(r0) == 4 and len(r1) == 2  # items 0, 2 -> rank 0; item 1 -> rank 1
    assert {r["depth"] for r in r0} == {0.0, 1.0} and {r["depth"] for r in r1} == {0.5}
    rows = _rows(out)
    assert len(rows) == 6 and [r["depth"] for r in rows if r["method"] == "vanilla"] == [0.0, 0.5, 1.0]
    assert json.loads((out / "manifest.json").read_text())["latest"]["processes"] == 2
    assert (out / "report.md").is_file()
    # same answers as a single process
    engine = QGPM.from_pretrained(str(tiny_dir), heads=[(1, 0)])
    single = _run(engine, tmp_path / "single", depths=[0.0, 0.5, 1.0], methods=["vanilla", "qgpm"])
    assert [(r["answer"], r["config_hash"]) for r in _rows(single)] == [(r["answer"], r["config_hash"]) for r in rows]


# ----------------------------------------------------------------------------- real model


@pytest.mark.real_model
def test_real_model_smoke_every_task(tmp_path):
    from qgpm.heads import stored_head_set_path
    from qgpm.loading import DEFAULT_MODEL_NAME

    heads = None if stored_head_set_path(DEFAULT_MODEL_NAME) else FALLBACK_HEADS
    engine = QGPM.from_pretrained(heads=heads)
    out = run_eval(engine, tasks=list(TASKS), lengths=[1024], depths=None, n=1, methods=["vanilla", "qgpm"],
                   out_dir=tmp_path / "smoke", progress=False, on_error="raise", logprob=False)
    rows = _rows(out)
    assert len(rows) == 2 * len(TASKS)
    assert {r["task"] for r in rows} == set(TASKS)
    for r in rows:
        assert r["prompt_tokens"] + r["max_new_tokens"] <= 1024
        assert r["answer"] is not None and r["answer_tokens"] >= 1
    for r in rows:
        if r["method"] == "qgpm":
            assert r["top_sentences"] and r["evidence_rank"] is not None
    # a 1K prompt is easy for SmolLM2 on some tasks: a harness bug that scores nothing fails here
    assert sum(r["correct"] for r in rows) >= 2
    assert "## Accuracy" in (out / "report.md").read_text()


def test_targets_and_diagnosis_on_hand_made_rows(tmp_path):
    from qgpm.eval.targets import check_targets, diagnose

    rows = _hand_rows()
    for r in rows:
        r["answer"] = f"answer {r['correct']}"
        if r["method"] == "qgpm":
            r["evidence_rank"] = 0 if r["seed"] < 10 else 3
    rows += [dict(r, method="oracle", config_hash="o0", correct=True, score=1.0) for r in rows if r["method"] == "vanilla"]
    for i in range(4):  # a guard task where qgpm equals vanilla
        base = dict(task="qa_1", length=1024, depth=0.5, seed=100 + i, index=i, split="test", score=1.0, correct=i % 2 == 0, logprob_gold=-1.0)
        rows += [dict(base, method=m, config_hash=m[0] + "0") for m in ("vanilla", "qgpm", "oracle")]
    checks = {(c.task, c.target.split(":")[0] if ":" in c.target else c.target, c.threshold): c for c in check_targets(rows, n_boot=2000)}
    gain = checks[("niah_multikey_1", "retrieval", "≥ +10")]
    assert gain.pairs == 20 and gain.value == pytest.approx(40.0) and gain.met
    mid = checks[("niah_multikey_1", "retrieval", "McNemar p < 0.05, b > c")]
    assert mid.pairs == 10 and "b/c = 4/1" in mid.detail and mid.met is False  # odd seeds are the 0.5-depth samples
    assert checks[("niah_multikey_1", "qgpm − oracle ≥ −2 pts", "≥ −2")].value == pytest.approx(-25.0)
    assert checks[("niah_multikey_1", "qgpm − oracle ≥ −2 pts", "≥ −2")].met is False
    guard = checks[("qa_1", "guard", "≥ −1")]
    assert guard.value == 0.0 and guard.met
    d = {x["task"]: x for x in diagnose(rows, n_boot=2000)}["niah_multikey_1"]
    assert d["evidence_top1"] == 0.5 and d["evidence_mrr"] == pytest.approx((10 * 1 + 10 * 0.25) / 20)
    assert d["oracle_delta"] == pytest.approx(65.0) and d["same_answer"] == pytest.approx(0.5)  # same text iff same outcome here
    # seeds 0-9: 6 both right, 4 qgpm only -> +40; seeds 10-19: 5 qgpm only, 1 vanilla only, 4 both wrong -> +40
    assert d["n_top1"] == 10 and d["qgpm_delta_top1"] == pytest.approx(40.0) and d["qgpm_delta_rest"] == pytest.approx(40.0)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = report(tmp_path, plots=False).read_text()
    assert "## Targets" in text and "## Diagnosis: relevance signal vs position remapping" in text
    assert "| 0.5 | 43 (14) |" in text  # all tasks by depth: vanilla at 0.5 = 4/10 multikey + 2/4 qa
    assert json.loads((tmp_path / "stats.json").read_text())["targets"]


def test_targets_judge_every_qgpm_config_against_the_named_baseline(tmp_path):
    from qgpm.eval.targets import judged_series, targets_and_diagnosis

    rows = _hand_rows()
    rows += [dict(r, config_hash="q1", correct=True, score=1.0) for r in rows if r["method"] == "qgpm"]  # a second qgpm config
    rows += [dict(r, method="reorder", config_hash="r0") for r in rows if r["method"] == "vanilla"]
    triples, skipped = judged_series(rows)
    assert skipped is None and [m for m, _, _ in triples] == ["qgpm@q0", "qgpm@q1"] and {b for _, b, _ in triples} == {"vanilla"}
    checks, diag, _ = targets_and_diagnosis(rows, n_boot=200)
    gains = {c.target: c.value for c in checks if c.target.startswith("retrieval") and "all depths" in c.target}
    assert gains == {"retrieval: qgpm@q0 − vanilla ≥ +10 pts (all depths)": pytest.approx(40.0),
                     "retrieval: qgpm@q1 − vanilla ≥ +10 pts (all depths)": pytest.approx(65.0)}
    assert [d["series"] for d in diag] == ["qgpm@q0", "qgpm@q1"]
    checks, _, _ = targets_and_diagnosis(rows, baseline="reorder", n_boot=200)
    assert checks and all("reorder" in c.target and "vanilla" not in c.target for c in checks)  # named after their baseline
    rows += [dict(r, config_hash="v1") for r in rows if r["method"] == "vanilla"]  # which vanilla? not guessed
    checks, diag, skipped = targets_and_diagnosis(rows, n_boot=200)
    assert checks == [] and diag == [] and "vanilla ran with 2 configs here (vanilla@v0, vanilla@v1)" in skipped
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "Targets and diagnosis skipped" in report(tmp_path, plots=False, n_boot=200).read_text()
    rows = [r for r in rows if r["config_hash"] != "v1"]
    rows += [dict(r, method="oracle", config_hash=h) for r in rows if r["method"] == "vanilla" for h in ("o0", "o1")]
    checks, diag, note = targets_and_diagnosis(rows, n_boot=200)  # two Oracle configs: judged without the Oracle
    assert checks and not any("oracle" in c.target for c in checks) and "oracle@o0, oracle@o1" in note


def test_plain_text_models_answer_with_their_first_paragraph(tiny_engine, tokenizer, monkeypatch):
    """A model without a chat template has no end of turn: the harness stops its answer at the
    first blank line, and the stop rule is part of the rows' config hash (chat models' hashes
    do not carry it)."""
    import copy

    plain_tok = copy.deepcopy(tokenizer)
    plain_tok.chat_template = None
    plain = QGPM(tiny_engine.model, plain_tok, heads=HEADS, name="tiny-llama")
    assert answer_stop(tiny_engine) == ()
    assert answer_stop(plain) == ("\n\n",)
    assert "stop" not in method_fingerprint(tiny_engine, "vanilla")
    assert method_fingerprint(plain, "vanilla")["stop"] == ["\n\n"]

    seen = []
    real = plain.generate_prepared
    monkeypatch.setattr(plain, "generate_prepared", lambda call, **kw: seen.append(kw.get("stop")) or real(call, **kw))
    s = generate("niah_single_2", n=1, length=LENGTH, tokenizer=plain_tok, seed=0, max_new_tokens=NEW)[0]
    got = answer_sample(plain, s, "vanilla", logprob=False)
    assert seen == [("\n\n",)]
    ref = plain.answer(s.context, s.question, max_new_tokens=s.max_new_tokens, instruction=s.instruction, template=s.template,
                       answer_prefix=s.answer_prefix, stop=["\n\n"])
    assert got["answer"] == ref.text


def test_an_unreadable_manifest_stops_the_run_instead_of_being_overwritten(tmp_path):
    from qgpm.eval.rows import read_manifest, update_manifest

    assert read_manifest(tmp_path) == {}
    update_manifest(tmp_path, {"command": "first"}, {"abc": {"method": "vanilla"}})
    assert read_manifest(tmp_path)["runs"] == [{"command": "first"}]
    cut = (tmp_path / "manifest.json").read_text()[:-20]
    (tmp_path / "manifest.json").write_text(cut)
    with pytest.raises(ValueError, match="manifest.json is not valid JSON"):
        update_manifest(tmp_path, {"command": "second"}, {})
    assert (tmp_path / "manifest.json").read_text() == cut  # left as it was, for its owner to restore
    from qgpm.eval.runner import run_eval

    with pytest.raises(ValueError, match="manifest.json is not valid JSON"):  # before any model loads
        run_eval(model="/no/such/model", tasks=["niah_single_2"], lengths=[1024], n=1, methods=["vanilla"], out_dir=tmp_path)
    (tmp_path / "manifest.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="holds a JSON list"):
        read_manifest(tmp_path)


def test_no_resume_on_a_manual_shard_answers_its_samples_again(tiny_engine, tmp_path, monkeypatch):
    """--no-resume --shard 0/2 after both shards were merged: shard 0's samples run again
    (their merged rows do not count as done); shard 1's rows are left alone."""
    out = tmp_path / "run"
    _run(tiny_engine, out, methods=["vanilla"], depths=[0.0, 0.5, 1.0], shard=(0, 2), write_report=False)
    _run(tiny_engine, out, methods=["vanilla"], depths=[0.0, 0.5, 1.0], shard=(1, 2))
    answered = []
    real = runner_mod.answer_sample

    def spy(engine, sample, method, **kw):
        answered.append(sample.depth)
        return real(engine, sample, method, **kw)

    monkeypatch.setattr(runner_mod, "answer_sample", spy)
    _run(tiny_engine, out, methods=["vanilla"], depths=[0.0, 0.5, 1.0], shard=(0, 2), resume=False)
    assert sorted(answered) == [0.0, 1.0]
    assert [r["depth"] for r in _rows(out)] == [0.0, 0.5, 1.0]


def test_a_torn_last_line_does_not_swallow_the_next_row(tiny_engine, tmp_path):
    """A run killed mid-write leaves half a row; the resumed run's first row starts on a new line."""
    from qgpm.eval.rows import rank_file

    out = tmp_path / "run"
    _run(tiny_engine, out, methods=["vanilla"], depths=[0.0, 0.5, 1.0], shard=(0, 1), write_report=False)
    path = rank_file(out, 0)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + lines[1][:40])  # row 0 whole, row 1 torn, row 2 never written
    (out / "rows.jsonl").unlink(missing_ok=True)  # killed before the rows were merged
    _run(tiny_engine, out, methods=["vanilla"], depths=[0.0, 0.5, 1.0], shard=(0, 1), write_report=False)
    valid = []
    for line in path.read_text().splitlines():
        try:
            valid.append(json.loads(line)["depth"])
        except ValueError:
            pass  # the torn line, on its own
    assert sorted(valid) == [0.0, 0.5, 1.0]


def test_each_series_is_paired_with_the_baseline_run_as_it_was(caplog):
    """Two vanilla configs (with and without a stop string): a series made without the stop is
    paired with the vanilla made without it, whatever order the configs come in."""
    from qgpm.eval.stats import group_paired

    rows = []
    for i in range(4):
        base = dict(task="niah_multikey_1", length=1024, depth=0.5, seed=i, index=i, split="test")
        rows.append(dict(base, method="vanilla", config_hash="aaa", correct=False, score=0.0))  # with the stop: all wrong
        rows.append(dict(base, method="vanilla", config_hash="bbb", correct=True, score=1.0))  # without: all right
        rows.append(dict(base, method="qgpm", config_hash="qqq", correct=True, score=1.0))
    fp = {"model": "m", "dtype": "float32", "max_new_tokens": 48, "haystack": None}
    configs = {"aaa": dict(fp, method="vanilla", stop=["\n\n"]), "bbb": dict(fp, method="vanilla"), "qqq": dict(fp, method="qgpm", config={})}
    got = group_paired(rows, ("task", "length"), configs=configs)
    (key, p), = got.items()
    assert key[-1] == "qgpm" and (p.b, p.c, p.base_acc) == (0, 0, 1.0)
    with caplog.at_level("WARNING", logger="qgpm"):
        blind = group_paired(rows, ("task", "length"))  # without the fingerprints: the first vanilla config, said
    assert next(iter(blind.values())).b == 4
    assert any("qgpm is paired with vanilla@aaa" in r.getMessage() and "no fingerprints given" in r.getMessage() for r in caplog.records)


def test_a_series_is_paired_with_the_baseline_config_of_its_own_budget_whatever_the_baseline_method(tiny_engine, tmp_path, capsys):
    from qgpm.eval.cli import main
    from qgpm.eval.hashes import method_fingerprint
    from qgpm.eval.stats import METHOD_FIELDS, base_for

    common = set(method_fingerprint(tiny_engine, "vanilla"))
    for method in ALL_METHODS:  # what pairing skips is exactly what some methods record and vanilla does not
        assert set(method_fingerprint(tiny_engine, method)) - common <= METHOD_FIELDS, method
    fp = {"model": "m", "dtype": "float32", "haystack": None}
    configs = {"t24": dict(fp, method="topk", max_new_tokens=24, reranker="minilm", k=5), "t16": dict(fp, method="topk", max_new_tokens=16, reranker="minilm", k=5),
               "v16": dict(fp, method="vanilla", max_new_tokens=16)}
    labels = {("topk", "t24"): "topk@t24", ("topk", "t16"): "topk@t16", ("vanilla", "v16"): "vanilla"}
    assert base_for("vanilla", ["topk@t24", "topk@t16"], labels, configs) == "topk@t16"  # not the first: the same budget
    configs.update(k10=dict(configs["t24"], k=10), r10=dict(fp, method="reorder", max_new_tokens=24, reranker="minilm", k=10))
    labels.update({("topk", "k10"): "topk@k10", ("reorder", "r10"): "reorder"})
    assert base_for("reorder", ["topk@t24", "topk@k10"], labels, configs) == "topk@k10"  # a field both methods record counts
    out = _run(tiny_engine, tmp_path / "run", methods=["vanilla", "topk"], max_new_tokens=NEW)
    _run(tiny_engine, out, methods=["vanilla", "topk"], max_new_tokens=NEW + 1)
    label = next(lab for lab in (out / "report.md").read_text().split("series: ", 1)[1].split(";")[0].split(", ") if lab.startswith("topk@"))
    assert main(["report", "--out", str(out), "--baseline", label, "--no-plots"]) == 0  # the label the report prints is accepted
    assert main(["report", "--out", str(out), "--baseline", "topk@nope00", "--no-plots"]) == 2
    assert "its series: topk@" in capsys.readouterr().err


def test_a_series_paired_with_the_only_baseline_run_otherwise_is_said(caplog):
    from qgpm.eval.stats import base_for

    fp = {"model": "m", "dtype": "float32", "haystack": None}
    configs = {"q3": dict(fp, method="qgpm", max_new_tokens=3, config={"keep_length": 0}), "v128": dict(fp, method="vanilla", max_new_tokens=128),
               "q128": dict(fp, method="qgpm", max_new_tokens=128, config={})}
    labels = {("qgpm", "q3"): "qgpm@q3", ("qgpm", "q128"): "qgpm@q128", ("vanilla", "v128"): "vanilla"}
    with caplog.at_level("WARNING", logger="qgpm"):
        assert base_for("qgpm@q128", ["vanilla"], labels, configs) == "vanilla"
        assert "other settings" not in caplog.text  # run as the series was
        assert base_for("qgpm@q3", ["vanilla"], labels, configs) == "vanilla"
    assert "qgpm@q3 is paired with vanilla, which was run with other settings (max_new_tokens differ)" in caplog.text


def test_rows_of_one_question_are_one_content():
    """NoLiMa seeds that draw the same question cluster as one content in the sign-flip test;
    rows without a question_id cluster by seed, as before."""
    from qgpm.eval.stats import content_of, paired

    def rows(method, ok, qid=True):
        out = []
        for seed in range(4):
            for depth in (0.0, 1.0):
                r = dict(task="nolima_direct", length=4096, depth=depth, seed=seed, index=seed, method=method, config_hash=method,
                         correct=ok)
                if qid:
                    r["question_id"] = seed % 2  # seeds 0 and 2 ask one question, 1 and 3 another
                out.append(r)
        return out

    by_question = paired(rows("qgpm", True), rows("vanilla", False))
    by_seed = paired(rows("qgpm", True, qid=False), rows("vanilla", False, qid=False))
    assert (by_question.contents, by_seed.contents) == (2, 4)
    assert by_question.content_p == pytest.approx(2 / 4) and by_seed.content_p == pytest.approx(2 / 16)
    assert content_of({"task": "qa_1", "seed": 7}) == ("qa_1", 7)


def test_nolima_rows_name_their_question(tiny_engine, tmp_path):
    out = _run(tiny_engine, tmp_path / "run", tasks=["nolima_direct", "niah_multikey_1"], methods=["vanilla"], depths=[0.5])
    rows = _rows(out)
    from qgpm.samples.nolima import needle_combos

    nolima = [r for r in rows if r["task"] == "nolima_direct"]
    assert nolima and all(r["question_id"] == needle_combos(r["seed"])[0][0] for r in nolima)
    assert all("question_id" not in r for r in rows if r["task"] != "nolima_direct")


def test_a_model_without_a_head_set_runs_the_recipe_in_the_harness(tokenizer, tmp_path, monkeypatch):
    """A model nobody calibrated gets the recipe, which ranks with MiniLM and reads no head:
    the harness runs and hashes its qgpm rows (no heads in the fingerprint); a config that
    ranks with the heads is refused before any row, naming the missing head set."""
    from qgpm.config import RECIPE
    from qgpm.heads import HeadSetMissingError

    monkeypatch.setenv("QGPM_HOME", str(tmp_path / "home"))  # no stored head set anywhere
    engine = QGPM(tiny_model("llama", len(tokenizer), seed=4), tokenizer, name="tiny-uncalibrated")
    assert engine.head_set is None and engine.config == RECIPE
    fp = method_fingerprint(engine, "qgpm")
    assert "heads" not in fp and fp["config"]["relevance"] == "minilm"
    out = _run(engine, tmp_path / "recipe", methods=["vanilla", "qgpm"], depths=[0.5])
    assert {r["method"] for r in _rows(out)} == {"vanilla", "qgpm"}
    with pytest.raises(HeadSetMissingError):
        method_fingerprint(engine, "qgpm", config=RECIPE.with_(relevance="heads"))
    from qgpm.eval.tune import tune

    summary = tune(engine, tasks=["niah_multikey_1"], lengths=[LENGTH], depths=[0.5], n=1, out_dir=tmp_path / "tune",
                   grid={"k_sharp": [2.0, 4.0]}, base_config=RECIPE.with_(keep_length=0), max_new_tokens=NEW, progress=False,
                   command="test")
    assert summary["trials"] == 2 and summary["heads"] is None


@pytest.mark.parametrize("chosen, warned", [(0.1, True), (0.9, False)])
def test_calibration_warns_when_the_chosen_heads_do_worse_than_random_sets(tiny_dir, monkeypatch, caplog, chosen, warned):
    """A head set whose held-out fused MRR is below the random sets' mean is stored, and said to
    carry little signal, with what to do instead."""
    import logging

    import torch

    import qgpm.calibrate as cal

    engine = QGPM.from_pretrained(str(tiny_dir), heads=[(0, 0)])
    scores = cal.HeadScores(torch.rand(engine.n_layers, engine.model.config.num_attention_heads), 2)
    values = iter([chosen] + [0.5] * 100)  # the chosen set first, then the random draws
    monkeypatch.setattr(cal, "fused_mrr", lambda per_sample, heads: next(values))
    monkeypatch.setattr(cal, "sample_head_logits", lambda *a, **k: [])
    monkeypatch.setattr(cal, "flat_relevance_threshold", lambda *a, **k: {"min_top_z": None})
    with caplog.at_level(logging.WARNING, logger="qgpm"):
        hs = cal.calibrate_heads(engine, [], scores=scores, top=2, holdout=["h1", "h2"], progress=False)
    assert hs.heads == scores.best(2) and hs.random_mrr == pytest.approx(0.5)
    said = [r.getMessage() for r in caplog.records if "worse than random" in r.getMessage()]
    assert bool(said) == warned
    if warned:
        assert "fused MRR 0.100 against 0.500" in said[0] and "relevance='minilm'" in said[0]


def _add_runs(out: str, name: str, count: int, start) -> None:
    from qgpm.eval.rows import update_manifest

    start.wait()  # both jobs write at once
    for i in range(count):
        update_manifest(out, {"command": f"{name}-{i}"}, {f"{name}-{i}": {"method": "vanilla"}})


def test_jobs_finishing_into_one_folder_keep_each_others_manifest_entries(tmp_path):
    import multiprocessing

    from qgpm.eval.rows import read_manifest

    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    jobs = [ctx.Process(target=_add_runs, args=(str(tmp_path), name, 150, start)) for name in ("a", "b")]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join(120)
    assert [job.exitcode for job in jobs] == [0, 0]
    man = read_manifest(tmp_path)
    assert len(man["runs"]) == 300 and len(man["configs"]) == 300  # without the folder's lock about half were lost


def test_stats_json_is_strict_json_when_a_series_has_no_answered_row(tmp_path):
    from qgpm.eval.report import report

    rows = [{"task": "qa_1", "length": 1024, "depth": 0.5, "seed": i, "index": i, "split": "test", "method": m, "config_hash": m,
             "metric": "string_match_part", "gold": ["x"], "answer": None if m == "qgpm" else "x", "correct": m == "vanilla",
             "score": 1.0 if m == "vanilla" else 0.0, **({"error": "RuntimeError: boom"} if m == "qgpm" else {})}
            for i in range(3) for m in ("vanilla", "qgpm")]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report(tmp_path, plots=False)

    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    stats = json.loads((tmp_path / "stats.json").read_text(), parse_constant=refuse)
    assert stats


def test_an_interrupted_eval_keeps_its_answers_in_rows_jsonl_and_says_how_to_resume(tiny_dir, tmp_path, monkeypatch, capsys):
    import qgpm.eval.runner as runner
    from qgpm.eval.cli import main

    real, calls = runner.answer_sample, []

    def interrupted_second(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(runner, "answer_sample", interrupted_second)
    out = tmp_path / "run"
    args = ["eval", "--model", str(tiny_dir), "--heads", "1:0,2:1", "--tasks", "qa_1", "--lengths", str(LENGTH), "--depths", "0.5",
            "--n", "2", "--methods", "vanilla", "--max-new-tokens", str(NEW), "--out", str(out), "--device", "cpu", "--no-progress", "--no-logprob"]
    assert main(args) == 130
    assert "interrupted; the answers so far are kept: rerun the same command to resume" in capsys.readouterr().err
    assert len(_rows(out)) == 1
    from qgpm.eval.rows import read_manifest

    man = read_manifest(out)  # the stopped run's settings are on record with its row, though it never finished
    assert _rows(out)[0]["config_hash"] in man["configs"] and "runs" not in man
    monkeypatch.setattr(runner, "answer_sample", real)
    assert main(args) == 0 and len(_rows(out)) == 2


def test_a_report_over_no_answered_sample_says_why(tmp_path):
    (tmp_path / "rows.jsonl").write_text("")
    with pytest.raises(ValueError, match="holds no rows: no sample was answered"):
        report(tmp_path, plots=False)
    with pytest.raises(FileNotFoundError, match="no rows in"):
        report(tmp_path / "elsewhere", plots=False)


def test_the_harness_logs_its_own_notes_and_only_warnings_of_other_libraries():
    """qgpm eval / tune show qgpm's INFO notes; other libraries' INFO lines (sentence-transformers'
    "Load pretrained ...") stay out of the progress bar's way."""
    import logging

    from qgpm.eval.cli import _setup_logging

    root, ours = logging.getLogger(), logging.getLogger("qgpm")
    levels = (root.level, ours.level)
    try:
        _setup_logging()
        assert logging.getLogger("qgpm.eval").isEnabledFor(logging.INFO)
        assert not logging.getLogger("sentence_transformers.SentenceTransformer").isEnabledFor(logging.INFO)
    finally:
        root.setLevel(levels[0])
        ours.setLevel(levels[1])
