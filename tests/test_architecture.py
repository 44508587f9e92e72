"""The package's import rules, read from the source with ``ast``:

* the pure modules (text -> spans -> scores -> positions -> plan, and the RoPE maths) import
  nothing from ``runtime``, ``engine`` or ``eval``;
* the core package (everything under ``qgpm/`` but ``qgpm/eval/``, so the sample
  generators in ``qgpm/samples/`` and the engine's ``heads="calibrate"`` too) never imports
  ``qgpm_integrations``, and imports ``qgpm.eval`` only in the files listed in
  ``EVAL_IMPORT_EXCEPTIONS`` (the command line's harness subcommands), lazily;
* every import of the core keeps to the layer table of docs/architecture.md (a module imports
  only from its own layer and the layers above it; every module is in the table);
* no module imports or reads a ``_private`` name of another module (a package's own private
  submodules, such as ``qgpm/_cliutil.py``, may be imported; their public names are used).
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PURE = ("segment", "shaping", "positions", "plan", "rope")
FORBIDDEN_FOR_PURE = ("runtime", "engine", "eval")
# Files of the core allowed to import qgpm.eval, and why. Only these, and only lazily (inside a function).
EVAL_IMPORT_EXCEPTIONS = {
    "qgpm/cli.py": "the command line registers the harness's subcommands (eval, tune, calibrate, report)",
}
CORE_SAMPLES = "qgpm/samples"  # the sample generators: core, used by heads="calibrate" and by the harness


def _modules(*packages: str) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))


def _dotted(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _package(path: Path) -> str:
    dotted = _dotted(path)
    return dotted if path.name == "__init__.py" else dotted.rpartition(".")[0]


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    """The absolute module name of ``from <module> import ...``."""
    if not node.level:
        return node.module or ""
    base = _package(path).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """Every import of a file: (absolute module, imported names, line)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((a.name, [], node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.append((_absolute(path, node), [a.name for a in node.names], node.lineno))
    return out


def _targets(module: str, names: list[str]) -> list[str]:
    """The modules an import may load: the module itself and ``module.name`` for each name."""
    return [module] + [f"{module}.{n}" for n in names]


def _is_within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize("name", PURE)
def test_pure_modules_import_no_runtime_engine_or_eval(name):
    path = ROOT / "qgpm" / f"{name}.py"
    assert path.exists(), path
    bad = [
        (t, line) for module, names, line in _imports(path) for t in _targets(module, names)
        if any(_is_within(t, f"qgpm.{f}") for f in FORBIDDEN_FOR_PURE)
    ]
    assert not bad, f"qgpm/{name}.py must stay pure, but imports {bad}"


def _top_level_imports(path: Path) -> list[tuple[str, list[str], int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            out.extend((a.name, [], node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.append((_absolute(path, node), [a.name for a in node.names], node.lineno))
    return out


def _imports_eval(path: Path) -> bool:
    return any(_is_within(t, "qgpm.eval") for module, names, _ in _imports(path) for t in _targets(module, names))


def test_core_never_imports_the_harness_or_the_integrations():
    bad = []
    for rel in EVAL_IMPORT_EXCEPTIONS:  # the exceptions import the harness lazily, never at module level
        if not _imports_eval(ROOT / rel):
            bad.append(f"{rel} is listed in EVAL_IMPORT_EXCEPTIONS but no longer imports qgpm.eval: remove it")
        for module, names, line in _top_level_imports(ROOT / rel):
            if any(_is_within(t, "qgpm.eval") for t in _targets(module, names)):
                bad.append(f"{rel}:{line} imports {module} at module level")
    for path in _modules("qgpm"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("qgpm/eval/"):
            continue
        for module, names, line in _imports(path):
            for t in _targets(module, names):
                if _is_within(t, "qgpm_integrations") or (_is_within(t, "qgpm.eval") and rel not in EVAL_IMPORT_EXCEPTIONS):
                    bad.append(f"{rel}:{line} imports {t}")
    assert not bad, "\n".join(bad)


def test_the_sample_generators_are_core():
    """``qgpm/samples`` is walked as core (never skipped, never an exception) and imports no harness."""
    samples = _modules(CORE_SAMPLES)
    assert samples, f"{CORE_SAMPLES} has no modules"
    assert not [rel for rel in EVAL_IMPORT_EXCEPTIONS if rel.startswith(CORE_SAMPLES + "/")]
    core = {p.relative_to(ROOT).as_posix() for p in _modules("qgpm") if not p.relative_to(ROOT).as_posix().startswith("qgpm/eval/")}
    assert {p.relative_to(ROOT).as_posix() for p in samples} <= core
    bad = [p.relative_to(ROOT).as_posix() for p in samples if _imports_eval(p)]
    assert not bad, f"{bad} import qgpm.eval"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_module_uses_another_modules_private_names():
    bad = []
    for path in _modules("qgpm", "qgpm_integrations"):
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module_aliases: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _absolute(path, node)
                for a in node.names:
                    submodule = ROOT.joinpath(*source.split("."), a.name)
                    if _is_private(a.name) and not (submodule.with_suffix(".py").exists() or submodule.is_dir()):
                        bad.append(f"{rel}:{node.lineno} imports {a.name} from {source}")
                    else:
                        module_aliases.add(a.asname or a.name)  # may be a module (from . import trace)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    module_aliases.add(a.asname or a.name.split(".")[0])
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _is_private(node.attr) and isinstance(node.value, ast.Name):
                if node.value.id in module_aliases and node.value.id not in ("self", "cls"):
                    bad.append(f"{rel}:{node.lineno} reads {node.value.id}.{node.attr}")
    assert not bad, "\n".join(bad)


def test_the_rules_catch_what_they_forbid(tmp_path, monkeypatch):
    """The checks above can fail: a pure module importing the runtime, a private read, a lazy
    harness import in the engine or in the sample generators, and a stale exception are found."""
    pkg = tmp_path / "qgpm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "plan.py").write_text("from .runtime import apply_plan\nfrom . import engine\nx = engine._private\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    with pytest.raises(AssertionError, match="qgpm.runtime"):
        test_pure_modules_import_no_runtime_engine_or_eval("plan")
    with pytest.raises(AssertionError, match="reads engine._private"):
        test_no_module_uses_another_modules_private_names()
    for rel in EVAL_IMPORT_EXCEPTIONS:
        (tmp_path / rel).write_text("def register():\n    from .eval.cli import register\n")
    (pkg / "engine.py").write_text("def calibrate():\n    from .eval import runner\n")
    (pkg / "samples").mkdir()
    (pkg / "samples" / "__init__.py").write_text("")
    (pkg / "samples" / "tasks.py").write_text("def generate():\n    from qgpm.eval.scoring import score\n")
    with pytest.raises(AssertionError, match=r"(?s)qgpm/engine.py:2 imports qgpm.eval.runner.*qgpm/samples/tasks.py:2 imports qgpm.eval.scoring"):
        test_core_never_imports_the_harness_or_the_integrations()
    with pytest.raises(AssertionError, match=r"qgpm/samples/tasks.py.*import qgpm.eval"):
        test_the_sample_generators_are_core()
    for rel in EVAL_IMPORT_EXCEPTIONS:
        (tmp_path / rel).write_text("import os\n")
    (pkg / "engine.py").write_text("")
    (pkg / "samples" / "tasks.py").write_text("")
    with pytest.raises(AssertionError, match="no longer imports qgpm.eval"):
        test_core_never_imports_the_harness_or_the_integrations()


# --------------------------------------------------------------------------- the engine's stages and the method registry

STAGES = ("limits", "call_checks", "prompt", "pass1", "preparing", "generation", "decoding", "prefill", "streaming", "methods")
ENGINE_MAX_LINES = 450  # the front end: construction, the public calls, and the dispatch to the stages
METHOD_NAME = r'"(vanilla|qgpm|oracle|topk|reorder|string|ms-poe|self-extend|llmlingua-2)"'
# the harness's own files filter result rows by method name and name the methods it tunes
METHOD_NAME_EXCEPTIONS = ("qgpm/eval/",)


def test_the_engine_is_a_front_end_over_named_stages():
    engine = (ROOT / "qgpm" / "engine.py").read_text(encoding="utf-8")
    assert len(engine.splitlines()) <= ENGINE_MAX_LINES, f"qgpm/engine.py has {len(engine.splitlines())} lines: move the work into a stage"
    imported = {module.rpartition(".")[2] for module, _, _ in _top_level_imports(ROOT / "qgpm" / "engine.py")}
    for stage in STAGES:
        assert (ROOT / "qgpm" / f"{stage}.py").exists(), stage
    assert {"limits", "call_checks", "prompt", "preparing", "generation", "decoding", "streaming", "methods"} <= imported


MODULE_MAX_LINES = 450  # a module past ~400 lines is asking to be split by what it owns


def test_no_module_grows_past_the_cap():
    long = {p.relative_to(ROOT).as_posix(): n for p in _modules("qgpm", "qgpm_integrations")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MODULE_MAX_LINES}
    assert not long, f"modules over {MODULE_MAX_LINES} lines (split them by what they own): {long}"


def test_no_import_cycles_counting_every_import():
    import importlib.util

    spec = importlib.util.spec_from_file_location("module_graph", ROOT / "scripts" / "module_graph.py")
    mg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mg)
    g = mg.graph()
    assert "qgpm.generation" in g["qgpm.engine"] and "qgpm.engine" not in g["qgpm.generation"]
    assert mg.cycles(g) == []
    assert mg.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check can fail


def _module_graph():
    import importlib.util

    spec = importlib.util.spec_from_file_location("module_graph", ROOT / "scripts" / "module_graph.py")
    mg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mg)
    return mg


def _doc_layers(text: str) -> dict[str, int]:
    """``{name: layer index}`` from the layer table of docs/architecture.md (``baselines/``: a package)."""
    import re

    table = text.split("| layer | modules |", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("|---")]
    return {name: i for i, row in enumerate(rows) for name in re.findall(r"`([\w/]+)`", row)}


def _layer_of(module: str, layers: dict[str, int]) -> int | None:
    rel = module.removeprefix("qgpm").removeprefix(".")
    if rel in ("", "__main__"):
        return layers.get("__init__" if not rel else rel)
    return layers.get(rel) if rel in layers else layers.get(rel.split(".")[0] + "/")


def _layer_breaks(g: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    bad = [f"{m} is in no layer of docs/architecture.md's table" for m in sorted(g) if _layer_of(m, layers) is None]
    for m in sorted(g):
        for t in sorted(g[m]):
            lm, lt = _layer_of(m, layers), _layer_of(t, layers)
            if lm is not None and lt is not None and lt > lm:
                bad.append(f"{m} (layer {lm}) imports {t} (layer {lt}, below it)")
    return bad


def test_every_import_keeps_to_the_layers_of_the_architecture_doc():
    layers = _doc_layers((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert {"methods": 0, "prompt": 1, "generation": 2, "engine": 3}.items() <= layers.items()
    breaks = _layer_breaks(_module_graph().graph(), layers)
    assert not breaks, "\n".join(breaks)
    # the check can fail: an import from a lower layer, and a module the table does not name
    assert _layer_breaks({"qgpm.rope": {"qgpm.engine"}, "qgpm.engine": set()}, layers) == [
        "qgpm.rope (layer 0) imports qgpm.engine (layer 3, below it)"]
    assert _layer_breaks({"qgpm.nowhere": set()}, layers) == ["qgpm.nowhere is in no layer of docs/architecture.md's table"]


def test_methods_are_asked_through_their_specs_not_compared_by_name():
    import re

    bad = []
    pattern = re.compile(rf"(==|!=)\s*{METHOD_NAME}|{METHOD_NAME}\s*(==|!=)|\bin \({METHOD_NAME},")
    for path in _modules("qgpm", "qgpm_integrations"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(METHOD_NAME_EXCEPTIONS) or rel == "qgpm/methods.py":
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if pattern.search(code) and "remap" not in code and "local_layers" not in code and "mode" not in code:
                bad.append(f"{rel}:{i}: {line.strip()}")
    assert not bad, "ask qgpm.methods.method_spec(name) instead:\n" + "\n".join(bad)
    assert pattern.search('if method == "oracle":') and pattern.search('m in ("topk", "reorder")')


def test_the_patching_code_knows_neither_plan_class():
    """runtime.apply_plan installs any plan through the InstallablePlan protocol: it imports and
    names neither QGPM's position plans nor the baselines' plans, and both implement ``installed``."""
    tree = ast.parse((ROOT / "qgpm" / "runtime.py").read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    modules = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not names & {"PositionPlan", "BaselinePlan"}, names & {"PositionPlan", "BaselinePlan"}
    assert not any(m.endswith(("baselines", "plans", "hooks", "plan")) for m in modules), modules
    from qgpm.baselines import BaselinePlan
    from qgpm.rope import PositionPlan
    from qgpm.runtime import InstallablePlan

    for cls in (PositionPlan, BaselinePlan):
        assert callable(getattr(cls, "installed", None)), cls
    assert "installed" in InstallablePlan.__dict__


# --------------------------------------------------------------------------- imports inside functions


def _function_imports_without_a_reason(source: str) -> list[int]:
    """The lines of the imports inside functions (methods and nested functions too) that carry
    no comment: none on the import's own lines, and no comment line directly above it."""
    comments: dict[int, bool] = {}  # line -> whether the comment is all the line holds
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = not tok.line[: tok.start[1]].strip()
    lines = set()
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    own = any(line in comments for line in range(node.lineno, (node.end_lineno or node.lineno) + 1))
                    if not own and not comments.get(node.lineno - 1, False):
                        lines.add(node.lineno)
    return sorted(lines)


def test_every_import_inside_a_function_says_why():
    """An import inside a function is for an optional or heavy dependency, or breaks a cycle, and
    a comment on its line or the line directly above says which (``# optional: qgpm[eval]``)."""
    sample = (
        "import os\n"
        "def f():\n"
        "    import json\n"  # 3: no reason
        "    # optional: qgpm[eval]\n"
        "    import scipy\n"
        "    import numpy  # heavy: numpy\n"
        "    import torch\n"  # 7: the comment above belongs to another import
        "    from a import (\n"
        "        b,  # cycle: a imports this module\n"
        "    )\n"
        "class C:\n"
        "    async def m(self):\n"
        "        def inner():\n"
        "            from . import x\n"  # 14: nested, no reason
        "        return inner\n"
    )
    assert _function_imports_without_a_reason(sample) == [3, 7, 14]  # the check can fail
    bad = []
    for path in _modules("qgpm"):
        rel = path.relative_to(ROOT).as_posix()
        source = path.read_text(encoding="utf-8")
        text = source.split("\n")
        bad += [f"{rel}:{line}: {text[line - 1].strip()}" for line in _function_imports_without_a_reason(source)]
    assert not bad, "imports inside functions without a reason (move them to the top, or say why they stay):\n" + "\n".join(bad)


def test_the_adapters_share_one_engine_cache_and_one_async_bridge():
    """The engine cache is defined once, in qgpm_integrations._common; the sync-to-async stream
    bridge once, in qgpm.batching (the engine's aanswer runs on it too)."""
    defined: dict[str, list[str]] = {}
    for path in [*_modules("qgpm_integrations"), *_modules("qgpm")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in ("iterate_in_thread", "shared_engine"):
                defined.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_ENGINES" for t in node.targets):
                defined.setdefault("_ENGINES", []).append(str(path.relative_to(ROOT)))
    assert defined.get("shared_engine") == ["qgpm_integrations/_common.py"], defined.get("shared_engine")
    assert defined.get("iterate_in_thread") == ["qgpm/batching.py"], defined.get("iterate_in_thread")
    assert defined.get("_ENGINES", []) == [], defined.get("_ENGINES")  # annotated once in _common, assigned nowhere else


def _unresolved_names(paths: list[Path]) -> list[str]:
    """Every ``from qgpm... import NAME`` in ``paths`` (lazy ones inside functions too) whose
    module cannot be imported or holds no ``NAME`` (neither an attribute nor a submodule)."""
    import importlib
    import importlib.util

    bad = []
    for path in paths:
        for module, names, line in _imports(path):
            if not (_is_within(module, "qgpm") or _is_within(module, "qgpm_integrations")) or not names:
                continue
            where = f"{path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path}:{line}"
            try:
                mod = importlib.import_module(module)
            except ImportError as exc:
                bad.append(f"{where} imports from {module}, which fails: {exc}")
                continue
            for name in names:
                submodule = hasattr(mod, "__path__") and importlib.util.find_spec(f"{module}.{name}") is not None
                if name != "*" and not hasattr(mod, name) and not submodule:
                    bad.append(f"{where} imports {name} from {module}, which has no such name")
    return bad


def test_every_import_of_a_qgpm_name_resolves_in_benchmarks_scripts_cookbooks_and_tests():
    """A name that moved between modules is imported from where it is now everywhere, lazy
    imports in benchmarks and scripts included (they run only on the command line, not in tests)."""
    paths = [p for folder in ("qgpm", "qgpm_integrations", "benchmarks", "scripts", "cookbooks", "tests")
             for p in sorted((ROOT / folder).rglob("*.py"))]
    assert len(paths) > 100
    bad = _unresolved_names(paths)
    assert not bad, "\n".join(bad)


def test_the_import_check_finds_a_name_that_moved(tmp_path):
    stale = tmp_path / "stale.py"
    stale.write_text("def run():\n    from qgpm.config import load_config\n    from qgpm.config_files import load_config as ok\n",
                     encoding="utf-8")
    assert [b.split(" ", 1)[1] for b in _unresolved_names([stale])] == ["imports load_config from qgpm.config, which has no such name"]
