"""Helpers shared by the LangChain integration tests (importable from test modules)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

# Preliminary calibrated heads, used only while no head set is shipped for SmolLM2.
FALLBACK_HEADS = [(14, 3), (15, 6), (18, 6), (18, 7), (23, 7), (7, 7), (17, 4), (18, 8)]


def lc_heads():
    """``None`` (the shipped head set) when there is one, else the preliminary set."""
    from qgpm.heads import HeadSetMissingError, load_head_set

    try:
        load_head_set("SmolLM2-135M-Instruct")
        return None
    except HeadSetMissingError:
        return FALLBACK_HEADS


def _load(name: str, path: Path):
    """The module at ``path`` under ``name`` (imported once)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def load_cookbook():
    """The cookbook module ``cookbooks/langchain_rag.py``."""
    return _load("qgpm_cookbook_langchain_rag", REPO / "cookbooks" / "langchain_rag.py")


def load_prompt_shapes():
    """The benchmark module ``benchmarks/prompt_shapes.py``: LangChain's RAG prompts by shape."""
    return _load("qgpm_benchmark_prompt_shapes", REPO / "benchmarks" / "prompt_shapes.py")
