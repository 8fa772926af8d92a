#!/usr/bin/env python3
"""check-layers: no module of any workspace crate depends on another in a circle, nor any
top-level module on another (each folded with the modules under it).

The crates' direction is the compiler's business (Cargo refuses cyclic crate dependencies); this
checks the modules inside each crate, as `cargo modules dependencies --acyclic` would, without
building rust-analyzer on a 2-core CI machine. A module is a file; module A uses module B when A's
code (its `#[cfg(test)]` tail left out) names a path through B (`crate::b::X`, `super::X`,
`self::b::X`, bare `b::X` after a `mod b;`). A name that a module only re-exports
(`pub use child::X`) is followed to where it is defined, so a facade `mod.rs` is not a cycle.

Usage: scripts/check-layers.py [crate-src-dir ...] (default: every `src/` of the workspace).
Prints every cycle found, with the line that makes each step, and exits 1 if there is one.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATH_RE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_RE = re.compile(r"\b(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.S)
MOD_RE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([a-z_][a-z0-9_]*)\s*;", re.M)
REEXPORT_RE = re.compile(r"^\s*pub(?:\([^)]*\))?\s+use\s+([^;]+);", re.M | re.S)


def module_files(src: Path) -> dict:
    """Module path (tuple) -> file, for every file module under a crate's src/."""
    mods = {}
    for f in sorted(src.rglob("*.rs")):
        rel = f.relative_to(src).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "mod":
            parts = parts[:-1]
        if parts in (["lib"], ["main"]):
            parts = []
        if parts and parts[0] == "bin":
            continue
        mods[tuple(parts)] = f
    return mods


def strip(text: str) -> str:
    """The code without comments, string literals and the `#[cfg(test)]` tail."""
    cut = re.search(r"^#\[cfg\(test\)\]\s*\n\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", text, re.M)
    if cut:
        text = text[: cut.start()]
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'r#*"(?:.|\n)*?"#*', '""', text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return text


def expand_use(tree: str) -> list:
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e'] (aliases and globs dropped)."""
    tree = re.sub(r"\s+", "", tree)
    depth, cut = 0, None
    for i, ch in enumerate(tree):
        if ch == "{":
            if depth == 0 and cut is None:
                cut = i
            depth += 1
        elif ch == "}":
            depth -= 1
    if cut is None:
        return [tree.split("as")[0] if "::" in tree else tree]
    prefix, inner = tree[:cut], tree[cut + 1 : -1]
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    out = []
    for p in parts:
        if not p:
            continue
        for e in expand_use(p):
            out.append(prefix + e if e != "self" else prefix.rstrip(":"))
    return out


def absolute(module: tuple, path: list, children: set):
    """A path as written in `module` -> absolute segments, or None if it leaves the crate."""
    head = path[0]
    if head == "crate":
        return path[1:]
    if head in ("super", "self"):
        base = list(module)
        while path and path[0] in ("super", "self"):
            if path[0] == "super":
                base = base[:-1]
            path = path[1:]
        return base + path
    if head in children:
        return list(module) + path
    return None


def main() -> int:
    srcs = [Path(a) for a in sys.argv[1:]] or sorted(
        p.parent for p in ROOT.glob("**/Cargo.toml")
        if (p.parent / "src").is_dir() and "fuzz" not in p.parts and "target" not in p.parts
    )
    srcs = [s / "src" if (s / "src").is_dir() else s for s in srcs]
    failed = False
    for src in srcs:
        mods = module_files(src)
        code = {m: strip(f.read_text()) for m, f in mods.items()}
        children = {m: {c[-1] for c in mods if len(c) == len(m) + 1 and c[:-1] == m} for m in mods}
        # name -> module that defines it, for names a module re-exports from elsewhere
        reexports = {m: {} for m in mods}
        for m, text in code.items():
            for tree in REEXPORT_RE.findall(text):
                for p in expand_use(tree):
                    segs = [s for s in p.split("::") if s]
                    target = absolute(m, segs, children[m])
                    if target and len(target) >= 2:
                        name = segs[-1] if segs[-1] != "*" else None
                        if name:
                            reexports[m][name] = target

        def owner(segs, seen=0):
            """The module that defines what the absolute path `segs` names."""
            best = ()
            for i in range(len(segs), -1, -1):
                if tuple(segs[:i]) in mods:
                    best = tuple(segs[:i])
                    break
            rest = segs[len(best):]
            if rest and rest[0] in reexports.get(best, {}) and seen < 8:
                return owner(reexports[best][rest[0]] + rest[1:], seen + 1)
            return best

        edges = {m: {} for m in mods}
        for m, text in code.items():
            paths = []
            facade = {p for tree in REEXPORT_RE.findall(text) for p in expand_use(tree)}
            for tree in USE_RE.findall(text):
                paths += [p for p in expand_use(tree) if p not in facade]
            no_use = USE_RE.sub("", text)
            for mo in PATH_RE.finditer(no_use):
                paths.append(mo.group(1) + mo.group(2))
            for mo in re.finditer(r"\b([a-z_][a-z0-9_]*)::", no_use):
                if mo.group(1) in children[m]:
                    rest = re.match(r"[A-Za-z0-9_:]+", no_use[mo.start():]).group(0)
                    paths.append(rest)
            for p in paths:
                segs = [s for s in p.split("::") if s and s != "*"]
                if not segs:
                    continue
                target = absolute(m, segs, children[m])
                if target is None:
                    continue
                o = owner(target)
                if o != m and o in mods:
                    edges[m].setdefault(o, p)
        cycles = find_cycles(edges)
        # The same, folded onto the top-level modules (`divvy`, `rls`, `settings`, ...): a module
        # of one may use a module of another only if no module of the other uses the first.
        tops = {m[:1] for m in mods if m}
        folded = {t: {} for t in tops}
        for m, out in edges.items():
            for o, p in out.items():
                if m and o and m[:1] != o[:1]:
                    folded[m[:1]].setdefault(o[:1], f"{fmt(m)} -> {fmt(o)}: {p}")
        top_cycles = find_cycles(folded)
        manifest = src.parent / "Cargo.toml"
        found = re.search(r'^name\s*=\s*"([^"]+)"', manifest.read_text(), re.M) if manifest.exists() else None
        name = found.group(1) if found else str(src)
        for found, graph, what in ((cycles, edges, "module cycle(s)"),
                                   (top_cycles, folded, "cycle(s) between top-level modules")):
            if found:
                failed = True
                report(name, found, graph, what)
        if not cycles and not top_cycles:
            print(f"{name}: {len(mods)} modules, {len(tops)} top-level, no cycle")
    return 1 if failed else 0


def report(name, cycles, graph, what):
    """Prints each cycle with the use that makes each of its steps."""
    print(f"{name}: {len(cycles)} {what}")
    for cyc in cycles:
        steps = [f"{fmt(a)} -> {fmt(b)} ({graph[a][b]})" for a, b in zip(cyc, cyc[1:] + cyc[:1])]
        print("  " + "\n    ".join(steps))


def fmt(m):
    return "::".join(m) or "crate"


def find_cycles(edges):
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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
                out.append(cycle_in(set(comp), edges))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def cycle_in(comp, edges):
    """A shortest cycle through the component's first module, by breadth-first search."""
    start = min(comp)
    prev, queue = {start: None}, [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges[v]):
            if w not in comp:
                continue
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return [start]


if __name__ == "__main__":
    sys.exit(main())
