"""Fixtures for the LlamaIndex integration tests.

* :func:`offline`: the network is blocked (sockets other than AF_UNIX, which asyncio
  needs, raise ``SocketBlockedError``) and tiktoken is booby-trapped (LlamaIndex must count
  tokens with the model's tokenizer) during every test here and while the session
  fixtures load their models. Nothing leaks to other test directories.
* ``li_engine``: the embedded SmolLM2-135M-Instruct, loaded once per session.
* ``stub_engine``: a model-free stand-in for :class:`qgpm.QGPM` for the plumbing tests.
"""

from __future__ import annotations

import contextlib
import glob
import os
import threading
from pathlib import Path

import pytest

pytest.importorskip("llama_index.core")

ROOT = Path(__file__).resolve().parents[3]
CORPUS = ROOT / "cookbooks" / "data" / "corpus"
FALLBACK_HEADS = [(14, 3), (15, 6), (18, 6), (18, 7), (23, 7), (7, 7), (17, 4), (18, 8)]


# --------------------------------------------------------------------------- no network, no tiktoken


class NetworkUsed(RuntimeError):
    pass


def _block_network():
    """Block internet sockets (pytest-socket when present, else a small guard of our own)."""
    try:
        import pytest_socket

        pytest_socket.disable_socket(allow_unix_socket=True)
        return pytest_socket.enable_socket
    except ImportError:  # pragma: no cover - pytest-socket comes with langchain-tests
        import socket

        real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo

        def connect(self, address):
            if self.family == getattr(socket, "AF_UNIX", None):
                return real_connect(self, address)
            raise NetworkUsed(f"a test tried to connect to {address}")

        def getaddrinfo(*args, **kwargs):
            raise NetworkUsed(f"a test tried to resolve {args[:2]}")

        socket.socket.connect, socket.getaddrinfo = connect, getaddrinfo

        def restore():
            socket.socket.connect, socket.getaddrinfo = real_connect, real_getaddrinfo

        return restore


TIKTOKEN_CALLS: list[tuple] = []


@contextlib.contextmanager
def offline():
    """No internet sockets, and tiktoken raises (LlamaIndex must count with the model's tokenizer)."""
    restore = _block_network()
    patched = []
    try:
        import tiktoken
    except ImportError:  # pragma: no cover
        tiktoken = None
    if tiktoken is not None:
        for name in ("get_encoding", "encoding_for_model"):
            real = getattr(tiktoken, name)

            def trap(*args, _name=name, **kwargs):
                TIKTOKEN_CALLS.append((_name, args))
                raise NetworkUsed(f"tiktoken.{_name}{args} was called: LlamaIndex fell back to tiktoken")

            setattr(tiktoken, name, trap)
            patched.append((name, real))
    try:
        yield
    finally:
        for name, real in patched:
            setattr(tiktoken, name, real)
        restore()


@pytest.fixture
def tiktoken_calls():
    """Every call of the tiktoken trap in this test session (should stay empty)."""
    return TIKTOKEN_CALLS


@pytest.fixture
def network_errors():
    """The exceptions a blocked network access raises."""
    errors = (NetworkUsed,)
    try:
        from pytest_socket import SocketBlockedError

        errors += (SocketBlockedError,)
    except ImportError:  # pragma: no cover
        pass
    return errors


@pytest.fixture(autouse=True)
def _offline_test():
    """Every test here runs offline (session fixtures below load their models offline too)."""
    with offline():
        yield


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """One intra-op thread while these modules run (restored after each module).

    On a shared CPU the default two threads make SmolLM2 calls ~20x slower (OpenMP
    threads wait on each other when either is descheduled): 68 s vs 3 s per answer.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --------------------------------------------------------------------------- real model


@pytest.fixture(scope="session")
def li_engine():
    """SmolLM2-135M-Instruct with the stored head set (or the preliminary set while none is shipped)."""
    from qgpm import QGPM

    with offline():
        engine = QGPM.from_pretrained()
    if engine.head_set is None:
        engine = QGPM(engine.model, engine.tokenizer, heads=FALLBACK_HEADS, name=engine.name)
    return engine


@pytest.fixture(scope="session")
def li_llm(li_engine):
    """QGPMLLM on the real model; LlamaIndex counts tokens with the model's tokenizer (set explicitly)."""
    import llama_index.core

    from qgpm_integrations.llama_index import QGPMLLM, set_tokenizer

    saved = llama_index.core.global_tokenizer
    with offline():
        llm = QGPMLLM(engine=li_engine, method="qgpm", max_new_tokens=12)
    set_tokenizer(llm, force=True)  # building the LLM leaves LlamaIndex's settings alone
    yield llm
    llama_index.core.global_tokenizer = saved


@pytest.fixture(scope="session")
def li_embed():
    from qgpm_integrations.llama_index import bundled_embeddings

    with offline():
        return bundled_embeddings()


@pytest.fixture(scope="session")
def li_index(li_llm, li_embed):
    """A real VectorStoreIndex over the cookbook corpus (~128-token nodes, model tokenizer)."""
    from llama_index.core import Document, VectorStoreIndex
    from llama_index.core.node_parser import SentenceSplitter

    docs = [
        Document(text=Path(p).read_text(encoding="utf-8"), metadata={"file_name": os.path.basename(p)}, excluded_llm_metadata_keys=["file_name"])
        for p in sorted(glob.glob(str(CORPUS / "*.md")))
    ]
    assert len(docs) == 16
    with offline():
        return VectorStoreIndex.from_documents(docs, embed_model=li_embed, transformations=[SentenceSplitter(chunk_size=128, chunk_overlap=0)])


# --------------------------------------------------------------------------- stub engine


class _WordTokenizer:
    def __call__(self, text, add_special_tokens=False, verbose=False, **kw):
        return {"input_ids": text.split()}


class _Stream:
    def __init__(self, result):
        self._final = result
        words = result.text.split(" ")
        self._it = iter([w + " " for w in words[:-1]] + words[-1:])
        self.result = None

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self._it)
        except StopIteration:
            self.result = self._final
            raise

    def close(self):
        pass

    def cancel(self):  # AnswerStream.cancel: stop from another thread without waiting
        pass


class StubEngine:
    """Stands in for qgpm.QGPM: answers ``"<method> answer to <question> from <n> docs"``.

    ``calls`` records ``(kind, context_or_messages, question, kwargs)`` of every call.
    """

    name = "stub-model"
    max_length = 4096

    def __init__(self):
        from qgpm import QGPMConfig

        self.tokenizer = _WordTokenizer()
        self.config = QGPMConfig()  # the engine's own settings (relevance from the heads), as qgpm.QGPM has them
        self.calls = []
        self._lock = threading.Lock()

    @property
    def heads(self):
        return [(0, 0)]

    def require_supported(self):
        """Every method runs on the stub (qgpm.QGPM raises here for a family it cannot patch)."""

    @staticmethod
    def _result(text, method):
        from qgpm import QGPMResult, Usage

        return QGPMResult(text=text, method=method, usage=Usage(prompt_tokens=11, answer_tokens=len(text.split())))

    def answer(self, context, question, **kw):
        with self._lock:
            self.calls.append(("answer", context, question, kw))
        n = len(context) if isinstance(context, list) else 1
        return self._result(f"{kw.get('method')} answer to {question} from {n} docs", kw.get("method"))

    def stream(self, context, question, **kw):
        return _Stream(self.answer(context, question, **kw))

    def chat(self, messages, **kw):
        with self._lock:
            self.calls.append(("chat", messages, None, kw))
        return self._result("plain reply", "plain")

    def stream_chat(self, messages, **kw):
        return _Stream(self.chat(messages, **kw))


@pytest.fixture
def stub_engine():
    return StubEngine()
