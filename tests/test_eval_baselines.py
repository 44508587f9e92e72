"""The RoPE baselines in the evaluation harness and the command lines (tiny random Llama
with the SmolLM2 tokenizer: the answers are gibberish, the plumbing is real)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qgpm_testing import tiny_model

from qgpm import QGPM, MsPoEOptions, SelfExtendOptions, StringOptions
from qgpm.eval.answering import answer_sample, gold_continuation
from qgpm.eval.hashes import config_hash, method_fingerprint
from qgpm.eval.runner import run_eval
from qgpm.samples.base import split_seed
from qgpm.samples.tasks import generate

LENGTH = 256
NEW = 4
BASELINES = ["string", "ms-poe", "self-extend"]
OPTIONS = {"string": StringOptions(local_window=16), "self-extend": SelfExtendOptions(group_size=4, window=32)}


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs the tiny model on one thread (see conftest.one_thread)."""


@pytest.fixture(scope="module")
def tiny_engine(tokenizer):
    return QGPM(tiny_model("llama", len(tokenizer)), tokenizer, heads=[(1, 0)], name="tiny-llama")


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (Path(out) / "rows.jsonl").read_text().splitlines()]


def test_run_eval_runs_the_baselines_and_hashes_their_options(tiny_engine, tmp_path):
    out = run_eval(tiny_engine, tasks=["niah_multikey_1"], lengths=[LENGTH], depths=[0.0, 1.0], n=1, methods=["vanilla", *BASELINES],
                   out_dir=tmp_path / "run", max_new_tokens=NEW, progress=False, on_error="raise", options=OPTIONS)
    rows = _rows(out)
    assert len(rows) == 2 * 4 and not any(r.get("error") for r in rows)
    by = {m: [r for r in rows if r["method"] == m] for m in ["vanilla", *BASELINES]}
    assert all(len(v) == 2 for v in by.values())
    for r in by["string"]:
        assert r["baseline"]["local_window"] == 16 and r["baseline"]["shift"] == r["prompt_tokens"] // 3
        assert r["logprob_gold"] < 0
    assert by["self-extend"][0]["baseline"] == {"group_size": 4, "window": 32}
    assert by["ms-poe"][0]["baseline"]["min_ratio"] == 1.2
    assert len({r["config_hash"] for r in rows}) == 4
    man = json.loads((out / "manifest.json").read_text())
    assert man["latest"]["options"]["string"]["local_window"] == 16
    assert man["latest"]["options"]["ms-poe"] == MsPoEOptions().to_dict()  # defaults, written out
    assert man["configs"][man["latest"]["config_hashes"]["self-extend"]]["options"] == OPTIONS["self-extend"].to_dict()
    assert "string" in (out / "report.md").read_text()
    # resuming with other STRING settings reruns STRING only
    run_eval(tiny_engine, tasks=["niah_multikey_1"], lengths=[LENGTH], depths=[0.0, 1.0], n=1, methods=["vanilla", *BASELINES],
             out_dir=out, max_new_tokens=NEW, progress=False, on_error="raise", options=dict(OPTIONS, string=StringOptions(local_window=32)))
    rows2 = _rows(out)
    assert len(rows2) == 2 * 5 and sum(r["method"] == "string" for r in rows2) == 4


def test_fingerprint_changes_only_with_the_methods_own_options(tiny_engine):
    def h(method, options=None):
        return config_hash(method_fingerprint(tiny_engine, method, options=options))

    assert h("string") == h("string", {"string": StringOptions()}) == h("string", {"self-extend": SelfExtendOptions(window=8)})
    assert h("string") != h("string", {"string": StringOptions(local_window=64)})
    assert h("string") != h("string", {"string": StringOptions(cos_sin_scale=1.069)})
    assert h("vanilla") == h("vanilla", {"string": StringOptions(local_window=64)})
    assert h("self-extend", SelfExtendOptions(group_size=4)) != h("self-extend")


def test_run_eval_rejects_bad_options_before_work(tiny_engine, tmp_path):
    with pytest.raises(ValueError, match="take options"):
        run_eval(tiny_engine, tasks=["qa_1"], lengths=[LENGTH], n=1, methods=["qgpm"], out_dir=tmp_path / "x", options={"qgpm": {}})
    with pytest.raises(TypeError, match="takes options=StringOptions"):
        run_eval(tiny_engine, tasks=["qa_1"], lengths=[LENGTH], n=1, methods=["string"], out_dir=tmp_path / "x", options={"string": MsPoEOptions()})
    assert not (tmp_path / "x").exists()


def test_answer_sample_equals_engine_answer_for_baselines(tiny_engine):
    s = generate("nolima_direct", n=1, length=LENGTH, tokenizer=tiny_engine.tokenizer, seed=split_seed("test", 3), depths=[0.5], max_new_tokens=NEW)[0]
    for m in BASELINES:
        opts = OPTIONS.get(m)
        got = answer_sample(tiny_engine, s, m, options=OPTIONS)
        kw = dict(method=m, instruction=s.instruction, template=s.template, answer_prefix=s.answer_prefix, options=opts)
        ref = tiny_engine.answer(s.context, s.question, max_new_tokens=s.max_new_tokens, **kw)
        assert got["answer"] == ref.text
        lp = tiny_engine.answer_logprob(s.context, s.question, gold_continuation(s), **kw)
        assert got["logprob_gold"] == pytest.approx(lp, abs=1e-3)


def test_cli_eval_runs_the_baselines_end_to_end(tiny_dir, tmp_path):
    from qgpm.eval.cli import main

    out = tmp_path / "run"
    rc = main(["eval", "--model", str(tiny_dir), "--tasks", "qa_1", "--lengths", str(LENGTH), "--depths", "0.5", "--n", "1",
               "--methods", "string,ms-poe,self-extend", "--option", "string.local_window=16", "--option", "self-extend.window=32",
               "--max-new-tokens", str(NEW), "--out", str(out), "--device", "cpu", "--dtype", "float32", "--no-progress"])
    assert rc == 0
    rows = _rows(out)
    assert [r["method"] for r in rows] == BASELINES and not any(r.get("error") for r in rows)
    man = json.loads((out / "manifest.json").read_text())
    assert man["latest"]["options"]["string"]["local_window"] == 16 and man["latest"]["options"]["self-extend"]["window"] == 32
    assert "--option string.local_window=16" in man["latest"]["command"]
    assert (out / "report.md").is_file()


def test_cli_eval_rejects_a_bad_option_before_loading(tmp_path, capsys):
    from qgpm.eval.cli import main

    # one line, exit 2, and no model load: the model path does not even exist
    assert main(["eval", "--model", str(tmp_path / "missing"), "--methods", "string", "--option", "string.windw=3", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "has no field 'windw'" in err and len(err.splitlines()) == 1


def test_ask_accepts_methods_and_names_the_baselines(capsys):
    from qgpm.cli import build_parser, main

    assert build_parser().parse_args(["ask", "--methods", "qgpm,string"]).methods == ["qgpm", "string"]
    assert main(["ask", "--methods", "string,magic"]) == 2
    err = capsys.readouterr().err
    assert "unknown method(s) ['magic']" in err and "string, ms-poe, self-extend" in err
