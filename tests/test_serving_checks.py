"""The vLLM client's checks that need no vLLM server: a mock HTTP server (httpx's MockTransport)
answers the calls the client makes."""

from __future__ import annotations

import json

import httpx
import pytest

from qgpm import ContextTooLongError, QGPM, QGPMConfig
from qgpm.config import RECIPE
from qgpm.runtime import decoder_layers
from qgpm.serving import _TOKENIZER_PROBE, VLLMServer

from qgpm_testing import tiny_model


def test_a_servers_shorter_window_is_checked_before_pass1(tokenizer):
    """A prompt that fits the model but not the server's --max-model-len is refused before any
    forward of pass 1 (a mock server: its models list, tokenizer probe and completions)."""
    def handler(request):
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 300}]})
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": tokenizer(_TOKENIZER_PROBE, add_special_tokens=False).input_ids})
        if request.url.path == "/v1/completions":
            event = {"choices": [{"token_ids": [42], "finish_reason": "length"}]}
            return httpx.Response(200, text=f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n")
        return httpx.Response(404)

    server = VLLMServer("http://vllm.test:8000")
    server._client = httpx.Client(base_url=server.base_url, transport=httpx.MockTransport(handler))
    model = tiny_model("llama", len(tokenizer))
    engine = QGPM(model, tokenizer, heads=[(1, 0), (2, 1)], generator=server, reuse_prefill=False)
    assert engine.max_length == 300
    forwards = []
    decoder_layers(model)[0].register_forward_pre_hook(lambda *a: forwards.append(1))
    with pytest.raises(ContextTooLongError, match="window of 300 tokens"):
        engine.answer(" ".join(f"Sentence {i} is about topic {i}." for i in range(60)), "What about topic 7?", max_new_tokens=4, config=engine.config.with_(relevance="heads"))
    assert forwards == []
    engine.use_generator(None)
    assert engine.max_length == model.config.max_position_embeddings


CONTEXT = " ".join(f"Sentence {i} is about topic {i}." for i in range(20))


def sse(*choices) -> str:
    return "".join(f"data: {json.dumps({'choices': [c]})}\n\n" for c in choices) + "data: [DONE]\n\n"


def mock_engine(tokenizer, completions, *, n_layers_loaded=None, **server_kw):
    """An engine on a tiny model whose generator is a mock vLLM server; ``completions(body)`` answers
    /v1/completions. Returns the engine and the request bodies the server received."""
    bodies = []

    def handler(request):
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 2048}]})
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": tokenizer(_TOKENIZER_PROBE, add_special_tokens=False).input_ids})
        bodies.append(json.loads(request.content))
        return completions(bodies[-1])

    server = VLLMServer("http://vllm.test:8000", **server_kw)
    server._client = httpx.Client(base_url=server.base_url, transport=httpx.MockTransport(handler))
    return QGPM(tiny_model("llama", len(tokenizer)), tokenizer, heads=[(1, 0)], generator=server, reuse_prefill=False), bodies


def test_answer_text_without_token_ids_is_an_error_not_an_empty_answer(tokenizer):
    """A server (or a proxy) that drops return_token_ids sends text only: refused, naming the cause."""
    from qgpm.serving import ServerResponseError

    engine, _ = mock_engine(tokenizer, lambda b: httpx.Response(200, text=sse({"text": " The answer", "finish_reason": None},
                                                                              {"text": " is 42.", "finish_reason": "stop"})))
    with pytest.raises(ServerResponseError, match="without its token ids.*0.10.2"):
        engine.answer(CONTEXT, "What about topic 7?", method="vanilla", max_new_tokens=8)
    with pytest.raises(ServerResponseError, match="without its token ids"):
        list(engine.stream(CONTEXT, "What about topic 7?", method="vanilla", max_new_tokens=8))


def test_an_aborted_answer_raises_instead_of_passing_as_complete(tokenizer):
    from qgpm.serving import ServerStreamError

    ids = tokenizer(" The answer", add_special_tokens=False).input_ids
    reason = {"value": "abort"}
    engine, _ = mock_engine(tokenizer, lambda b: httpx.Response(200, text=sse({"text": "", "token_ids": ids, "finish_reason": None},
                                                                              {"text": "", "token_ids": [], "finish_reason": reason["value"]})))
    with pytest.raises(ServerStreamError, match="finish_reason 'abort'.*retry"):
        engine.answer(CONTEXT, "What about topic 7?", method="vanilla", max_new_tokens=8)
    reason["value"] = "stop"
    res = engine.answer(CONTEXT, "What about topic 7?", method="vanilla", max_new_tokens=8)
    assert res.text == "The answer" and res.finish_reason == "stop"


def test_the_request_body_means_what_the_in_process_call_means(tokenizer):
    """Unset top_k / min_p are sent as no cut (else vLLM takes the checkpoint's generation_config);
    an extra given as None is unset, not a null the server rejects; a given value is sent."""
    done = sse({"text": "", "token_ids": [42], "finish_reason": "length"})
    engine, bodies = mock_engine(tokenizer, lambda b: httpx.Response(200, text=done))
    engine.answer(CONTEXT, "What about topic 7?", method="vanilla", max_new_tokens=1, temperature=0.7, seed=1, min_new_tokens=None)
    assert bodies[-1]["top_k"] == 0 and bodies[-1]["min_p"] == 0.0 and "min_tokens" not in bodies[-1]
    engine.answer(CONTEXT, "What about topic 7?", method="vanilla", max_new_tokens=1, temperature=0.7, seed=1, top_k=5, min_p=0.1)
    assert bodies[-1]["top_k"] == 5 and bodies[-1]["min_p"] == 0.1


def test_a_busy_connection_pool_is_named_as_such(tokenizer):
    from qgpm.serving import ServerTimeoutError

    with pytest.raises(ValueError, match="max_connections must be an integer >= 1"):
        VLLMServer("http://vllm.test:8000", max_connections=0)
    engine, _ = mock_engine(tokenizer, lambda b: httpx.Response(200, text=""), max_connections=3)
    err = engine.generator._fault(httpx.PoolTimeout("no free connection"), "the answer")
    assert isinstance(err, ServerTimeoutError) and "3 connections" in str(err) and "was never sent" in str(err)
    assert "sent nothing" in str(engine.generator._fault(httpx.ReadTimeout("slow"), "the answer"))


def test_the_advice_to_run_in_process_fits_the_engine(tokenizer):
    """An engine with pass 1's layers only cannot go back in process: the refusal says to build one
    with every layer instead of pointing at use_generator(None)."""
    from qgpm.partial import LayersNotLoadedError
    from qgpm.serving import RemoteGenerationUnsupported

    engine, _ = mock_engine(tokenizer, lambda b: httpx.Response(200, text=""))
    with pytest.raises(RemoteGenerationUnsupported, match=r"use_generator\(None\)"):
        engine.answer(CONTEXT, "What about topic 7?", method="string")
    import copy

    from qgpm.partial import FULL_CONFIG_ATTR

    model = tiny_model("llama", len(tokenizer), num_hidden_layers=1)  # pass 1's layer of a 3-layer checkpoint
    full = copy.deepcopy(model.config)
    full.num_hidden_layers = 3
    setattr(model, FULL_CONFIG_ATTR, full)
    server = VLLMServer("http://vllm.test:8000")
    server._client = engine.generator._client
    partial = QGPM(model, tokenizer, heads=[(0, 0)], generator=server, reuse_prefill=False)
    with pytest.raises(RemoteGenerationUnsupported, match="pass1_layers_only=False: this one holds 1 of 3") as info:
        partial.answer(CONTEXT, "What about topic 7?", method="string")
    assert "use_generator(None)" not in str(info.value)
    with pytest.raises(LayersNotLoadedError):
        partial.use_generator(None)
    partial.set_heads([(2, 0)])  # a head in a layer not loaded
    # the paper's method reads it and needs per-plane positions: the server's refusal comes first
    with pytest.raises(RemoteGenerationUnsupported, match="remap='stride'"):
        partial.answer(CONTEXT, "What about topic 7?", config=QGPMConfig.paper())
    # under a plan the server can run, the missing layer is named
    with pytest.raises(LayersNotLoadedError, match=r"pass 1 over heads \[\(2, 0\)\].*holds 1 of 3.*config=\.\.\.\)\), or with "
                                                   "pass1_layers_only=False"):
        partial.answer(CONTEXT, "What about topic 7?", config=RECIPE.with_(relevance="heads"))


def test_a_server_whose_only_model_has_another_name_is_named_in_a_warning(tokenizer, caplog):
    """The tokenizer check cannot tell apart checkpoints that share a tokenizer: when the server's
    only model is taken without model= and its name is not the engine's, a warning says so;
    model= given, or a served name that is the engine's, says nothing."""
    import logging

    from qgpm.serving import _names_meet

    with caplog.at_level(logging.WARNING, logger="qgpm"):
        engine, _ = mock_engine(tokenizer, lambda b: httpx.Response(200, text=""))
    said = [r.getMessage() for r in caplog.records if "serves 'm'" in r.getMessage()]
    assert len(said) == 1 and f"the engine's model is {engine.name!r}" in said[0] and "Pass model='m'" in said[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="qgpm"):
        mock_engine(tokenizer, lambda b: httpx.Response(200, text=""), model="m")
    assert not [r for r in caplog.records if "serves 'm'" in r.getMessage()]
    assert _names_meet(["SmolLM2-135M-Instruct", None], ["SmolLM2-135M-Instruct", "/root/.cache/qgpm/models/x"])
    assert _names_meet(["mymodel", "/tmp/trial/mymodel/"], ["/tmp/trial/MyModel", None])
    assert _names_meet(["Qwen2.5-1.5B", "Qwen/Qwen2.5-1.5B"], ["Qwen/Qwen2.5-1.5B"])
    assert not _names_meet(["mymodel", "/tmp/mymodel"], ["SmolLM2-135M-Instruct", "/cache/models/smollm2-abc"])


def test_a_usage_event_with_no_choices_ends_the_answer_as_any_other_client_reads_it(tokenizer):
    """OpenAI-style servers (vLLM with include_usage, proxies) end a stream with a chunk whose
    choices are empty, carrying the usage: skipped, the answer kept."""
    ids = tokenizer(" The answer", add_special_tokens=False).input_ids
    body = (f"data: {json.dumps({'choices': [{'text': '', 'token_ids': ids, 'finish_reason': 'stop'}]})}\n\n"
            f"data: {json.dumps({'choices': [], 'usage': {'prompt_tokens': 9, 'completion_tokens': 2}})}\n\ndata: [DONE]\n\n")
    engine, _ = mock_engine(tokenizer, lambda b: httpx.Response(200, text=body))
    assert engine.answer(CONTEXT, "What about topic 7?", method="vanilla", max_new_tokens=8).text == "The answer"


def test_a_page_that_is_not_a_completion_stream_is_named_as_such(tokenizer):
    """A 200 answer that is no event stream (a proxy's login page) is the body's fault, said so,
    not a server that stopped mid-answer."""
    from qgpm.serving import ServerResponseError

    engine, _ = mock_engine(tokenizer, lambda b: httpx.Response(200, text="<html><body>Please log in</body></html>\n"))
    with pytest.raises(ServerResponseError, match="not a completion stream.*Please log in"):
        engine.answer(CONTEXT, "What about topic 7?", method="vanilla", max_new_tokens=8)


def test_a_closed_server_client_says_so(tokenizer):
    """After VLLMServer.close() calls fail with a ServingError that names the close, not the server."""
    from qgpm.serving import ServingError

    engine, _ = mock_engine(tokenizer, lambda b: httpx.Response(200, text=sse({"text": "", "token_ids": [42], "finish_reason": "length"})))
    engine.answer(CONTEXT, "What about topic 7?", method="vanilla", max_new_tokens=2)
    engine.generator.close()
    with pytest.raises(ServingError, match="was closed"):
        engine.answer(CONTEXT, "What about topic 7?", method="vanilla", max_new_tokens=2)
    with pytest.raises(ServingError, match="was closed"):
        engine.generator._request("GET", "/v1/models")


def test_the_cli_passes_its_vllm_timeout_to_the_client(monkeypatch, capsys):
    """qgpm ask --vllm-timeout reaches VLLMServer(timeout=), which the timeout error tells a user to raise."""
    import qgpm.cli

    seen = {}

    def fake(url, **kw):
        seen.update(kw)
        raise ValueError("stopped here")

    monkeypatch.setattr(qgpm.cli, "VLLMServer", fake)
    assert qgpm.cli.main(["ask", "--vllm-url", "http://vllm.test:8000", "--vllm-timeout", "600", "--methods", "vanilla"]) == 2
    assert seen["timeout"] == 600.0 and "stopped here" in capsys.readouterr().err
