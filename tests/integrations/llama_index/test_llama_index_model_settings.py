"""QGPMLLM model settings with HuggingFaceLLM's names, metadata, and streaming events."""

from __future__ import annotations

import asyncio

import pytest
import torch

import llama_index.core
from llama_index.core.callbacks import CallbackManager, CBEventType, LlamaDebugHandler
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import (
    LLMChatEndEvent,
    LLMChatInProgressEvent,
    LLMChatStartEvent,
    LLMCompletionEndEvent,
    LLMCompletionInProgressEvent,
    LLMCompletionStartEvent,
    LLMPredictStartEvent,
)
from llama_index.core.llms import ChatMessage
from llama_index.core.prompts import PromptTemplate
from llama_index.core.prompts.default_prompt_selectors import DEFAULT_TEXT_QA_PROMPT_SEL

from qgpm import QGPM
from qgpm_integrations.llama_index import QGPMLLM

from qgpm_testing import save_tiny, spy_load_model, tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tokenizer, tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("li-tiny"), tokenizer, max_position_embeddings=2048)


@pytest.fixture
def load_calls(monkeypatch):
    return spy_load_model(monkeypatch)


@pytest.fixture
def word_tokenizer(monkeypatch):
    monkeypatch.setattr(llama_index.core, "global_tokenizer", lambda s: s.split())


# --------------------------------------------------------------------------- settings reach the engine


def test_model_name_model_kwargs_and_device_map_reach_the_engine(tiny_dir, load_calls):
    llm = QGPMLLM(model_name=str(tiny_dir), model_kwargs={"torch_dtype": "bfloat16"}, device_map="cpu", heads=[(1, 0)],
                  max_new_tokens=9, set_global_tokenizer=False)
    (path, kwargs), = load_calls
    assert path == str(tiny_dir) and kwargs["dtype"] == torch.bfloat16 and kwargs["device_map"] == "cpu"
    assert llm.engine.model.dtype == torch.bfloat16 and llm.engine.device.type == "cpu"
    md = llm.metadata
    assert (md.context_window, md.num_output, md.model_name, md.is_chat_model) == (2048 - llm.prompt_overhead(), 9, str(tiny_dir), False)
    assert llm.model_kwargs == {"torch_dtype": "bfloat16", "device_map": "cpu"}


def test_llms_naming_one_model_share_one_engine_and_leave_settings_alone(tiny_dir, load_calls, monkeypatch):
    from llama_index.core import Settings

    from qgpm_integrations._common import clear_engine_cache

    clear_engine_cache()
    monkeypatch.setattr(llama_index.core, "global_tokenizer", None)
    before = dict(vars(Settings))
    a = QGPMLLM(model_name=str(tiny_dir), heads=[(1, 0)], method="qgpm")
    b = QGPMLLM(model=str(tiny_dir), heads=[(1, 0)], method="vanilla")
    assert a.engine is b.engine and len(load_calls) == 1  # loaded once, through the adapters' shared engine cache
    c = QGPMLLM(model_name=str(tiny_dir), heads=[(1, 0)], model_kwargs={"dtype": "float32"})
    assert c.engine is not a.engine and len(load_calls) == 2  # other loading arguments: another engine
    assert dict(vars(Settings)) == before and llama_index.core.global_tokenizer is None
    clear_engine_cache()


def test_context_window_and_is_chat_model_are_honoured(tiny_dir, load_calls):
    with pytest.raises(ValueError, match=r"context_window=1000000 is larger than the model window \(2048 tokens\)"):
        QGPMLLM(model_name=str(tiny_dir), heads=[(1, 0)], context_window=10**6, set_global_tokenizer=False)
    assert load_calls == []  # read from the config, before the weights load
    llm = QGPMLLM.from_model_id(str(tiny_dir), heads=[(1, 0)], context_window=1000, is_chat_model=True, set_global_tokenizer=False)
    assert (llm.metadata.context_window, llm.metadata.is_chat_model) == (1000, True)
    room = 2048 - llm.prompt_overhead()
    assert QGPMLLM(model_name=str(tiny_dir), heads=[(1, 0)], context_window=room, set_global_tokenizer=False).metadata.context_window == room
    with pytest.raises(ValueError, match=f"context_window={room + 1} leaves no room for QGPM's own prompt.*at most {room}"):
        QGPMLLM(model_name=str(tiny_dir), heads=[(1, 0)], context_window=room + 1, set_global_tokenizer=False)


def test_the_window_llama_index_packs_leaves_room_for_qgpms_prompt(tokenizer, monkeypatch):
    """LlamaIndex packs retrieved text into metadata.context_window by the prompt it formats; QGPM
    answers with its own prompt (instruction, system message, chat template), so the window it
    reports is the model's less that prompt, and every response mode fits a full window."""
    from llama_index.core import get_response_synthesizer
    from llama_index.core.schema import NodeWithScore, TextNode

    from qgpm_integrations.llama_index import set_tokenizer

    monkeypatch.setattr(llama_index.core, "global_tokenizer", None)
    model = tiny_model("llama", len(tokenizer), seed=3, max_position_embeddings=1024)
    llm = QGPMLLM(engine=QGPM(model, tokenizer, heads=[(1, 0)]), method="vanilla", max_new_tokens=4,
                  system_prompt="Answer in one word.")
    assert llm.metadata.context_window == 1024 - llm.prompt_overhead() and llm.prompt_overhead() > 20
    set_tokenizer(llm)
    words = "alpha beta gamma delta river stone cloud paper window garden".split()
    nodes = [NodeWithScore(node=TextNode(text=" ".join(words[(i + j) % 10] for j in range(60)) + "."), score=1.0) for i in range(24)]
    for mode in ("simple_summarize", "tree_summarize", "compact"):
        response = get_response_synthesizer(llm=llm, response_mode=mode).synthesize("What is gamma?", nodes)
        prompts = [r.usage.prompt_tokens for r in response.metadata["qgpm"]]
        assert max(prompts) + 4 <= 1024, (mode, prompts)
        assert mode != "simple_summarize" or max(prompts) > 900, prompts  # the window was packed nearly full


def test_an_already_loaded_model_and_tokenizer(tokenizer, word_tokenizer):
    model = tiny_model("llama", len(tokenizer), seed=2, max_position_embeddings=2048)
    llm = QGPMLLM(model=model, tokenizer=tokenizer, heads=[(1, 0)], max_new_tokens=4)
    assert llm.engine.model is model and llm.engine.tokenizer is tokenizer
    assert llm.metadata.context_window == 2048 - llm.prompt_overhead() and llm.metadata.model_name == llm.engine.name
    qa = DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str="When does the red door open?")
    assert isinstance(llm.predict(qa, context_str="The red door opens at noon. The blue door is locked."), str)
    assert llm.last_result.method == "qgpm"


def test_generate_kwargs_reach_the_engine(stub_engine, word_tokenizer):
    llm = QGPMLLM(engine=stub_engine, generate_kwargs={"repetition_penalty": 1.2})
    llm.complete("hi")
    assert stub_engine.calls[-1][3]["repetition_penalty"] == 1.2
    llm.predict(DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str="Q?"), context_str="Text.")
    assert stub_engine.calls[-1][0] == "answer" and stub_engine.calls[-1][3]["repetition_penalty"] == 1.2


# --------------------------------------------------------------------------- bad arguments fail before loading


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"no_such": 1}, TypeError, r"unexpected arguments \['no_such'\]"),
        ({"context_windw": 100}, TypeError, "context_windw"),
        ({"method": "magic"}, ValueError, "unknown method"),
        ({"relevance": "minlm"}, ValueError, r"relevance 'minlm': 'minlm' is not a relevance source"),
        ({"relevance": "heads+nope"}, ValueError, r"relevance 'heads\+nope': 'nope' is not a relevance source"),
        ({"method": "topk", "reranker": "nope"}, ValueError, "reranker='nope': unknown reranker"),
        ({"seed": -1}, ValueError, r"seed must be in \[0, 2\*\*64\)"),
        ({"temperature": float("inf")}, ValueError, "temperature must be a finite number"),
        ({"temperature": True}, TypeError, "temperature must be a number"),
        ({"max_new_tokens": 2.0}, TypeError, "max_new_tokens must be an int"),
        ({"stop": 5}, TypeError, "stop must be a string or a list of strings"),
        ({"generate_kwargs": {"top_k": "a"}}, TypeError, "generate_kwargs: top_k must be an int >= 0"),
        ({"generate_kwargs": {"repetition_penalty": 0}}, ValueError, "repetition_penalty must be a number > 0"),
        ({"context_window": 1000, "max_new_tokens": 1000}, ValueError, "max_new_tokens=1000 leaves no room for a prompt"),
        ({"refine_instruction": "Refine it."}, ValueError, r"refine_instruction='Refine it.' has no \{existing_answer\}"),
        ({"query_wrapper_prompt": PromptTemplate("[INST] {query_str} [/INST]")}, ValueError, "takes no query_wrapper_prompt: each prompt is written with the model's own chat template"),
        ({"model_kwargs": {"dtype": "bf17"}}, ValueError, "unknown dtype"),
        ({"generate_kwargs": {"max_new_tokens": 3}}, ValueError, r"set max_new_tokens=\.\.\. instead"),
        ({"generate_kwargs": {"repetition_penaltyy": 1.2}}, TypeError, r"generate_kwargs: unexpected arguments \['repetition_penaltyy'\]"),
        ({"generate_kwargs": {"num_return_sequences": 2}}, ValueError, "num_return_sequences: not supported"),
        ({"model": "a/b", "model_name": "c/d"}, ValueError, "not both"),
        ({"heads": "/no/such/heads.json"}, FileNotFoundError, "not a head-set file"),
        ({"model_name": "x", "tokenizer": object()}, ValueError, "already-loaded"),
    ],
)
def test_bad_arguments_raise_before_loading(kwargs, exc, match, monkeypatch):
    def no_load(*a, **k):
        raise AssertionError("the model must not load")

    monkeypatch.setattr(QGPM, "from_pretrained", no_load)
    with pytest.raises(exc, match=match):
        QGPMLLM(set_global_tokenizer=False, **kwargs)


def test_an_answer_budget_as_large_as_the_window_is_refused_when_built(stub_engine, word_tokenizer):
    """LlamaIndex packs prompts into context_window - max_new_tokens: a budget that leaves nothing
    fails here, not as a negative context size inside the first query."""
    with pytest.raises(ValueError, match=f"max_new_tokens={stub_engine.max_length} leaves no room"):
        QGPMLLM(engine=stub_engine, max_new_tokens=stub_engine.max_length)
    room = QGPMLLM(engine=stub_engine).metadata.context_window  # the model's window less QGPM's own prompt
    with pytest.raises(ValueError, match=f"max_new_tokens={room} leaves no room"):
        QGPMLLM(engine=stub_engine, max_new_tokens=room)
    assert QGPMLLM(engine=stub_engine, max_new_tokens=room - 1).metadata.num_output == room - 1
    assert stub_engine.calls == []


def test_engine_with_model_settings_is_an_error(stub_engine, word_tokenizer):
    with pytest.raises(ValueError, match="either engine="):
        QGPMLLM(engine=stub_engine, device_map="cpu")
    with pytest.raises(ValueError, match="either engine="):
        QGPMLLM(engine=stub_engine, model_name="x")


# --------------------------------------------------------------------------- streaming events


class Events(BaseEventHandler):
    seen: list = []

    @classmethod
    def class_name(cls) -> str:
        return "Events"

    def handle(self, event, **kwargs):
        self.seen.append(type(event))

    def count(self, cls):
        return sum(1 for e in self.seen if e is cls)


@pytest.fixture
def events():
    handler = Events(seen=[])
    root = get_dispatcher()
    root.add_event_handler(handler)
    yield handler
    root.event_handlers.remove(handler)


@pytest.fixture
def debug_llm(stub_engine, word_tokenizer):
    debug = LlamaDebugHandler()
    llm = QGPMLLM(engine=stub_engine, callback_manager=CallbackManager([debug]))
    return llm, debug


def _check_completion_events(events, debug, n_chunks):
    assert events.count(LLMCompletionStartEvent) == 1 and events.count(LLMCompletionEndEvent) == 1
    assert events.count(LLMCompletionInProgressEvent) == n_chunks >= 2
    pairs = debug.get_event_pairs(CBEventType.LLM)
    assert len(pairs) == 1 and len(pairs[0]) == 2  # callback manager: one LLM start/end pair


def test_stream_complete_emits_llm_events(debug_llm, events):
    llm, debug = debug_llm
    chunks = list(llm.stream_complete("hello"))
    _check_completion_events(events, debug, len(chunks))


def test_stream_of_a_synthesizer_template_emits_llm_events(debug_llm, events):
    llm, debug = debug_llm
    qa = DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str="What is alpha?")
    tokens = list(llm.stream(qa, context_str="Alpha one. Alpha two."))
    assert "".join(tokens) == "qgpm answer to What is alpha? from 1 docs"
    assert events.count(LLMPredictStartEvent) == 1
    assert tokens[-1] == ""  # the last response is an empty delta carrying usage and the QGPM result
    _check_completion_events(events, debug, len(tokens))


def test_astream_complete_emits_llm_events(debug_llm, events):
    llm, debug = debug_llm

    async def run():
        gen = await llm.astream_complete("hello")
        return [c async for c in gen]

    chunks = asyncio.run(run())
    _check_completion_events(events, debug, len(chunks))


def test_stream_chat_emits_llm_events(debug_llm, events):
    llm, debug = debug_llm
    chunks = list(llm.stream_chat([ChatMessage(role="user", content="hi")]))
    assert events.count(LLMChatStartEvent) == 1 and events.count(LLMChatEndEvent) == 1
    assert events.count(LLMChatInProgressEvent) == len(chunks) >= 2
    # CustomLLM's chat completes the joined prompt: one LLM start/end pair for the chat, one for the completion
    assert len(debug.get_event_pairs(CBEventType.LLM)) == 2


@pytest.mark.parametrize("kwargs,said", [
    ({"max_tokens": 10}, "max_tokens: the answer's budget is max_new_tokens= here"),
    ({"num_predict": 10}, "num_predict: the answer's budget is max_new_tokens= here"),
    ({"tokenizer_name": "x"}, "tokenizer_name: the tokenizer is the model's own"),
    ({"stopping_ids": [2]}, "stopping_ids: stop strings go in stop="),
    ({"max_new_token": 10}, "max_new_token: did you mean 'max_new_tokens'"),
])
def test_huggingface_llm_names_say_where_they_go(kwargs, said):
    from qgpm_integrations.llama_index import QGPMLLM

    with pytest.raises(TypeError, match=said):
        QGPMLLM(**kwargs)
