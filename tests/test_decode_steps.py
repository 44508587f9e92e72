"""benchmarks/decode_steps.py: its step clock, its three calls on a tiny model, and its argument checks (with those of speed.py and memory_alloc.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from qgpm import QGPM, QGPMConfig
from qgpm_testing import NEEDLE_QUESTION, needle_context, tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import decode_steps  # noqa: E402

ONE_MAP = QGPMConfig(remap="reorder", split_layer=0, k_sharp=2.0, s_low=0.1, min_top_z=None, decisive_margin=None)
STRIDE = QGPMConfig(remap="stride", k_sharp=2.0, s_low=0.1, min_top_z=None, decisive_margin=None)


def test_step_clock_times_the_gaps_between_steps():
    clock = decode_steps.StepClock(cuda=False)
    clock.stamps = [1.0, 1.5, 1.75]
    assert clock.step_ms() == [500.0, 250.0]


@pytest.mark.parametrize("config,pass2", [(ONE_MAP, "slot order"), (STRIDE, "positions")])
def test_timed_calls_report_steps_and_the_after_pass1_call_runs_pass1(tokenizer, monkeypatch, config, pass2):
    model = tiny_model("llama", len(tokenizer))
    vanilla = QGPM(model, tokenizer, heads=[(1, 0), (2, 1)], config=config)
    qgpm = QGPM(model, tokenizer, heads=[(1, 0), (2, 1)], config=config)
    monkeypatch.setattr(decode_steps.speed, "QUESTION", NEEDLE_QUESTION)
    ctx = needle_context(10)
    v = decode_steps.timed_call(vanilla, ctx, "vanilla", 6)
    q = decode_steps.timed_call(qgpm, ctx, "qgpm", 6)
    assert v["median"] > 0 and v["mean"] > 0 and v["pass2"] is None
    assert q["pass2"] == pass2 and q["prompt_tokens"] == v["prompt_tokens"]
    prepared = []
    real = qgpm.prepare
    monkeypatch.setattr(qgpm, "prepare", lambda *a, **k: prepared.append(real(*a, **k)))
    after = decode_steps.timed_call(vanilla, ctx, "vanilla", 6, prepare_first=qgpm)
    assert len(prepared) == 1 and prepared[0].details["layers_run"] > 0 and after["pass2"] is None


def test_hook_time_counts_the_plan_hooks_of_decode_steps_only(tokenizer, monkeypatch):
    model = tiny_model("llama", len(tokenizer))
    monkeypatch.setattr(decode_steps.speed, "QUESTION", NEEDLE_QUESTION)
    ctx = needle_context(10)
    stride = QGPM(model, tokenizer, heads=[(1, 0), (2, 1)], config=STRIDE)
    hooked = sum(m is not None for m in stride.prepare(ctx, NEEDLE_QUESTION).plan.layer_map)
    got = decode_steps.hook_time(stride, ctx, 5)
    assert hooked > 0 and got["calls_per_step"] == hooked and got["ms_per_step"] > 0  # the prefill's forward not counted
    slot = decode_steps.hook_time(QGPM(model, tokenizer, heads=[(1, 0), (2, 1)], config=ONE_MAP), ctx, 5)
    assert slot == {"ms_per_step": 0.0, "calls_per_step": 0.0}  # pass 2 in slot order runs without a plan


BAD_ARGUMENTS = [
    (["--set", "remap"], "--set takes FIELD=VALUE"),
    (["--set", "no_such_field=1"], "'no_such_field' is not a QGPMConfig field"),
    (["--tokenizer", "tok"], "--tokenizer is for --random-arch only"),
    (["--model", "m", "--random-arch", "llama3-8b-thin", "--tokenizer", "tok"], "--model and --random-arch exclude each other"),
    (["--random-arch", "llama3-8b-thin"], "--random-arch needs --tokenizer"),
]


@pytest.mark.parametrize("argv,msg", [
    (["--rounds", "1"], "--rounds must be at least 2"),
    (["--new-tokens", "2"], "--new-tokens must be at least 3"),
    (["--evidence-depth", "1.5"], "--evidence-depth must be in"),
] + BAD_ARGUMENTS)
def test_bad_arguments_stop_before_any_model_loads(argv, msg, capsys, monkeypatch):
    monkeypatch.setattr(decode_steps.QGPM, "from_pretrained", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setattr(decode_steps.speed, "random_engine", lambda *a, **k: pytest.fail("a model was built"))
    with pytest.raises(SystemExit):
        decode_steps.main(argv)
    assert msg in capsys.readouterr().err


@pytest.mark.parametrize("argv,msg", BAD_ARGUMENTS + [(["--heads", "1:0"], "--heads is for --random-arch only")])
def test_speed_benchmark_checks_the_same_arguments_first(argv, msg, capsys, monkeypatch):
    speed = decode_steps.speed
    monkeypatch.setattr(speed.QGPM, "from_pretrained", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setattr(speed, "random_engine", lambda *a, **k: pytest.fail("a model was built"))
    with pytest.raises(SystemExit):
        speed.main(argv)
    assert msg in capsys.readouterr().err


def test_memory_benchmark_refuses_a_bad_relevance_source_before_any_model_loads(capsys, monkeypatch):
    from qgpm_testing import benchmark_module

    memory_alloc = benchmark_module("memory_alloc")
    monkeypatch.setattr(memory_alloc.QGPM, "from_pretrained", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit):
        memory_alloc.main(["--relevance", "bm25+heads"])
    assert "a fused source is written 'heads+<reranker>'" in capsys.readouterr().err
