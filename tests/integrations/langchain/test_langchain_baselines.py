"""QGPMChatModel with the RoPE baselines (method= and options=), on a tiny random Llama."""

from __future__ import annotations

import pytest
import torch
from langchain_core.messages import HumanMessage

from qgpm_testing import tiny_model

from qgpm import METHODS, QGPM, SelfExtendOptions, StringOptions
from qgpm.baselines.attention import active_plans
from qgpm_integrations.langchain import QGPM_METHODS, QGPMChatModel

CONTEXT = [f"Line {i} mentions item {i % 6} and a colour." for i in range(10)]
QUESTION = "Which item does line 3 mention?"


@pytest.fixture(scope="module")
def tiny_engine(tokenizer):
    torch.set_num_threads(1)
    return QGPM(tiny_model("llama", len(tokenizer)), tokenizer, heads=[(1, 0)], name="tiny-llama")


def test_adapter_lists_every_engine_method():
    assert set(QGPM_METHODS) == set(METHODS)


def test_baseline_methods_and_their_options_reach_the_engine(tiny_engine):
    llm = QGPMChatModel(engine=tiny_engine, method="string", options=StringOptions(shift=30, local_window=4), max_tokens=3)
    msg = llm.invoke([HumanMessage(QUESTION)], context=CONTEXT)
    info = msg.response_metadata["qgpm"]
    assert msg.response_metadata["method"] == "string" and info["mode"] == "context"
    assert info["details"] == {"shift": 30, "local_window": 4, "logit_scale": 1.0}
    assert info["explanation"].startswith("method=string: query-agnostic positions inside attention")
    assert llm._identifying_params["options"]["local_window"] == 4
    # another baseline per call, with its own options; the model's STRING options stay with STRING
    msg = llm.invoke([HumanMessage(QUESTION)], context=CONTEXT, method="self-extend", options=SelfExtendOptions(group_size=2, window=16))
    assert msg.response_metadata["qgpm"]["details"] == {"group_size": 2, "window": 16}
    msg = llm.invoke([HumanMessage(QUESTION)], context=CONTEXT, method="vanilla")
    assert msg.response_metadata["method"] == "vanilla" and msg.response_metadata["qgpm"]["details"] == {}
    chunks = list(llm.stream([HumanMessage(QUESTION)], context=CONTEXT, method="ms-poe"))
    assert chunks and chunks[-1].response_metadata["qgpm"]["method"] == "ms-poe"
    assert active_plans() == 0 and tiny_engine.model.config._attn_implementation == "eager"


def test_wrong_options_are_clear_errors(tiny_engine):
    with pytest.raises(ValueError, match="does not configure method='qgpm'"):
        QGPMChatModel(engine=tiny_engine, method="qgpm", options=StringOptions())
    llm = QGPMChatModel(engine=tiny_engine, method="vanilla", max_tokens=2)
    with pytest.raises(ValueError, match="takes none"):
        llm.invoke([HumanMessage(QUESTION)], context=CONTEXT, options=StringOptions())
    with pytest.raises(TypeError, match="takes options=SelfExtendOptions"):
        llm.invoke([HumanMessage(QUESTION)], context=CONTEXT, method="self-extend", options=StringOptions())
