"""The import graph of qgpm's core package, read from the source with ``ast``.

Every import counts: at module level, under ``TYPE_CHECKING`` and inside functions.
    python scripts/module_graph.py            # one line per module: what it imports from the package
    python scripts/module_graph.py --cycles   # the import cycles (none expected)
    python scripts/module_graph.py --dot      # Graphviz source, for docs/architecture.md's picture
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def graph(package: str = "qgpm", skip: tuple[str, ...] = ("qgpm.eval",)) -> dict[str, set[str]]:
    """``{module: modules of the package it imports}`` over ``package`` (subpackages in ``skip`` left out)."""
    paths = sorted((ROOT / package).rglob("*.py"))
    names = {module_name(p): p for p in paths}
    names = {n: p for n, p in names.items() if not any(n == s or n.startswith(s + ".") for s in skip)}
    out: dict[str, set[str]] = {n: set() for n in names}
    for name, path in names.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                # a name that is a submodule stands for it alone (its package's __init__ is not what it uses)
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in names]
                targets = subs + ([base] if len(subs) < len(node.names) else [])
            for t in targets:
                while t and t not in names:  # the closest module of the package an import names
                    t = t.rpartition(".")[0]
                if t and t != name:
                    out[name].add(t)
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def main(argv: list[str]) -> int:
    g = graph()
    if "--cycles" in argv:
        cs = cycles(g)
        for c in cs:
            print(" <-> ".join(c))
        return 1 if cs else 0
    if "--dot" in argv:
        print("digraph qgpm {\n  rankdir=LR; node [shape=box, fontsize=10];")
        for m in sorted(g):
            for t in sorted(g[m]):
                print(f'  "{m}" -> "{t}";')
        print("}")
        return 0
    for m in sorted(g):
        print(f"{m}: {', '.join(sorted(g[m])) or '-'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
