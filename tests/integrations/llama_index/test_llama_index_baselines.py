"""QGPMLLM with the RoPE baselines: method= and options= reach the engine (stub and tiny model)."""

from __future__ import annotations

import pytest
import torch

import llama_index.core
from llama_index.core.prompts.default_prompt_selectors import DEFAULT_TEXT_QA_PROMPT_SEL

from qgpm_testing import tiny_model

from qgpm import QGPM, MsPoEOptions, SelfExtendOptions, StringOptions
from qgpm.baselines.attention import active_plans
from qgpm_integrations.llama_index import QGPMLLM

QA = DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str="Which item does line 3 mention?")
TEXT = " ".join(f"Line {i} mentions item {i % 6} and a colour." for i in range(10))


@pytest.fixture
def word_tokenizer(monkeypatch):
    monkeypatch.setattr(llama_index.core, "global_tokenizer", lambda s: s.split())


def test_options_reach_the_engine(stub_engine, word_tokenizer):
    QGPMLLM(engine=stub_engine, method="self-extend", options=SelfExtendOptions(group_size=4)).predict(QA, context_str="Text.")
    kw = stub_engine.calls[-1][3]
    assert kw["method"] == "self-extend" and kw["options"] == SelfExtendOptions(group_size=4)
    QGPMLLM(engine=stub_engine, method="ms-poe").predict(QA, context_str="Text.")
    kw = stub_engine.calls[-1][3]
    assert kw["method"] == "ms-poe" and kw["options"] is None  # the engine applies MsPoEOptions()
    QGPMLLM(engine=stub_engine, method="vanilla").predict(QA, context_str="Text.")
    assert "options" not in stub_engine.calls[-1][3]


def test_wrong_options_fail_at_construction(stub_engine, word_tokenizer):
    with pytest.raises(ValueError, match="takes none"):
        QGPMLLM(engine=stub_engine, method="qgpm", options=StringOptions())
    with pytest.raises(TypeError, match="takes options=StringOptions"):
        QGPMLLM(engine=stub_engine, method="string", options=MsPoEOptions())


def test_string_on_a_tiny_model(tokenizer, word_tokenizer):
    torch.set_num_threads(1)
    engine = QGPM(tiny_model("llama", len(tokenizer)), tokenizer, heads=[(1, 0)], name="tiny-llama")
    llm = QGPMLLM(engine=engine, method="string", options=StringOptions(shift=30, local_window=4), max_new_tokens=3)
    llm.predict(QA, context_str=TEXT)
    result = llm._last
    assert result is not None and result.method == "string" and result.details["shift"] == 30
    assert active_plans() == 0 and engine.model.config._attn_implementation == "eager"
