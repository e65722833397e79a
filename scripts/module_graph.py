#!/usr/bin/env python3
"""Prints the `use crate::X` edges between the top-level modules of src/
(non-test code: everything from a `#[cfg(test)]` line on is skipped), then
the cycles among them, if any. Run from the repository root:

    python3 scripts/module_graph.py          # edges and cycles
    python3 scripts/module_graph.py --files  # edges between files instead

It also checks the layers of docs/ARCHITECTURE.md: a module may use only
modules of a lower layer (LAYERS below). It exits 1 on a cycle or on an
edge that goes up or sideways.
"""
import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
USE = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)(?:::([a-z_][a-z0-9_]*))?")


# Lowest first; a module may import only from layers before its own.
LAYERS = [
    ["wire", "util", "rates", "history"],
    ["config", "message", "alarm", "plugins", "policy"],
    ["store", "exchange", "tls"],
    ["dedup"],
    ["queue", "delayed", "access", "cluster", "shovel"],
    ["vhost", "federation"],
    ["broker"],
    ["definitions"],
    ["amqp", "http", "stream_protocol"],
    ["server", "admin"],
    ["fuzz"],
]
RANK = {m: i for i, layer in enumerate(LAYERS) for m in layer}


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
    """The file's non-test code: a `#[cfg(test)]` item of one line (`mod
    testing;`) is skipped; one that opens a block (`mod tests {`, always
    last) ends the file. Comment lines are skipped."""
    out = []
    skip_next = False
    with open(path) as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        t = line.strip()
        if skip_next:
            skip_next = False
            continue
        if t.startswith("#[cfg(test)]"):
            rest = [l.strip() for l in lines[i + 1 :] if l.strip()]
            if rest and rest[0].endswith(";"):
                skip_next = True
                continue
            break
        if t.startswith("//"):
            continue
        out.append(line)
    return "\n".join(out)


def expand(tree):
    """Expands one `use` tree ("a::{b, c::d}") into its paths."""
    tree = tree.strip()
    depth, at = 0, None
    for i, ch in enumerate(tree):
        if ch == "{" and depth == 0:
            at = i
            break
    if at is None:
        return [tree]
    prefix, inner = tree[:at], tree[at + 1 : tree.rindex("}")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    return [p for part in parts if part.strip() for p in expand(prefix + part.strip())]


def is_module(parts):
    base = os.path.join(SRC, *parts)
    return os.path.exists(base + ".rs") or os.path.exists(os.path.join(base, "mod.rs"))


def resolve(me, path):
    """The module file a `crate::` or `super::` path lands in."""
    segs = path.split("::")
    if segs[0] == "crate":
        at = []
    elif segs[0] == "super":
        at = me.split("::")
        while segs and segs[0] == "super":
            at = at[:-1]
            segs = segs[1:]
        segs = ["super"] + segs
    else:
        return None
    best = list(at)
    for seg in segs[1:]:
        seg = seg.split(" as ")[0].strip()
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", seg) or not is_module(best + [seg]):
            break
        best.append(seg)
    return "::".join(best)


def related(a, b):
    """Whether one module contains the other (a parent and its children
    always refer to each other; that is not a layering question)."""
    return a == b or a.startswith(b + "::") or b.startswith(a + "::") or not a or not b


def sources():
    """Every .rs file under src/ but lib.rs and main.rs."""
    for root, _, names in os.walk(SRC):
        for n in sorted(names):
            p = os.path.join(root, n)
            if n.endswith(".rs") and os.path.relpath(p, SRC) not in ("lib.rs", "main.rs"):
                yield p


def file_edges():
    edges = set()
    for p in sources():
        me = file_module(p)
        text = code(p)
        paths = []
        for stmt in re.findall(r"\buse\s+([^;]+);", text):
            paths += expand(stmt)
        paths += [m.group(0) for m in re.finditer(r"\b(?:crate|super)(?:::[a-z_][a-z0-9_]*)+", text)]
        for path in paths:
            other = resolve(me, path.strip())
            if other is not None and not related(me, other):
                edges.add((me, other))
    return edges


def module_edges():
    edges = set()
    for p in sources():
        me = top_level(p)
        for m in USE.finditer(code(p)):
            if m.group(1) != me:
                edges.add((me, m.group(1)))
    return edges


def main():
    files = "--files" in sys.argv
    edges = file_edges() if files else module_edges()
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
    bad = 0
    for c in sccs:
        print("cycle: " + " ".join(c))
        bad += 1
    if not sccs:
        print("no cycles")
    if not files:
        for a, b in sorted(edges):
            if a not in RANK or b not in RANK:
                print(f"not in a layer: {a if a not in RANK else b}")
                bad += 1
            elif RANK[b] >= RANK[a]:
                print(f"against the layers: {a} -> {b}")
                bad += 1
        if not bad:
            print("layers: every edge goes down")
    if bad:
        sys.exit(1)


main()
