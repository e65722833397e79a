#!/usr/bin/env python3
"""Prints the `use crate::X` edges between the top-level modules of src/
(non-test code: everything from a `#[cfg(test)]` line on is skipped), then
the cycles among them, if any. Run from the repository root:

    python3 scripts/module_graph.py          # edges and cycles
    python3 scripts/module_graph.py --files  # edges between files instead
"""
import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
USE = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)(?:::([a-z_][a-z0-9_]*))?")


def top_level(path):
    rel = os.path.relpath(path, SRC)
    first = rel.split(os.sep)[0]
    return first[:-3] if first.endswith(".rs") else first


def file_module(path):
    rel = os.path.relpath(path, SRC)[:-3]
    parts = rel.split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    return "::".join(parts)


def code(path):
    out = []
    with open(path) as f:
        for line in f:
            if line.strip().startswith("#[cfg(test)]"):
                break
            if line.strip().startswith("//"):
                continue
            out.append(line)
    return "".join(out)


def main():
    files = "--files" in sys.argv
    edges = set()
    for root, _, names in os.walk(SRC):
        for n in names:
            if not n.endswith(".rs"):
                continue
            p = os.path.join(root, n)
            me = file_module(p) if files else top_level(p)
            if me in ("lib", "main"):
                continue
            for m in USE.finditer(code(p)):
                other = m.group(1)
                if files and m.group(2) and os.path.exists(os.path.join(SRC, other, m.group(2) + ".rs")):
                    other = other + "::" + m.group(2)
                if other != me and not (files and other.split("::")[0] == me.split("::")[0] and "::" not in other):
                    edges.add((me, other))
    for a, b in sorted(edges):
        print(f"{a} -> {b}")
    # Cycles: strongly connected components with more than one module.
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on, sccs = {}, {}, [], set(), []

    def strong(v, counter=[0]):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
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
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    if sccs:
        for c in sccs:
            print("cycle: " + " ".join(c))
        sys.exit(1)
    print("no cycles")


main()
