"""The vLLM client's checks that need no vLLM server: a mock HTTP server (httpx's MockTransport)
answers the calls the client makes."""

from __future__ import annotations

import json

import httpx
import pytest

from qgpm import ContextTooLongError, QGPM
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
