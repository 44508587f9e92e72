"""Fixtures for the LangChain integration tests (real embedded SmolLM2, loaded once)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

pytest.importorskip("langchain_core")

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from qgpm_lc_support import lc_heads, load_cookbook  # noqa: E402


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(getattr(item, "path", None) or item.fspath))
        if HERE not in path.parents:
            continue
        if getattr(getattr(item, "module", None), "USES_REAL_MODEL", False) and item.get_closest_marker("real_model") is None:
            item.add_marker(pytest.mark.real_model)


@pytest.fixture(scope="session")
def lc_engine():
    """The one QGPM engine all chat models of this test session share (built through the adapter's cache)."""
    from qgpm_integrations.langchain.chat_models import _get_engine

    return _get_engine(None, lc_heads())


@pytest.fixture(scope="session")
def corpus_store():
    """InMemoryVectorStore over the cookbook corpus paragraphs (bundled MiniLM embeddings)."""
    return load_cookbook().build_vector_store()
