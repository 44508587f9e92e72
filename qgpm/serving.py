"""Generation on a vLLM server: pass 2 and decoding over HTTP, pass 1 in this process.

    from qgpm import QGPM
    from qgpm.serving import VLLMServer
    engine = QGPM.from_pretrained(generator=VLLMServer("http://127.0.0.1:8000"))
    engine.answer(context, question)          # pass 1 here, the answer from the server

Every call whose pass 2 is one plain forward over some token order runs there: ``vanilla``,
``topk``, ``reorder``, ``llmlingua-2``, plain chat, and ``qgpm`` / ``oracle`` under
``remap="reorder"`` with one map (the prompt fed in slot order,
:meth:`~qgpm.rope.PositionPlan.feed_order`), including every call that falls back to vanilla
positions. The server gets token ids (``/v1/completions`` with a list of ids as ``prompt``),
so the text the model reads is exactly the engine's. A plan that needs per-plane positions or
per-layer masks (``remap="stride"`` / ``"move"``, two maps, STRING / Ms-PoE / Self-Extend)
raises :class:`RemoteGenerationUnsupported` before pass 1 (``docs/serving.md`` says what
running those inside vLLM would take).

The server is vLLM's OpenAI-compatible one (``scripts/vllm_server.sh``), serving the same
model: :meth:`VLLMServer.attach` checks its tokenizer against the engine's when the engine is
built. Faults raise a :class:`ServingError` subclass within the timeouts, and the engine stays
usable.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Iterator

import httpx

from .config import QGPMConfig
from .decoding import Decoding
from .generation import Generated, pass2_inputs, pass2_kind
from .limits import ContextTooLongError
from .methods import MethodSpec, Stage
from .plan import reorder_needs_masks
from .results import PreparedCall
from .rope import PositionPlan

logger = logging.getLogger("qgpm")

__all__ = ["VLLMServer", "check_remote_extras", "ServingError", "ServerUnreachableError", "ServerTimeoutError", "ServerResponseError", "ServerStreamError",
           "ServedModelMismatchError", "RemoteGenerationUnsupported"]

# a probe whose token ids tell two tokenizers apart (words, digits, punctuation, a special-token string as text)
_TOKENIZER_PROBE = "Tide gauge 4471 calibrated by Ms. O'Neill, 2019-03-07; café <|im_end|> naïve  spacing\n\tend."
# decoding arguments beyond Decoding's own (transformers' generate() names) -> the server's names for them
_PASSED_EXTRAS = {"top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repetition_penalty", "min_new_tokens": "min_tokens"}


def check_remote_extras(extra: Any) -> None:
    """Raise ``TypeError`` for decoding extras (``generate()``-style keywords) a vLLM server does not take."""
    unknown = sorted(k for k in extra if k not in _PASSED_EXTRAS)
    if unknown:
        raise TypeError(f"{', '.join(unknown)}: not decoding settings a vLLM server takes (it takes {', '.join(_PASSED_EXTRAS)}); "
                        "run in process for transformers' generate() arguments")


class ServingError(ConnectionError):
    """A call to the generation server failed; the message says what to do. The engine is unchanged."""


class ServerUnreachableError(ServingError):
    """Nothing answers at the server's address."""


class ServerTimeoutError(ServingError):
    """The server did not answer within the timeout."""


class ServerResponseError(ServingError):
    """The server answered with an HTTP error or with something that is not a completion."""


class ServerStreamError(ServingError):
    """The server's answer stopped before it was complete (the server died or closed the connection)."""


class ServedModelMismatchError(ServingError):
    """The server does not serve the engine's model as far as the client can tell: not the name
    given as ``model=`` (or not exactly one model when none is given), or a tokenizer that encodes
    a probe text differently. Checkpoints sharing a tokenizer pass the tokenizer check: name the
    served model with ``model=`` to check the name too."""


def _engine_names(engine: Any) -> list[Any]:
    """What the engine's model is called: its name, the folder or id it was loaded from."""
    source = getattr(engine, "source", None)
    return [engine.name, getattr(source, "path", None), getattr(getattr(engine.model, "config", None), "_name_or_path", None)]


def _names_meet(ours: list[Any], theirs: list[Any]) -> bool:
    """Whether a name or path of one list names the same model as one of the other (last path part, case aside)."""
    def last(name: Any) -> str:
        return str(name).replace("\\", "/").rstrip("/").rpartition("/")[2].lower()

    return bool({last(n) for n in ours if n} & {last(n) for n in theirs if n})


class RemoteGenerationUnsupported(ValueError):
    """This method or setting needs per-plane positions or masks, which the server cannot apply."""


class VLLMServer:
    """A vLLM OpenAI-compatible server as the engine's generator (:class:`qgpm.generation.Generator`).

    ``base_url``: the server, e.g. ``"http://127.0.0.1:8000"`` (``/v1`` is added);
    ``model``: the served model name (default: the only one the server lists);
    ``timeout``: seconds to wait for each answer chunk (a long prompt's prefill comes first; calls
    queued on a busy server wait for the prefills before theirs), read when each request is sent;
    ``connect_timeout``: seconds to wait for a connection; ``api_key``: sent as a bearer token
    (the server's ``--api-key``); ``max_connections``: calls in flight at once.
    One instance is shared by every thread of the engine; :meth:`close` releases its connections.
    """

    name = "vllm"

    def __init__(self, base_url: str, *, model: str | None = None, timeout: float = 120.0, connect_timeout: float = 5.0,
                 api_key: str | None = None, max_connections: int = 64) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be the server's http(s) address, e.g. 'http://127.0.0.1:8000', got {base_url!r}")
        for label, value in (("timeout", timeout), ("connect_timeout", connect_timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{label} must be a positive number of seconds, got {value!r}")
        if model is not None and (not isinstance(model, str) or not model):
            raise ValueError(f"model must be the served model's name, got {model!r}")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
            raise ValueError(f"max_connections must be an integer >= 1, got {max_connections!r}")
        root = base_url.rstrip("/")
        self.base_url = root[: -len("/v1")] if root.endswith("/v1") else root
        self.model = model
        self.timeout, self.connect_timeout, self.max_connections = float(timeout), float(connect_timeout), max_connections
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.base_url, headers=headers,
                                    limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections))
        self._closed = False
        self.max_model_len: int | None = None
        self._n_layers: int | None = None
        self._tokenizer: Any = None
        self._in_process = "engine.use_generator(None)"  # how a call runs in process instead (set by attach)

    def __repr__(self) -> str:
        return f"VLLMServer({self.base_url!r}, model={self.model!r})"

    # ------------------------------------------------------------------ setup
    def attach(self, engine: Any) -> None:
        """Check that the server serves ``engine``'s model: the model name (when given, else the
        only one listed) and the tokenizer (a probe text must give the same token ids); raises
        :class:`ServedModelMismatchError`. The server's window (``max_model_len``) is read here and
        checked per call: a prompt that does not fit raises :class:`~qgpm.limits.ContextTooLongError`."""
        listed = self._request("GET", "/v1/models").get("data") or []
        names = [m.get("id") for m in listed]
        chosen = self.model is None
        if chosen:
            if len(names) != 1:
                raise ServedModelMismatchError(f"the server at {self.base_url} serves {names or 'no models'}: pass model=<name> to VLLMServer")
            self.model = names[0]
        elif self.model not in names:
            raise ServedModelMismatchError(f"the server at {self.base_url} does not serve {self.model!r} (it serves {names}): "
                                           "pass one of those as model=, or start the server with this model")
        entry = listed[names.index(self.model)]
        want = engine.tokenizer(_TOKENIZER_PROBE, add_special_tokens=False).input_ids
        got = self._request("POST", "/tokenize", json={"model": self.model, "prompt": _TOKENIZER_PROBE, "add_special_tokens": False}).get("tokens")
        if got != want:
            raise ServedModelMismatchError(f"the server's model {self.model!r} tokenizes text differently from the engine's {engine.name!r}: "
                                           "it serves another model. Serve the engine's model folder (scripts/vllm_server.sh, "
                                           "qgpm.loading.model_folder) or build the engine from the served model.")
        if chosen and not _names_meet(_engine_names(engine), [entry.get("id"), entry.get("root")]):
            logger.warning("qgpm: the server at %s serves %r (from %r) and the engine's model is %r: their tokenizers agree, as "
                           "those of checkpoints sharing a tokenizer do, so if the server runs another checkpoint the answers come "
                           "from it. Pass model=%r to VLLMServer to confirm it serves the engine's model (that silences this)",
                           self.base_url, self.model, entry.get("root"), engine.name, self.model)
        self.max_model_len = entry.get("max_model_len")
        self._n_layers = engine.n_layers
        self._in_process = ("engine.use_generator(None)" if engine.layers_loaded == engine.n_layers else
                            f"an engine built with pass1_layers_only=False: this one holds {engine.layers_loaded} of {engine.n_layers} "
                            "layers, the ones pass 1 reads")
        self._tokenizer = engine.tokenizer

    def close(self) -> None:
        """Close the connections (the server keeps running). Calls still in flight end with a
        :class:`ServingError` that says so; later calls are refused."""
        self._closed = True
        self._client.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ServingError(f"this VLLMServer ({self.base_url}) was closed: make a new one, or attach it again with "
                               "engine.use_generator(VLLMServer(...))")

    # ------------------------------------------------------------------ the Generator protocol
    def check(self, spec: MethodSpec | None, config: QGPMConfig) -> None:
        """Raise :class:`RemoteGenerationUnsupported` for a method whose pass 2 the server cannot run
        under ``config`` (checked before pass 1), saying which setting to change."""
        if self._tokenizer is None:
            raise ServingError("this VLLMServer is not attached to an engine: pass it as QGPM(..., generator=) or engine.use_generator()")
        if spec is None or spec.plain_forward:
            return
        if spec.stage is Stage.ATTENTION:
            raise RemoteGenerationUnsupported(f"method={spec.name!r} changes positions inside attention, which a vLLM server cannot "
                                              f"apply: run it in process ({self._in_process}) or pick another method")
        if config.remap != "reorder":
            raise RemoteGenerationUnsupported(
                f"method={spec.name!r} with remap={config.remap!r} needs per-plane rotary positions, which a vLLM server cannot apply: "
                f"set remap='reorder' with one map (split_layer=0, unmodulated_layers=0), or run in process ({self._in_process})")
        if reorder_needs_masks(config, self._n_layers or 0):
            raise RemoteGenerationUnsupported(
                f"method={spec.name!r} with remap='reorder' and split_layer={config.split_layer}, unmodulated_layers="
                f"{config.unmodulated_layers} needs per-layer attention masks, which a vLLM server cannot apply: set split_layer=0 "
                f"and unmodulated_layers=0 (one map on every layer), or run in process ({self._in_process})")

    def check_decoding(self, decoding: Decoding) -> None:
        """Raise, before any work, for decoding extras a vLLM server does not take."""
        check_remote_extras(decoding.extra)

    def generate(self, call: PreparedCall, decoding: Decoding, *, score: list[int] | None = None) -> Generated:
        if score is not None:
            raise RemoteGenerationUnsupported("score= runs in process: the engine computes it with its own model")
        stream = self.stream(call, decoding)
        for _ in stream:
            pass
        if stream.generated is None:
            raise ServerStreamError(f"the vLLM server at {self.base_url} ended the answer without finishing it")
        return stream.generated

    def stream(self, call: PreparedCall, decoding: Decoding) -> "_ServerStream":
        return _ServerStream(self, self._payload(call, decoding), call)

    # ------------------------------------------------------------------ HTTP
    def _payload(self, call: PreparedCall, decoding: Decoding) -> dict[str, Any]:
        ids, plan = pass2_inputs(call, "cpu")
        if plan is not None:
            raise RemoteGenerationUnsupported(f"this {call.method} call's plan needs per-plane positions or masks (no slot order feeds it); "
                                              f"set remap='reorder' with one map, or run in process ({self._in_process})")
        n = int(ids.shape[1])
        if self.max_model_len and n + decoding.max_new_tokens > self.max_model_len:
            raise ContextTooLongError(f"the prompt is {n} tokens and max_new_tokens is {decoding.max_new_tokens}: more than the server's "
                                      f"window of {self.max_model_len} tokens (its --max-model-len). Shorten the context, lower "
                                      "max_new_tokens, or start the server with a longer --max-model-len.")
        self.check_decoding(decoding)
        body: dict[str, Any] = {
            "model": self.model, "prompt": ids[0].tolist(), "max_tokens": decoding.max_new_tokens, "temperature": float(decoding.temperature),
            "top_p": float(decoding.top_p), "stop": list(decoding.stop), "stream": True, "return_token_ids": True, "skip_special_tokens": True,
        }
        if decoding.seed is not None:
            body["seed"] = int(decoding.seed) - (1 << 64 if decoding.seed >= 1 << 63 else 0)  # the server takes a signed 64-bit seed
        body.update({_PASSED_EXTRAS[k]: v for k, v in decoding.extra.items() if v is not None})  # None: unset, as in process
        # unset = no cut, as in process; left out, vLLM would take the checkpoint's generation_config (Qwen: top_k 20)
        body.setdefault("top_k", 0)
        body.setdefault("min_p", 0.0)
        return body

    def _timeouts(self) -> httpx.Timeout:
        """The timeouts of one request, read when it is sent (``timeout`` / ``connect_timeout`` may be changed)."""
        return httpx.Timeout(self.timeout, connect=self.connect_timeout)

    def _fault(self, exc: Exception, what: str) -> ServingError:
        if self._closed:
            return ServingError(f"this VLLMServer ({self.base_url}) was closed with {what} in flight ({exc}): the server was not at fault")
        if isinstance(exc, RuntimeError):  # httpx's own state errors (a closed client) are not the server's
            return ServingError(f"the connection to the vLLM server at {self.base_url} could not be used for {what}: {exc}")
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            return ServerUnreachableError(f"no vLLM server answers at {self.base_url} ({exc}): start it (scripts/vllm_server.sh --port P) "
                                          "or fix base_url")
        if isinstance(exc, httpx.PoolTimeout):
            return ServerTimeoutError(f"every one of this VLLMServer's {self.max_connections} connections to {self.base_url} stayed busy "
                                      f"for {self.timeout:g} s, so {what} was never sent: more calls run at once in this process than "
                                      "max_connections; raise max_connections= on VLLMServer or run fewer calls at once")
        if isinstance(exc, httpx.TimeoutException):
            return ServerTimeoutError(f"the vLLM server at {self.base_url} sent nothing for {what} within {self.timeout:g} s: it may be "
                                      "busy with queued calls (each waits for the prefills before it), overloaded or stuck; raise "
                                      "timeout= on VLLMServer (qgpm ask / eval: --vllm-timeout) or check the server")
        if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
            return ServerStreamError(f"the vLLM server at {self.base_url} closed the connection during {what} ({exc}): it may have "
                                     "stopped; check it and retry")
        return ServerResponseError(f"the request to the vLLM server at {self.base_url} failed during {what}: {exc}")

    def _request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        self._check_open()
        try:
            r = self._client.request(method, path, timeout=self._timeouts(), **kw)
        except (httpx.HTTPError, RuntimeError) as exc:
            raise self._fault(exc, path) from exc
        if r.status_code >= 400:
            raise ServerResponseError(f"the vLLM server answered {path} with HTTP {r.status_code}: {_error_text(r.text)}")
        try:
            return r.json()
        except ValueError as exc:
            raise ServerResponseError(f"the vLLM server's answer to {path} is not JSON: {r.text[:200]!r}") from exc


class _ServerStream:
    """One streamed completion: yields text pieces decoded with the engine's tokenizer from the
    token ids the server returns (so the text equals a local decode); ``generated`` at the end."""

    def __init__(self, server: VLLMServer, body: dict[str, Any], call: PreparedCall) -> None:
        self.server, self.body, self.call = server, body, call
        self.generated: Generated | None = None
        self._response: httpx.Response | None = None
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True

    def __iter__(self) -> Iterator[str]:
        srv, tok = self.server, self.server._tokenizer
        ids: list[int] = []
        text, first, finish = "", None, None
        t0 = time.perf_counter()
        srv._check_open()
        events, other = 0, ""  # data events seen; the start of any other body text
        try:
            with srv._client.stream("POST", "/v1/completions", json=self.body, timeout=srv._timeouts()) as r:
                self._response = r
                if r.status_code >= 400:
                    r.read()
                    raise ServerResponseError(f"the vLLM server answered /v1/completions with HTTP {r.status_code}: {_error_text(r.text)}")
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        if len(other) < 200 and line.strip() and not line.startswith((":", "event:", "id:", "retry:")):
                            other += line.strip()[:200] + " "
                        continue
                    events += 1
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    choice = _choice(data)
                    if choice is None:  # an event with no choices: the usage report some servers send last
                        continue
                    if choice.get("token_ids") is None and choice.get("text"):
                        raise ServerResponseError(
                            f"the vLLM server at {srv.base_url} sent answer text without its token ids: it needs vLLM 0.10.2 or later "
                            "(the return_token_ids request field), and a proxy in front of it must pass the field through")
                    new = choice.get("token_ids") or []
                    if new and first is None:
                        first = time.perf_counter()
                    ids.extend(new)
                    finish = choice.get("finish_reason") or finish
                    now = tok.decode(ids, skip_special_tokens=True)
                    if now.startswith(text) and len(now) > len(text) and not now.endswith("\ufffd"):
                        piece, text = now[len(text):], now
                        yield piece
                    if self._cancelled:
                        break
        except (httpx.HTTPError, RuntimeError) as exc:
            raise srv._fault(exc, "the answer") from exc
        if not events and other and not self._cancelled:
            raise ServerResponseError(f"the answer to /v1/completions from {srv.base_url} is not a completion stream (no data events): "
                                      f"{other[:200]!r}; check that base_url is the vLLM server itself and not a page in front of it")
        if finish not in (None, "stop", "length"):  # "abort": the server shut down or paused with the answer in flight
            raise ServerStreamError(f"the vLLM server at {srv.base_url} ended the answer with finish_reason {finish!r} after {len(ids)} "
                                    "tokens, before it was complete (a server shutting down or paused aborts what is in flight); retry")
        if finish is None and not self._cancelled:
            raise ServerStreamError(f"the vLLM server at {srv.base_url} ended the answer without finishing it (after {len(ids)} tokens): "
                                    "it may have stopped; check it and retry")
        details: dict[str, Any] = {"generator": srv.name}
        if isinstance(self.call.plan, PositionPlan):
            details["pass2"] = pass2_kind(self.call.plan, None)  # fed as a plain forward: "standard" or "slot order"
        self.generated = Generated(tok.decode(ids, skip_special_tokens=True), ids, t0, first, time.perf_counter(), 0, details)


def _choice(data: str) -> dict[str, Any] | None:
    """The first choice of one completion chunk; ``None`` for a chunk with an empty ``choices``
    list (OpenAI-style servers end a stream with such a usage-only chunk)."""
    try:
        event = json.loads(data)
        if isinstance(event, dict) and event.get("choices") == []:
            return None
        return event["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        if isinstance(event := _loads(data), dict) and "error" in event:
            raise ServerResponseError(f"the vLLM server reported an error mid-answer: {_error_text(data)}") from exc
        raise ServerResponseError(f"the vLLM server sent an event that is not a completion chunk: {data[:200]!r}") from exc


def _loads(data: str) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _error_text(body: str) -> str:
    """The server's error message from an error body (OpenAI's ``{"error": {"message": ...}}``), else the body's start."""
    parsed = _loads(body)
    if isinstance(parsed, dict):
        err = parsed.get("error", parsed)
        msg = err.get("message") if isinstance(err, dict) else err
        if msg:
            return str(msg)[:500]
    return body[:500]
