"""Generation on a real vLLM server (qgpm.serving.VLLMServer) against the in-process path.

The module starts vLLM's OpenAI-compatible server once (``scripts/vllm_server.sh`` on a free
port of 127.0.0.1, the embedded SmolLM2 from qgpm's de-quantized cache folder) and stops it at
the end; the last test kills it mid-answer. Everything skips, with the reason, where the
vLLM environment (``.venv-vllm``, made by ``bash scripts/setup_vllm.sh``) was not built.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import torch

from qgpm import QGPM
from qgpm.decoding import Decoding
from qgpm.partial import LayersNotLoadedError
from qgpm.serving import (
    RemoteGenerationUnsupported,
    ServedModelMismatchError,
    ServerResponseError,
    ServerStreamError,
    ServerTimeoutError,
    ServerUnreachableError,
    ServingError,
    VLLMServer,
)

from qgpm_testing import NEEDLE_FILLER as FILLER

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="the vLLM environment is not built (bash scripts/setup_vllm.sh makes .venv-vllm)"),
]

NEEDLE = "The code for the harbour gate is 5183."
QUESTION = "What is the code for the harbour gate?"
# modulates at this length: the plan moves the needle, pass 2 runs in slot order
MOVING = dict(keep_length=0.0, min_top_z=None, decisive_margin=None)


def haystack(n: int = 30, where: int = 9) -> str:
    sents = [FILLER[i % len(FILLER)] for i in range(n)]
    sents.insert(where, NEEDLE)
    return " ".join(sents)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The running server: ``(url, process)``; stopped with SIGTERM at the end (it must exit)."""
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["bash", str(ROOT / "scripts" / "vllm_server.sh"), "--port", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the vLLM server exited with {proc.returncode} before it was ready:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the vLLM server was not ready within 900 s:\n{log.read_text()[-3000:]}")
        time.sleep(1)
    yield url, proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("the vLLM server did not stop within 120 s of SIGTERM")


@pytest.fixture(scope="module")
def pair(server, smollm):
    """Two engines on the embedded model: in process, and generating on the server (with only
    the decoder layers pass 1 reads, the default with a remote generator)."""
    remote = QGPM.from_pretrained(generator=VLLMServer(server[0]))
    return smollm, remote


@pytest.fixture(scope="module")
def whole_remote(server):
    """Generating on the server with every layer loaded here (``score=`` and going back in process)."""
    return QGPM.from_pretrained(generator=VLLMServer(server[0]), pass1_layers_only=False)


def test_the_server_is_checked_when_attached(pair, server, caplog):
    local, remote = pair
    srv = remote.generator
    assert srv.model == local.name and srv.max_model_len == 8192
    assert remote.local is not srv and remote.heads == local.heads and remote.fingerprint == local.fingerprint
    # the preset ranks with MiniLM: one layer here; with the heads, the layers up to the deepest one
    assert local.config.relevance == "minilm" and (remote.layers_loaded, remote.n_layers) == (1, local.n_layers)
    with_heads = QGPM.from_pretrained(generator=VLLMServer(server[0]), config=local.config.with_(relevance="heads"))
    assert with_heads.layers_loaded == max(layer for layer, _ in local.heads) + 1 and 0 < with_heads.weights_not_loaded < remote.weights_not_loaded
    caplog.clear()  # only the three engines below
    with caplog.at_level(logging.WARNING, logger="qgpm"):
        QGPM.from_pretrained(generator=VLLMServer(server[0]))  # reuse_prefill (default True) cannot apply remotely: said
        QGPM.from_pretrained(generator=VLLMServer(server[0]), pass1_layers_only=False)
        QGPM.from_pretrained(generator=VLLMServer(server[0]), pass1_layers_only=False, reuse_prefill=False)
    assert len([r for r in caplog.records if "reuse_prefill does not apply with the vllm generator" in r.getMessage()]) == 2


def test_greedy_answers_and_token_ids_equal_the_in_process_path(pair):
    local, remote = pair
    ctx = haystack()
    cfg = local.config.with_(**MOVING)
    dec = Decoding.check(max_new_tokens=24)
    cases = [("vanilla", {}), ("qgpm", {"config": cfg}), ("oracle", {"config": cfg, "evidence": [NEEDLE]}), ("topk", {"k": 3}),
             ("reorder", {})]
    for method, kw in cases:
        call = local.prepare(ctx, QUESTION, method=method, max_new_tokens=24, **kw)
        if method in ("qgpm", "oracle"):
            assert not call.plan.is_standard() and call.plan.feed_order() is not None  # the plan moves the needle: slot order
        want = local.local.generate(call, dec)
        got = remote.generator.generate(call, dec)
        assert got.token_ids == want.token_ids, method
        a = local.answer(ctx, QUESTION, method=method, max_new_tokens=24, **kw)
        b = remote.answer(ctx, QUESTION, method=method, max_new_tokens=24, **kw)
        assert (b.text, b.finish_reason, b.usage.answer_tokens) == (a.text, a.finish_reason, a.usage.answer_tokens), method
        assert b.details["generator"] == "vllm" and "5183" in a.text, method
        if method == "qgpm":
            assert b.details["pass2"] == a.details["pass2"] == "slot order"
            assert [s.index for s in b.top_sentences(3)] == [s.index for s in a.top_sentences(3)]
    # transformers' min_new_tokens is the server's min_tokens: the end of sequence waits as long in both
    a = local.answer(ctx, QUESTION, method="vanilla", max_new_tokens=40, min_new_tokens=40)
    b = remote.answer(ctx, QUESTION, method="vanilla", max_new_tokens=40, min_new_tokens=40)
    assert a.usage.answer_tokens == b.usage.answer_tokens == 40 and a.text == b.text
    msgs = [{"role": "user", "content": "Name three colours of the rainbow."}]
    assert remote.chat(msgs, max_new_tokens=20).text == local.chat(msgs, max_new_tokens=20).text


def test_streaming_and_stop_strings_match(pair, whole_remote):
    local, remote = pair
    ctx = haystack(24, 5)
    cfg = local.config.with_(**MOVING)
    for stop in (None, ["5183"], [" is"]):
        a = local.answer(ctx, QUESTION, config=cfg, max_new_tokens=20, stop=stop)
        with remote.stream(ctx, QUESTION, config=cfg, max_new_tokens=20, stop=stop) as s:
            pieces = list(s)
        assert "".join(pieces) == s.result.text == a.text, stop
        assert s.result.finish_reason == a.finish_reason
    # the gold log-prob with a remote generator comes from this process's own prefill
    call = local.prepare(ctx, QUESTION, config=cfg, max_new_tokens=8)
    with pytest.raises(LayersNotLoadedError, match="pass1_layers_only=False"):
        remote.generate_prepared(call, max_new_tokens=8, score=" 5183")
    scored = whole_remote.generate_prepared(call, max_new_tokens=8, score=" 5183")
    assert scored.text == remote.generate_prepared(call, max_new_tokens=8).text
    assert abs(scored.details["score_logprob"] - local.generate_prepared(call, max_new_tokens=8, score=" 5183").details["score_logprob"]) < 1e-4


def test_plans_the_server_cannot_run_are_refused_before_pass1(pair, monkeypatch):
    _, remote = pair
    import qgpm.pass1

    def pass1_ran(*a, **k):
        raise AssertionError("pass 1 ran for a call the server cannot run")

    monkeypatch.setattr(qgpm.pass1, "head_token_logits", pass1_ran)
    ctx = haystack()
    with pytest.raises(RemoteGenerationUnsupported, match="remap='reorder'"):
        remote.answer(ctx, QUESTION, config=remote.config.with_(remap="stride"))
    with pytest.raises(RemoteGenerationUnsupported, match="split_layer=0"):
        remote.answer(ctx, QUESTION, config=remote.config.with_(split_layer=15))
    with pytest.raises(RemoteGenerationUnsupported, match="inside attention"):
        remote.answer(ctx, QUESTION, method="string")
    with pytest.raises(RemoteGenerationUnsupported):
        remote.stream(ctx, QUESTION, method="self-extend")
    with pytest.raises(TypeError, match="logits_processor"):
        remote.answer(ctx, QUESTION, method="vanilla", logits_processor=[])
    with pytest.raises(TypeError, match="not decoding settings a vLLM server takes"):  # a qgpm call: refused before pass 1
        remote.answer(ctx, QUESTION, typical_p=0.5)


def test_faults_get_named_errors_in_bounded_time_and_the_engine_stays_usable(pair, server):
    local, remote = pair
    url = server[0]
    dead = f"http://127.0.0.1:{_free_port()}"
    t = time.monotonic()
    with pytest.raises(ServerUnreachableError, match="scripts/vllm_server.sh"):
        remote.use_generator(VLLMServer(dead, connect_timeout=2))
    assert time.monotonic() - t < 10
    with pytest.raises(ServedModelMismatchError, match="does not serve 'other-model'"):
        remote.use_generator(VLLMServer(url, model="other-model"))
    tiny = QGPM(_other_tokenizer_model(), _other_tokenizer(), heads=[(0, 0)])
    with pytest.raises(ServedModelMismatchError, match="tokenizes text differently"):
        tiny.use_generator(VLLMServer(url))
    assert remote.generator.model == local.name  # the failed attaches left the engine's generator as it was
    ctx = haystack(12, 3)
    try:
        hurried = VLLMServer(url)
        remote.use_generator(hurried)
        hurried.timeout = 0.001  # read when the answer's request is sent
        with pytest.raises(ServerTimeoutError, match="timeout="):
            remote.answer(ctx, QUESTION, method="vanilla", max_new_tokens=8)
        renamed = VLLMServer(url)
        remote.use_generator(renamed)
        renamed.model = "renamed"  # the server answers a request for a model it does not serve with an HTTP error
        with pytest.raises(ServerResponseError, match="HTTP 404"):
            remote.answer(ctx, QUESTION, method="vanilla", max_new_tokens=8)
    finally:
        remote.use_generator(VLLMServer(url))
    assert remote.answer(ctx, QUESTION, method="vanilla", max_new_tokens=8).text == local.answer(ctx, QUESTION, method="vanilla", max_new_tokens=8).text
    assert isinstance(ServerTimeoutError("x"), ServingError) and isinstance(ServingError("x"), ConnectionError)


def test_cli_ask_with_vllm_url_prints_the_in_process_answer(server, tmp_path, capsys):
    from qgpm.cli import main

    doc = tmp_path / "notes.txt"
    doc.write_text("The depot opens at six. " * 30 + "The spare key of the depot hangs in the blue cabinet. " + "Trucks leave at nine. " * 30)
    q = "Where does the spare key of the depot hang?"
    assert main(["ask", "--quiet", "--methods", "qgpm", "--context", str(doc), q]) == 0
    here = capsys.readouterr().out
    assert main(["ask", "--quiet", "--methods", "qgpm", "--vllm-url", server[0], "--context", str(doc), q]) == 0
    assert capsys.readouterr().out == here and "cabinet" in here
    # the preset ranks with MiniLM (one layer loaded here); asking for the heads loads their layers
    heads = ["ask", "--quiet", "--methods", "qgpm", "--config", "relevance=heads", "--context", str(doc), q]
    assert main(heads) == 0
    here = capsys.readouterr().out
    assert main([*heads[:-3], "--vllm-url", server[0], *heads[-3:]]) == 0
    assert capsys.readouterr().out == here
    assert main(["ask", "--quiet", "--methods", "string", "--vllm-url", server[0], "--context", str(doc), q]) == 2
    assert "inside attention" in capsys.readouterr().err


def test_many_calls_in_flight_answer_as_one_at_a_time(pair):
    import asyncio

    local, remote = pair
    reqs = [dict(context=haystack(14 + i, 3 + i), question=QUESTION, method=m, max_new_tokens=10)
            for i, m in enumerate(("vanilla", "qgpm", "reorder", "qgpm"))]
    many = remote.answer_many(reqs, max_concurrency=4)
    assert [r.text for r in many] == [local.answer(**r).text for r in reqs]

    async def gather():
        return await asyncio.gather(*(remote.aanswer(**r) for r in reqs[:2]))

    assert [r.text for r in asyncio.run(gather())] == [r.text for r in many[:2]]
    with pytest.raises(TypeError, match="'context' and 'question'"):
        remote.answer_many([{"context": "x"}])
    with pytest.raises(ValueError, match="max_concurrency"):
        remote.answer_many(reqs, max_concurrency=0)
    assert remote.answer_many([]) == []


def test_the_framework_adapters_take_vllm_url(server, smollm):
    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    from langchain_core.messages import HumanMessage, SystemMessage

    from qgpm_integrations.langchain import QGPMChatModel
    from qgpm_integrations.llama_index import QGPMLLM

    url = server[0]
    ctx = haystack(20, 14)
    msgs = [SystemMessage(f"Answer from the context.\n\nContext:\n{ctx}"), HumanMessage(QUESTION)]
    here = QGPMChatModel(max_new_tokens=16).invoke(msgs)
    there = QGPMChatModel(max_new_tokens=16, vllm_url=url).invoke(msgs)
    assert there.content == here.content and "5183" in there.content
    assert there.response_metadata["qgpm"]["method"] == "qgpm"
    batch = QGPMChatModel(max_new_tokens=16, vllm_url=url).batch([msgs, msgs[:1] + [HumanMessage("What sold bread?")]],
                                                                 config={"max_concurrency": 2})
    assert batch[0].content == here.content
    with pytest.raises(ValueError, match="vllm_url"):
        QGPMChatModel(engine=smollm, vllm_url=url)
    prompt = f"Context:\n{ctx}\n\nQuestion: {QUESTION}\nAnswer:"
    li_here = QGPMLLM(engine=smollm, max_new_tokens=16).complete(prompt).text
    assert QGPMLLM(vllm_url=url, max_new_tokens=16).complete(prompt).text == li_here


def test_a_server_dying_mid_answer_raises_and_the_engine_goes_on(pair, whole_remote, server):
    """Last in the module: kills the server."""
    local, _ = pair
    remote = whole_remote
    url, proc = server
    msgs = [{"role": "user", "content": "Write the numbers from 1 to 400 in words, separated by commas."}]
    stream = remote.stream_chat(msgs, max_new_tokens=1500)
    t = time.monotonic()
    with pytest.raises(ServingError) as info:
        for i, _ in enumerate(stream):
            if i == 3:
                os.killpg(proc.pid, signal.SIGKILL)
    assert isinstance(info.value, ServerStreamError | ServerUnreachableError), info.value
    assert time.monotonic() - t < 120
    proc.wait(timeout=60)
    with pytest.raises(ServerUnreachableError):
        remote.answer(haystack(8, 2), QUESTION, method="vanilla", max_new_tokens=4)
    remote.use_generator(None)  # in process again: the engine is as it was
    assert remote.answer(haystack(8, 2), QUESTION, method="vanilla", max_new_tokens=6).text == local.answer(
        haystack(8, 2), QUESTION, method="vanilla", max_new_tokens=6).text


def _other_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "tide", "gauge", "the", "a", "."]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token=".", pad_token="[UNK]")


def _other_tokenizer_model():
    from qgpm_testing import tiny_model

    torch.manual_seed(0)
    return tiny_model("llama", 6)
