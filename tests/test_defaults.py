"""One source of defaults: every module takes them from qgpm.defaults."""

from __future__ import annotations

import ast
import inspect
import re
import typing
from pathlib import Path

import pytest

from qgpm import defaults
from qgpm.defaults import COMPARISON_METHODS, DEFAULT_K, DEFAULT_MODEL, DEFAULT_MODEL_NAME, DEFAULT_RERANKER, METHODS, PASS1_FIELDS

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("qgpm", "qgpm_integrations") for p in (ROOT / d).rglob("*.py") if p.name != "defaults.py")


def _default(fn, name):
    return inspect.signature(fn).parameters[name].default


def test_reranker_default_is_the_measured_one():
    # benchmarks/results/rerank_mrr.md: MiniLM 0.899 overall, 0.646 on nolima_assoc (BM25 0.895 / 0.369)
    assert DEFAULT_RERANKER == "minilm"
    table = (ROOT / "benchmarks" / "results" / "rerank_mrr.md").read_text()
    overall = {m.group(1): float(m.group(2)) for m in re.finditer(r"^\| (\w[\w-]*) \|.*\*\*([\d.]+)\*\*", table, re.M)}
    assert overall[DEFAULT_RERANKER] == max(v for k, v in overall.items() if k != "qgpm-heads")


def test_every_core_entry_point_uses_the_one_reranker_default():
    from qgpm.editing import edit_context
    from qgpm.eval.cli import build_parser
    from qgpm.eval.answering import answer_sample, prepare_kwargs
    from qgpm.eval.hashes import method_fingerprint, reranker_name
    from qgpm.eval.runner import run_eval
    from qgpm.rerank import get_reranker

    for fn in (edit_context, get_reranker, run_eval, answer_sample, prepare_kwargs, method_fingerprint):
        name = "spec" if fn is get_reranker else "reranker"
        assert _default(fn, name) == DEFAULT_RERANKER, fn.__qualname__
    assert reranker_name(None) == DEFAULT_RERANKER  # what the engine runs for reranker=None
    assert build_parser().parse_args(["eval", "--out", "x"]).reranker == DEFAULT_RERANKER
    assert build_parser().parse_args(["eval", "--out", "x"]).methods == list(COMPARISON_METHODS)


def test_every_adapter_uses_the_one_reranker_default():
    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    from qgpm_integrations.langchain import QGPM_METHODS, QGPMChatModel, QGPMReorder, QGPMTopKCompressor
    from qgpm_integrations.llama_index import QGPMLLM, QGPMReorderPostprocessor, QGPMTopKPostprocessor

    for cls in (QGPMChatModel, QGPMTopKCompressor, QGPMReorder, QGPMLLM, QGPMTopKPostprocessor, QGPMReorderPostprocessor):
        assert cls.model_fields["reranker"].default == DEFAULT_RERANKER, cls.__name__
    for cls, field in ((QGPMChatModel, "k"), (QGPMTopKCompressor, "k"), (QGPMLLM, "k"), (QGPMTopKPostprocessor, "top_n")):
        assert cls.model_fields[field].default == DEFAULT_K, cls.__name__
    assert QGPM_METHODS is METHODS


def test_method_list_and_pass1_fields_are_defined_once():
    import qgpm
    from qgpm import QGPMConfig
    from qgpm.engine import Method
    from qgpm.eval.tune import PASS1_FIELDS as TUNE_PASS1

    assert qgpm.METHODS is METHODS and typing.get_args(Method) == METHODS
    assert TUNE_PASS1 is PASS1_FIELDS
    assert set(PASS1_FIELDS) <= set(QGPMConfig.__dataclass_fields__)


def test_default_model_alias_is_defined_once():
    from qgpm.loading import DEFAULT_MODEL as LOADING_MODEL, DEFAULT_MODEL_NAME as LOADING_NAME
    from qgpm.config import PRESET_NAMES, SMOLLM2_KEY

    assert (LOADING_MODEL, LOADING_NAME) == (DEFAULT_MODEL, DEFAULT_MODEL_NAME)
    assert PRESET_NAMES[SMOLLM2_KEY] == DEFAULT_MODEL_NAME
    assert defaults.is_default_model(None) and defaults.is_default_model(" SmolLM2 ") and defaults.is_default_model("smollm2-135m-instruct")
    assert not defaults.is_default_model("Qwen/Qwen2.5-7B-Instruct") and not defaults.is_default_model(object())


def _constants(tree):
    """String constants and tuples/lists of them, skipping docstrings and ``Literal[...]`` types
    (``qgpm.engine.Method`` is checked against METHODS above)."""
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Subscript) and getattr(n.value, "id", None) == "Literal":
            docs.add(id(n.slice))
            docs.update(id(e) for e in getattr(n.slice, "elts", []))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node, node.value
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and id(node) not in docs and node.elts and all(isinstance(e, ast.Constant) for e in node.elts):
            yield node, tuple(e.value for e in node.elts)


ALIASES = {DEFAULT_MODEL, DEFAULT_MODEL_NAME, DEFAULT_MODEL_NAME.lower()}


@pytest.mark.parametrize(
    "what, copied",
    [
        ("a method list", lambda v: isinstance(v, tuple) and len(v) >= 3 and {"vanilla", "qgpm"} <= set(v)),
        ("the pass-1 field list", lambda v: isinstance(v, tuple) and {"max_sentence_chars", "query_tail"} <= set(v)),
        ("the default-model alias", lambda v: isinstance(v, str) and v in ALIASES),
        ("the default-model alias set", lambda v: isinstance(v, tuple) and bool(ALIASES & set(map(str, v)))),
    ],
)
def test_no_module_keeps_its_own_copy(what, copied):
    hits = []
    for path in SOURCES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        hits += [f"{path.relative_to(ROOT)}:{node.lineno}: {value!r}" for node, value in _constants(tree) if copied(value)]
    assert not hits, f"{what} copied outside qgpm/defaults.py:\n" + "\n".join(hits)


def test_no_module_keeps_its_own_reranker_default():
    rx = re.compile(r"""reranker[^=\n(]*=\s*(Field\(default=)?["'](bm25|minilm)["']""")
    hits = []
    for path in SOURCES:
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if rx.search(line.split("#", 1)[0]):
                hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not hits, "a reranker default copied outside qgpm/defaults.py:\n" + "\n".join(hits)
