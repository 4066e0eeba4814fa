#!/usr/bin/env python3
"""Import cycles between the top-level modules of each crate (docs/ARCHITECTURE.md: "no
import cycle between modules").

A module's edges are the `crate::NAME` paths in its files (comments skipped; a submodule's
uses count for its top-level module). A cycle is a strongly connected component of more than
one module. Usage: modcycles.py [REPO]; exit 1 and one line per cycle when there is one.
"""
import pathlib
import re
import sys

CRATES = ["src", "crates/measure/src", "crates/net/src", "crates/sim/src", "loadtest/src"]
PATH = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")


def edges(src: pathlib.Path) -> dict:
    graph = {}
    for f in sorted(src.rglob("*.rs")):
        rel = f.relative_to(src).parts
        top = rel[0].removesuffix(".rs")
        if top in ("lib", "main"):
            continue
        deps = graph.setdefault(top, set())
        for line in f.read_text(encoding="utf-8").splitlines():
            code = line.split("//", 1)[0]
            deps.update(d for d in PATH.findall(code) if d != top)
    return graph


def cycles(graph: dict) -> list:
    """Tarjan's strongly connected components with more than one member, each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
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
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def main(argv):
    repo = pathlib.Path(argv[1] if len(argv) > 1 else ".")
    found = False
    for crate in CRATES:
        src = repo / crate
        if not src.is_dir():
            continue
        for comp in cycles(edges(src)):
            found = True
            print(f"{crate}: import cycle between modules: {' <-> '.join(comp)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
