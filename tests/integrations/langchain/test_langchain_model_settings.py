"""QGPMChatModel model settings with HuggingFace's names, and callbacks.

Tiny random models (fast, no embedded model): the settings must reach the engine,
unknown or conflicting arguments must raise before anything loads, and LangChain
callbacks must see every streamed chunk (sync and async).
"""

from __future__ import annotations

import logging

import pytest
import torch
from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
from pydantic import ValidationError

from qgpm_integrations.langchain import QGPMChatModel, clear_engine_cache

from qgpm_testing import save_tiny, spy_load_model, tiny_model

CONTEXT = ["The red door opens at noon. The blue door is locked.", "Bread is sold on Mondays."]
QUESTION = "When does the red door open?"


@pytest.fixture(scope="module")
def tiny_dir(tokenizer, tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("lc-tiny"), tokenizer)


@pytest.fixture
def load_calls(monkeypatch):
    """Every qgpm.loading.load_model call the engine makes: (source path, kwargs)."""
    calls = spy_load_model(monkeypatch)
    clear_engine_cache()
    yield calls
    clear_engine_cache()


@pytest.fixture(scope="module")
def tiny_llm(tokenizer):
    model = tiny_model("llama", len(tokenizer), seed=3, max_position_embeddings=2048)
    return QGPMChatModel(model=model, tokenizer=tokenizer, heads=[(1, 0), (2, 1)], max_tokens=8)


# --------------------------------------------------------------------------- settings reach the engine


def test_model_kwargs_reach_the_engine(tiny_dir, load_calls):
    llm = QGPMChatModel(model_id=str(tiny_dir), heads=[(1, 0)],
                        model_kwargs={"torch_dtype": "bfloat16", "device_map": "cpu", "attn_implementation": "eager"})
    assert llm.model == str(tiny_dir) and not load_calls  # lazy
    engine = llm.get_engine()
    assert engine.model.dtype == torch.bfloat16 and engine.device.type == "cpu"
    assert engine.model.config._attn_implementation == "eager"
    (path, kwargs), = load_calls
    assert path == str(tiny_dir)
    assert kwargs["dtype"] == torch.bfloat16 and kwargs["device_map"] == "cpu" and kwargs["attn_implementation"] == "eager"
    assert engine.heads == [(1, 0)]
    assert llm.get_engine() is engine and QGPMChatModel(model_id=str(tiny_dir), heads=[(1, 0)], model_kwargs={"dtype": torch.bfloat16, "device_map": "cpu", "attn_implementation": "eager"}).get_engine() is engine
    other = QGPMChatModel(model_id=str(tiny_dir), heads=[(1, 0)], model_kwargs={"dtype": "float32"}).get_engine()
    assert other is not engine and other.model.dtype == torch.float32


def test_a_per_call_model_loads_with_the_instance_model_kwargs(tiny_dir, tokenizer, tmp_path, load_calls):
    """get_engine(model=) for another model: this instance's model_kwargs (device, dtype) apply
    to it too, not the loader's defaults."""
    other_dir = save_tiny(tmp_path / "other", tokenizer, seed=5)
    llm = QGPMChatModel(model_id=str(tiny_dir), heads=[(1, 0)], model_kwargs={"dtype": "bfloat16", "device_map": "cpu"})
    other = llm.get_engine(str(other_dir))
    (path, kwargs), = load_calls
    assert path == str(other_dir) and kwargs["dtype"] == torch.bfloat16 and kwargs["device_map"] == "cpu"
    assert other.model.dtype == torch.bfloat16 and other is not llm.get_engine()


def test_from_model_id_loads_now_with_device_and_dtype(tiny_dir, load_calls):
    llm = QGPMChatModel.from_model_id(str(tiny_dir), device=-1, model_kwargs={"dtype": "float16"}, heads=[(1, 0)], max_tokens=4)
    assert load_calls and load_calls[-1][1]["device_map"] == "cpu" and load_calls[-1][1]["dtype"] == torch.float16
    assert llm._engine is not None and llm._engine.model.dtype == torch.float16
    assert llm.max_tokens == 4
    with pytest.raises(ValueError, match="device or device_map"):
        QGPMChatModel.from_model_id(str(tiny_dir), device="cpu", device_map="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            QGPMChatModel.from_model_id(str(tiny_dir), device=0)


def test_generate_kwargs_reach_model_generate(tiny_llm, monkeypatch):
    llm = tiny_llm.model_copy(update={"generate_kwargs": {"repetition_penalty": 1.3, "top_k": 7}})
    engine = llm.get_engine()
    seen = {}
    real = engine.model.generate

    def generate(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.model, "generate", generate)
    llm.invoke("hello")
    assert seen["repetition_penalty"] == 1.3 and seen["top_k"] == 7


def test_an_already_loaded_model_and_tokenizer(tiny_llm, tokenizer):
    engine = tiny_llm.get_engine()
    assert engine.model is tiny_llm.model and engine.tokenizer is tokenizer
    msg = tiny_llm.invoke(QUESTION, context=CONTEXT)
    assert msg.response_metadata["qgpm"]["mode"] == "context" and msg.response_metadata["method"] == "qgpm"
    assert msg.usage_metadata["output_tokens"] > 0


def test_reranker_and_k_settings_serve_a_calls_method(tiny_llm, caplog):
    """reranker= / k= on the model serve calls whose method= (a .bind, configurable fields) reads
    them, with a warning that the model's own method does not; a call whose method reads neither
    refuses them when given per call."""
    with caplog.at_level(logging.WARNING, logger="qgpm"):
        llm = QGPMChatModel(engine=tiny_llm.get_engine(), reranker="bm25", k=2, max_tokens=2)
    assert any("reranker=, k= set the reranker / chunk count of calls whose method is topk or reorder" in r.getMessage()
               for r in caplog.records)
    msg = llm.bind(method="topk").invoke(QUESTION, context=CONTEXT)
    assert msg.response_metadata["method"] == "topk"
    edit = msg.response_metadata["qgpm"]["edit"]
    assert edit["mode"] == "topk" and len(edit["kept"]) == 2  # k=2 of the model, not the default 5
    assert llm.invoke(QUESTION, context=CONTEXT).response_metadata["method"] == "qgpm"  # the model's method reads neither
    with pytest.raises(ValueError, match="takes none"):
        llm.invoke(QUESTION, context=CONTEXT, k=3)


# --------------------------------------------------------------------------- bad arguments fail before loading


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"no_such": 1}, "no_such"),
        ({"method": "magic"}, "unknown method"),
        ({"relevance": "minlm"}, r"relevance 'minlm': 'minlm' is not a relevance source"),
        ({"k": 0}, "greater than or equal to 1"),
        ({"method": "topk", "reranker": "nope"}, r"reranker='nope': unknown reranker 'nope'"),
        ({"model_kwargs": {"dtype": "bf17"}}, "unknown dtype"),
        ({"model_kwargs": {"dtype": "bf16", "torch_dtype": "bf16"}}, "both torch_dtype and dtype"),
        ({"model_kwargs": {"heads": [(0, 0)]}}, "model_kwargs may not hold"),
        ({"generate_kwargs": {"temperature": 0.7}}, r"set temperature=\.\.\. instead"),
        ({"generate_kwargs": {"do_sample": True}}, "temperature > 0"),
        ({"generate_kwargs": {"method": "qgpm"}}, "set by qgpm itself"),
        ({"generate_kwargs": {"repetition_penaltyy": 1.2}}, r"generate_kwargs: unexpected arguments \['repetition_penaltyy'\]"),
        ({"generate_kwargs": {"typical_p": 0.9}}, "typical_p: qgpm samples with"),
        ({"generate_kwargs": {"top_k": "a"}}, "generate_kwargs: top_k must be an int >= 0"),
        ({"generate_kwargs": {"num_beams": 4}}, "num_beams: not supported"),
        ({"vllm_url": "http://127.0.0.1:9", "generate_kwargs": {"no_repeat_ngram_size": 3}}, "not decoding settings a vLLM server takes"),
        ({"vllm_url": "http://127.0.0.1:9", "timeout": 30}, "leave timeout unset with vllm_url="),
        ({"engine": object(), "model_kwargs": {"device_map": "cpu"}}, "either engine="),
        ({"model": "some/id", "tokenizer": object()}, "already-loaded"),
    ],
)
def test_bad_arguments_raise_before_loading(kwargs, match, load_calls):
    with pytest.raises((ValidationError, ValueError, TypeError), match=match):
        QGPMChatModel(**kwargs)
    assert not load_calls


def test_method_settings_are_taken_by_the_methods_that_read_them(load_calls):
    llm = QGPMChatModel(method="topk", reranker="bm25", k=2)
    assert (llm.reranker, llm.k) == ("bm25", 2)
    assert QGPMChatModel(method="reorder", reranker="bm25").reranker == "bm25"
    assert QGPMChatModel(method="qgpm").k == 5  # defaults are no settings to refuse
    assert not load_calls


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"max_tokens": 2.9}, TypeError, "max_tokens must be an int, got float 2.9"),
        ({"max_new_tokens": True}, TypeError, "max_new_tokens must be an int, got bool"),
        ({"temperature": True}, TypeError, "temperature must be a number, got bool"),
        ({"temperature": "hot"}, TypeError, "temperature must be a number, got str"),
        ({"stop": 5}, TypeError, r"stop must be a string or a list of strings, got int \(the stop= of this call\)"),
        ({"method": "topk", "reranker": "bm25", "k": 2.7}, TypeError, "k must be an int, got float"),
        ({"question": ["Where?"]}, TypeError, r"question= must be a string \(the question to answer\), got list \['Where\?'\]"),
        ({"question": 5}, TypeError, "question= must be a string"),
        ({"explain_k": -1}, ValueError, "explain_k must be >= 0"),
        ({"explain_k": 2.5}, TypeError, "explain_k must be an int"),
        ({"explain_html": "yes"}, TypeError, "explain_html must be True or False"),
    ],
)
def test_bad_call_arguments_raise_before_the_model_runs(tiny_llm, kwargs, exc, match, monkeypatch):
    engine = tiny_llm.get_engine()
    monkeypatch.setattr(engine.model, "forward", lambda *a, **k: pytest.fail("the model ran"))
    with pytest.raises(exc, match=match):
        tiny_llm.invoke(QUESTION, context=CONTEXT, **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"method": "qgmp"},
        {"method": "oracle"},  # needs evidence=
        {"evidence": ["red door"]},  # only the oracle reads it
        {"reranker": "bm25"},
        {"k": 2},
        {"method": "topk", "reranker": "nope"},
        {"relevance": "minlm"},
        {"qgpm_config": "fast"},
        {"system": 5},
        {"method": "string", "options": object()},
    ],
    ids=lambda kw: ",".join(f"{k}={v!r}" if isinstance(v, (str, int, list)) else f"{k}={type(v).__name__}" for k, v in kw.items()),
)
def test_a_plain_call_refuses_context_settings_as_a_context_call_does(tiny_llm, kwargs, monkeypatch):
    monkeypatch.setattr(tiny_llm.get_engine().model, "forward", lambda *a, **k: pytest.fail("the model ran"))
    with pytest.raises((TypeError, ValueError)) as with_context:
        tiny_llm.invoke(QUESTION, context=CONTEXT, **kwargs)
    with pytest.raises(type(with_context.value)) as plain:
        tiny_llm.invoke("Hello there.", **kwargs)
    assert str(plain.value) == str(with_context.value)


def test_a_plain_call_names_the_context_settings_it_does_not_use(tiny_llm, caplog):
    with caplog.at_level("WARNING", logger="qgpm"):
        msg = tiny_llm.invoke("Hello there.", method="vanilla", system="You are a pirate.", answer_prefix="ARRR", max_tokens=2)
    assert msg.response_metadata["qgpm"]["mode"] == "plain"
    assert "found no context and answers as plain chat, so its method=, answer_prefix= " in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="qgpm"):
        tiny_llm.invoke("Hello there.", max_tokens=2, system=None)  # None: not given
        tiny_llm.invoke(QUESTION, context=CONTEXT, method="vanilla", max_tokens=2)
    assert "so its" not in caplog.text


def test_a_call_setting_given_as_none_is_the_models_own(tiny_llm):
    msg = tiny_llm.invoke(QUESTION, context=CONTEXT, max_tokens=None, temperature=None, top_p=None)
    assert 0 < msg.usage_metadata["output_tokens"] <= tiny_llm.max_tokens
    assert tiny_llm.invoke(QUESTION, context=CONTEXT, max_tokens=2).usage_metadata["output_tokens"] <= 2


@pytest.mark.parametrize("field, kind", [("temperature", "a number"), ("max_tokens", "an int"), ("k", "an int"), ("seed", "an int")])
def test_a_bool_is_no_number_for_the_constructor(field, kind, load_calls):
    with pytest.raises(TypeError, match=f"{field} must be {kind}, got bool True"):
        QGPMChatModel(method="topk", **{field: True})


@pytest.mark.parametrize("field, value, kind", [
    ("temperature", "0.5", "a number"), ("top_p", "0.9", "a number"), ("timeout", "30", "a number"),
    ("max_tokens", "5", "an int"), ("max_tokens", 5.0, "an int"), ("seed", "3", "an int"), ("k", 2.0, "an int"),
    ("explain_k", "3", "an int"),
])
def test_the_constructor_coerces_no_string_or_float_into_a_setting(field, value, kind, load_calls):
    """As a call refuses temperature="0.5", so does the constructor (pydantic would convert it);
    an int where a number is asked for is taken as it is."""
    with pytest.raises(TypeError, match=f"{field} must be {kind}, got {type(value).__name__} {value!r}"):
        QGPMChatModel(method="topk", **{field: value})
    llm = QGPMChatModel(method="topk", temperature=1, top_p=1, timeout=30, max_tokens=5, seed=3, k=2, explain_k=0)
    assert (llm.temperature, llm.top_p, llm.timeout, llm.max_tokens, llm.seed, llm.k) == (1, 1, 30, 5, 3, 2)


def test_hosted_model_settings_are_named_as_unused(load_calls, caplog):
    with caplog.at_level("WARNING", logger="qgpm"):
        llm = QGPMChatModel(api_key="sk-secret-value", max_retries=7)
    assert "does not use api_key= or max_retries=" in caplog.text
    assert "sk-secret-value" not in caplog.text and not hasattr(llm, "api_key")
    caplog.clear()
    with caplog.at_level("WARNING", logger="qgpm"):
        QGPMChatModel(api_key=None)
        QGPMChatModel()
    assert "does not use" not in caplog.text


def test_loaded_model_needs_its_tokenizer_and_no_model_kwargs(tokenizer):
    model = tiny_model("llama", len(tokenizer))
    with pytest.raises(ValidationError, match="needs its tokenizer"):
        QGPMChatModel(model=model)
    with pytest.raises(ValidationError, match="already loaded"):
        QGPMChatModel(model=model, tokenizer=tokenizer, model_kwargs={"device_map": "cpu"})
    with pytest.raises(FileNotFoundError, match="not a head-set file"):
        QGPMChatModel(model=model, tokenizer=tokenizer, heads="/no/such/heads.json")


# --------------------------------------------------------------------------- callbacks


class CountTokens(BaseCallbackHandler):
    def __init__(self):
        self.tokens = []
        self.ends = 0

    def on_llm_new_token(self, token, **kwargs):
        self.tokens.append(token)

    def on_llm_end(self, response, **kwargs):
        self.ends += 1


class AsyncCountTokens(AsyncCallbackHandler):
    def __init__(self):
        self.tokens = []

    async def on_llm_new_token(self, token, **kwargs):
        self.tokens.append(token)


@pytest.mark.parametrize("with_context", [False, True])
def test_sync_stream_reports_every_chunk_to_callbacks(tiny_llm, with_context):
    handler = CountTokens()
    kw = {"context": CONTEXT} if with_context else {}
    chunks = list(tiny_llm.stream(QUESTION, config={"callbacks": [handler]}, **kw))
    assert len(chunks) >= 2
    assert handler.tokens == [c.content for c in chunks]
    assert handler.ends == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("handler_cls", [CountTokens, AsyncCountTokens])
async def test_async_stream_reports_every_chunk_to_callbacks(tiny_llm, handler_cls):
    handler = handler_cls()
    chunks = [c async for c in tiny_llm.astream(QUESTION, config={"callbacks": [handler]}, context=CONTEXT)]
    assert len(chunks) >= 2
    assert handler.tokens == [c.content for c in chunks]


def test_streaming_invoke_reports_tokens(tiny_llm):
    handler = CountTokens()
    llm = tiny_llm.model_copy(update={"streaming": True})
    msg = llm.invoke(QUESTION, config={"callbacks": [handler]}, context=CONTEXT)
    assert "".join(handler.tokens) == msg.content and len([t for t in handler.tokens if t]) >= 1


# --------------------------------------------------------------------------- calls checked before the weights load


@pytest.mark.parametrize("kwargs", [{"temperature": -1.0}, {"max_tokens": 2.9}, {"method": "qgmp"}, {"stop": 5}, {"timeout": -1},
                                    {"max_tokens": 3, "num_predict": 4}])
@pytest.mark.parametrize("with_context", [True, False])
def test_bad_call_values_raise_before_the_weights_load(tiny_dir, load_calls, kwargs, with_context):
    llm = QGPMChatModel(model=str(tiny_dir), heads=[(1, 0)])
    with pytest.raises((TypeError, ValueError)):
        if with_context:
            llm.invoke(QUESTION, context=CONTEXT, **kwargs)
        else:
            llm.invoke("Hello there.", **kwargs)
    assert load_calls == []


def test_num_predict_is_chat_ollamas_name_for_the_budget(tiny_llm, load_calls):
    assert QGPMChatModel(num_predict=7).max_tokens == 7
    with pytest.raises(ValidationError, match="num_predict and max_tokens name one budget"):
        QGPMChatModel(num_predict=7, max_tokens=3)
    msg = tiny_llm.invoke(QUESTION, context=CONTEXT, num_predict=3)
    assert msg.usage_metadata["output_tokens"] <= 3


def test_a_failed_call_leaves_the_plain_chat_warning_for_the_next(tokenizer, caplog):
    llm = QGPMChatModel(model=tiny_model("llama", len(tokenizer), seed=3), tokenizer=tokenizer, heads=[(1, 0)], max_tokens=2)
    with caplog.at_level("WARNING", logger="qgpm"), pytest.raises(ValueError):
        llm.invoke("Tell me a joke", temperature=-1.0)
    assert "plain" not in caplog.text
    with caplog.at_level("WARNING", logger="qgpm"):
        llm.invoke("Tell me a joke")
    assert "plain" in caplog.text


def test_the_system_field_reaches_plain_chat(tiny_llm, monkeypatch):
    seen = []
    engine = tiny_llm.get_engine()
    real = engine.chat
    monkeypatch.setattr(engine, "chat", lambda messages, **kw: (seen.append(messages), real(messages, **kw))[1])
    llm = tiny_llm.model_copy(update={"system": "You are terse."})
    llm.invoke("Hello there.")
    assert seen[-1][0] == {"role": "system", "content": "You are terse."}
    llm.invoke([("system", "Be kind."), ("human", "Hello there.")])  # the messages' own system message stays
    assert seen[-1][0] == {"role": "system", "content": "Be kind."}
    llm.invoke([("system", "Be kind."), ("human", "Hello there.")], system="Be brief.")  # a call's system= replaces it
    assert [m for m in seen[-1] if m["role"] == "system"] == [{"role": "system", "content": "Be brief."}]


def test_tool_calling_is_refused_clearly(tiny_llm):
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    with pytest.raises(NotImplementedError, match="does not take part in tool calling"):
        tiny_llm.bind_tools([])
    with pytest.raises(NotImplementedError, match="no with_structured_output.*PydanticOutputParser"):
        tiny_llm.with_structured_output({"title": "Answer", "type": "object", "properties": {"city": {"type": "string"}}})
    history = [HumanMessage(QUESTION), AIMessage("", tool_calls=[{"name": "search", "args": {}, "id": "1"}]),
               ToolMessage("found 2 docs", tool_call_id="1")]
    with pytest.raises(ValueError, match="message 1 is a AIMessage with tool_calls.*tool calling"):
        tiny_llm.invoke(history, context=CONTEXT)
    with pytest.raises(ValueError, match="message 1 is a ToolMessage"):
        tiny_llm.invoke([HumanMessage(QUESTION), ToolMessage("found 2 docs", tool_call_id="1")], context=CONTEXT)


def test_the_cache_keys_on_every_setting_that_changes_a_reply(tiny_llm):
    base = tiny_llm._identifying_params
    for update in ({"system": "Be terse."}, {"instruction": "Answer."}, {"answer_prefix": "A:"}, {"seed": 1}, {"relevance": "bm25"},
                   {"reranker": "bm25"}, {"k": 2}, {"explain_k": 0}, {"explain_html": True}, {"timeout": 5.0},
                   {"on_empty_context": "raise"}):
        assert tiny_llm.model_copy(update=update)._identifying_params != base, update


def test_cancelling_ainvoke_stops_generation(tokenizer):
    """ainvoke without streaming runs as a stream stepped from worker threads: a cancelled task
    stops the model within a step (BaseChatModel's own _agenerate left _generate running)."""
    import asyncio
    import time

    model = tiny_model("llama", len(tokenizer), seed=3, max_position_embeddings=4096)
    llm = QGPMChatModel(model=model, tokenizer=tokenizer, heads=[(1, 0)], max_tokens=2000)
    forwards = []
    handle = model.register_forward_pre_hook(lambda *a: forwards.append(time.perf_counter()))

    async def go():
        task = asyncio.create_task(llm.ainvoke("Tell me a long story."))
        while len(forwards) < 5:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        cancelled = time.perf_counter()
        await asyncio.sleep(0.5)
        return cancelled

    try:
        cancelled = asyncio.run(go())
    finally:
        handle.remove()
    assert sum(t > cancelled + 0.1 for t in forwards) == 0, "the model ran on after the task was cancelled"
    assert len(forwards) < 1000


def test_a_task_cancelled_while_its_call_waits_for_the_model_runs_nothing(tokenizer):
    """A client gone while other calls hold the model: its ainvoke / astream call gives up its
    turn and returns while the model is still held, with no forward of its own."""
    import asyncio
    import threading

    from qgpm.runtime import model_lock

    model = tiny_model("llama", len(tokenizer), seed=3)
    llm = QGPMChatModel(model=model, tokenizer=tokenizer, heads=[(1, 0)], max_tokens=8)
    forwards = []
    handle = model.register_forward_pre_hook(lambda *a: forwards.append(1))

    async def give_up(call):
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(call(), 0.3)

    async def streamed():
        return [c async for c in llm.astream("Tell me a story.")]

    lock = model_lock(model)
    lock.acquire()  # another call's turn
    try:
        for call in (lambda: llm.ainvoke("Tell me a story."), streamed):
            done = threading.Thread(target=lambda: asyncio.run(give_up(call)))
            done.start()
            done.join(timeout=10)
            assert not done.is_alive()  # returned while the model was still held
        assert forwards == []
    finally:
        lock.release()
    try:
        assert llm.invoke("Tell me a story.").content is not None and forwards  # the hook counts a call's forwards
    finally:
        handle.remove()


def test_a_model_that_fails_to_load_warns_of_nothing_first(tmp_path, caplog):
    llm = QGPMChatModel(model=str(tmp_path / "no_such_model"))
    with caplog.at_level("WARNING", logger="qgpm"), pytest.raises(FileNotFoundError, match="does not exist"):
        llm.invoke("hi")
    assert not caplog.records  # no "found no context ... plain chat" warning for a call that never ran


@pytest.mark.parametrize("kwargs,said", [
    ({"top_k": 3}, r"top_k: a generation setting: generate_kwargs=\{'top_k': \.\.\.\}"),
    ({"device_map": "cpu"}, r"device_map: a loading setting: model_kwargs=\{'device_map': \.\.\.\}"),
    ({"num_ctx": 4096}, "the model's own window is used"),
    ({"max_token": 3}, "did you mean 'max_tokens'"),
    ({"max_tokens": 3, "max_new_tokens": 3}, "max_tokens and max_new_tokens name one budget"),
    ({"seed": -1}, r"seed must be in \[0, 2\*\*64\)"),
    ({"streaming": "yes"}, "streaming"),
])
def test_arguments_of_other_chat_models_say_where_they_go(kwargs, said, load_calls):
    with pytest.raises(ValidationError, match=said):
        QGPMChatModel(**kwargs)
    assert not load_calls


def test_generation_settings_in_model_kwargs_are_sent_to_their_place(load_calls):
    with pytest.raises(ValidationError, match=r"model_kwargs holds \['max_new_tokens', 'temperature'\]: generation settings"):
        QGPMChatModel(model_kwargs={"temperature": 0.9, "max_new_tokens": 2, "device_map": "cpu"})
    assert not load_calls
