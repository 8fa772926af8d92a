#!/usr/bin/env python3
"""check-layers: no module of any workspace crate depends on another in a circle, nor any
top-level module on another (each folded with the modules under it).

The crates' direction is the compiler's business (Cargo refuses cyclic crate dependencies); this
checks the modules inside each crate, as `cargo modules dependencies --acyclic` would, without
building rust-analyzer on a 2-core CI machine.

The source is read token by token as the compiler's lexer reads it: comments (line, doc, nested
block), string literals (with escapes, byte and C strings, raw strings with any number of `#`),
char literals told from lifetimes and labels, raw identifiers. Items under `#[cfg(test)]` (or
`#[cfg(all(test, ...))]`) are left out wherever they stand, and so is a module declared under one
(`#[cfg(test)] mod tests;`) or whose file starts with `#![cfg(test)]`.

A module is a file; module A uses module B when A's code names a path through B (`crate::b::X`,
`super::X`, `self::b::X`, bare `b::X` after a `mod b;`). A name that a module only re-exports
(`pub use child::X`, or a glob `pub use child::*` over a module that defines it) is followed to
where it is defined, so a facade `mod.rs` is not a cycle; but a facade that also writes a name it
re-exports in its own code uses that name's module. A name reached through a glob over another
crate (`pub use other_crate::m::*`) stays the facade's.

Usage: scripts/check-layers.py [crate-src-dir ...] (default: every `src/` of the workspace).
Prints every cycle found, with the line that makes each step, and exits 1 if there is one.
Its own tests: `python3 scripts/check_layers_test.py`.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

IDENT_START = re.compile(r"[A-Za-z_\u00c0-\uffff]")
IDENT = re.compile(r"[A-Za-z0-9_\u00c0-\uffff]*")
NUMBER = re.compile(r"[0-9][0-9A-Za-z_]*(?:\.[0-9][0-9A-Za-z_]*)?")
CHAR = re.compile(r"'(?:\\(?:x[0-9A-Fa-f]{2}|u\{[0-9A-Fa-f_]*\}|.)|[^\\'\n])'", re.S)
RAW_STRING = re.compile(r'(?:b|c)?r(#*)"')
ITEM_KEYWORDS = re.compile(
    r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+|static\s+(?:mut\s+)?|fn\s+|struct\s+|enum\s+|"
    r"union\s+|type\s+|trait\s+|mod\s+|(?:async\s+|unsafe\s+|const\s+|extern\s+\"C\"\s+)+fn\s+)"
    r"([A-Za-z_][A-Za-z0-9_]*)", re.M)


class Token:
    __slots__ = ("kind", "text", "line")

    def __init__(self, kind, text, line):
        self.kind, self.text, self.line = kind, text, line

    def __repr__(self):
        return f"{self.kind}:{self.text}"


def tokenize(src: str) -> list:
    """Rust source -> tokens (`ident`, `punct`, `lit`, `lifetime`), comments dropped.

    `::` is one punct token; every other punct is one character. A string or char literal is one
    `lit` token whose text is `""`, so no path inside a literal is ever seen."""
    out, i, n, line = [], 0, len(src), 1

    def skip_string(j):
        """From just after an opening `"` to just after its closing one."""
        while j < n:
            c = src[j]
            if c == "\\":
                j += 2
                continue
            if c == '"':
                return j + 1
            j += 1
        return n

    while i < n:
        c = src[i]
        start = i
        if c == "\n":
            line += 1
            i += 1
            continue
        if c.isspace():
            i += 1
            continue
        if src.startswith("//", i):
            end = src.find("\n", i)
            i = n if end < 0 else end
            continue
        if src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            line += src.count("\n", start, i)
            continue
        # Raw strings: r"..", r#".."#, br#".."#, cr#".."#.
        m = RAW_STRING.match(src, i)
        if m:
            close = '"' + m.group(1)
            end = src.find(close, m.end())
            i = n if end < 0 else end + len(close)
            out.append(Token("lit", '""', line))
            line += src.count("\n", start, i)
            continue
        if c == '"' or (c in "bc" and src.startswith('"', i + 1)):
            i = skip_string(i + (1 if c == '"' else 2))
            out.append(Token("lit", '""', line))
            line += src.count("\n", start, i)
            continue
        if c == "'" or (c == "b" and src.startswith("'", i + 1)):
            q = i if c == "'" else i + 1
            m = CHAR.match(src, q)
            if m:
                i = m.end()
                out.append(Token("lit", "''", line))
                continue
            if c == "'":
                # A lifetime or a label: `'a`, `'static`, `'outer:`.
                m = IDENT.match(src, i + 1)
                out.append(Token("lifetime", src[i:m.end()], line))
                i = m.end()
                continue
        if c == "r" and src.startswith("r#", i) and IDENT_START.match(src, i + 2):
            m = IDENT.match(src, i + 3)
            out.append(Token("ident", src[i + 2:m.end()], line))
            i = m.end()
            continue
        if IDENT_START.match(c):
            m = IDENT.match(src, i + 1)
            out.append(Token("ident", src[i:m.end()], line))
            i = m.end()
            continue
        if c.isdigit():
            m = NUMBER.match(src, i)
            out.append(Token("lit", m.group(0), line))
            i = m.end()
            continue
        if src.startswith("::", i):
            out.append(Token("punct", "::", line))
            i += 2
            continue
        out.append(Token("punct", c, line))
        i += 1
    return out


OPEN, CLOSE = {"(": ")", "[": "]", "{": "}"}, {")", "]", "}"}


def matching(toks, i):
    """Index just after the bracket group that opens at toks[i]."""
    depth = 0
    while i < len(toks):
        t = toks[i]
        if t.kind == "punct" and t.text in OPEN:
            depth += 1
        elif t.kind == "punct" and t.text in CLOSE:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


def is_test_cfg(attr) -> bool:
    """`cfg(test)` or `cfg(all(..., test, ...))`: compiled only for the crate's own tests."""
    words = [t.text for t in attr]
    if words[:3] != ["cfg", "(", "test"] or words[3:4] != [")"]:
        if words[:4] != ["cfg", "(", "all", "("]:
            return False
        inner = attr[4:matching(attr, 3) - 1]
        depth, top = 0, []
        for t in inner:
            if t.text in OPEN:
                depth += 1
            elif t.text in CLOSE:
                depth -= 1
            elif depth == 0 and t.kind == "ident":
                top.append(t.text)
        return "test" in top
    return True


ITEMS = {"fn", "mod", "struct", "enum", "union", "impl", "trait", "const", "static", "use", "type",
         "unsafe", "async", "extern", "macro_rules"}


def item_end(toks, i):
    """Index just after what an attribute at toks[i] applies to. An item ends with its `;` or its
    closing brace; anything else (a field, a variant, an arm, a statement) with its `,` or `;`, or
    just before the bracket that closes around it."""
    k = i
    while k < len(toks) and toks[k].text in ("pub", "crate", "("):
        k = matching(toks, k) if toks[k].text == "(" else k + 1
    item = k < len(toks) and toks[k].kind == "ident" and toks[k].text in ITEMS
    while i < len(toks):
        t = toks[i]
        if t.kind == "punct":
            if t.text == ";" or (t.text == "," and not item):
                return i + 1
            if t.text in CLOSE:
                return i
            if t.text == "{" and (item or i == k):
                return matching(toks, i)
            if t.text in OPEN:
                i = matching(toks, i)
                continue
        i += 1
    return i


def strip_tests(toks):
    """The tokens without `#[cfg(test)]` items; the names of modules declared under one; and
    whether the file itself is test-only (`#![cfg(test)]`)."""
    out, test_mods, test_only, i = [], set(), False, 0
    while i < len(toks):
        t = toks[i]
        if t.text == "#" and t.kind == "punct":
            inner = i + 1 < len(toks) and toks[i + 1].text == "!"
            b = i + (2 if inner else 1)
            if b < len(toks) and toks[b].text == "[":
                end = matching(toks, b)
                if is_test_cfg(toks[b + 1:end - 1]):
                    if inner:
                        test_only = True
                        i = end
                        continue
                    j = end
                    # Further attributes of the same item.
                    while j + 1 < len(toks) and toks[j].text == "#" and toks[j + 1].text == "[":
                        j = matching(toks, j + 1)
                    k = j
                    while k < len(toks) and toks[k].kind == "ident" and toks[k].text in ("pub", "crate"):
                        k += 1
                    if k < len(toks) and toks[k].text == "(":
                        k = matching(toks, k)
                    if k + 1 < len(toks) and toks[k].text == "mod" and toks[k + 1].kind == "ident":
                        test_mods.add(toks[k + 1].text)
                    i = item_end(toks, j)
                    continue
        out.append(t)
        i += 1
    return out, test_mods, test_only


def use_trees(toks, i):
    """Expands the use tree starting at toks[i] -> (paths as lists of segments, index after it).

    `a::{b, c::{d, e as f}, g::*}` -> [a,b], [a,c,d], [a,c,e], [a,g,*]; `self` inside braces
    names the prefix itself."""
    prefix = []
    while i < len(toks):
        t = toks[i]
        if t.text == "::":
            i += 1
        elif t.kind == "ident" and t.text != "as":
            prefix.append(t.text)
            i += 1
        elif t.text == "*":
            return [prefix + ["*"]], i + 1
        elif t.text == "{":
            paths, i = [], i + 1
            while i < len(toks) and toks[i].text != "}":
                if toks[i].text == ",":
                    i += 1
                    continue
                sub, i = use_trees(toks, i)
                paths += [prefix if s == ["self"] else prefix + s for s in sub]
            return paths, i + 1
        else:
            break
    if i < len(toks) and toks[i].text == "as":
        i += 2
    return [prefix], i


class Module:
    """What one file says: the paths it names, what it re-exports, its child modules."""

    def __init__(self, text):
        toks, self.test_mods, self.test_only = strip_tests(tokenize(text))
        # (segments, line, inline module path) of `use` declarations that are not re-exports, of
        # `pub use`, and of paths written in the code.
        self.uses, self.reexports, self.paths = [], [], []
        self.declared = set()  # `mod x;` / `mod x { }` names
        self.defines = set(m.group(1) for m in ITEM_KEYWORDS.finditer(text))
        self.idents = {}  # identifier -> first line it is written on outside `use` declarations
        # Inline modules (`mod x { ... }`) open and close as braces do; a path inside one is read
        # from there (its `super` is the file's module), and what it uses is its file's.
        inline, depth, opening, i = [], 0, None, 0
        while i < len(toks):
            t = toks[i]
            at = tuple(name for name, _ in inline)
            if t.kind == "punct" and t.text == "{":
                if opening is not None:
                    inline.append((opening, depth))
                    opening = None
                depth += 1
            elif t.kind == "punct" and t.text == "}":
                depth -= 1
                if inline and inline[-1][1] == depth:
                    inline.pop()
            if t.kind == "ident" and t.text == "mod" and i + 1 < len(toks) and toks[i + 1].kind == "ident":
                if not at:
                    self.declared.add(toks[i + 1].text)
                if i + 2 < len(toks) and toks[i + 2].text == "{":
                    opening = toks[i + 1].text
                i += 2
                continue
            if t.kind == "ident" and t.text == "use" and (i == 0 or toks[i - 1].text != "::"):
                public = self._is_pub(toks, i) and not at
                paths, j = use_trees(toks, i + 1)
                for p in paths:
                    (self.reexports if public else self.uses).append((p, t.line, at))
                    if public and p and p[-1] not in ("*", "self"):
                        self.defines.add(p[-1])
                i = j
                continue
            if t.kind == "ident":
                self.idents.setdefault(t.text, t.line)
            if t.kind == "ident" and (i == 0 or toks[i - 1].text != "::"):
                segs, j = [t.text], i + 1
                while j + 1 < len(toks) and toks[j].text == "::" and toks[j + 1].kind == "ident":
                    segs.append(toks[j + 1].text)
                    j += 2
                if len(segs) > 1:
                    self.paths.append((segs, t.line, at))
                i = j
                continue
            i += 1

    @staticmethod
    def _is_pub(toks, i):
        j = i - 1
        if j >= 0 and toks[j].text == ")":
            depth = 0
            while j >= 0:
                if toks[j].text == ")":
                    depth += 1
                elif toks[j].text == "(":
                    depth -= 1
                    if depth == 0:
                        break
                j -= 1
            j -= 1
        return j >= 0 and toks[j].text == "pub"


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


def graph(sources: dict) -> dict:
    """Module path (tuple) -> source text  =>  module -> {module it uses: the path that says so}."""
    parsed = {m: Module(text) for m, text in sources.items()}
    # Test-only modules, and everything under them, are not part of the compiled crate.
    dropped = {m + (name,) for m, mod in parsed.items() for name in mod.test_mods}
    dropped |= {m for m, mod in parsed.items() if mod.test_only}
    mods = {m: mod for m, mod in parsed.items() if not any(m[:len(d)] == d for d in dropped)}
    children = {m: {c[-1] for c in mods if len(c) == len(m) + 1 and c[:-1] == m} for m in mods}

    named, globs = {m: {} for m in mods}, {m: [] for m in mods}
    for m, mod in mods.items():
        for segs, _, _ in mod.reexports:
            target = absolute(m, segs, children[m])
            if target is None or len(target) < 1:
                continue
            if segs[-1] == "*":
                globs[m].append(target[:-1])
            elif len(target) >= 2:
                named[m][segs[-1]] = target

    def owner(segs, seen=0):
        """The module that defines what the absolute path `segs` names."""
        best = ()
        for i in range(len(segs), -1, -1):
            if tuple(segs[:i]) in mods:
                best = tuple(segs[:i])
                break
        rest = segs[len(best):]
        if rest and seen < 8:
            if rest[0] in named.get(best, {}):
                return owner(named[best][rest[0]] + rest[1:], seen + 1)
            for g in globs.get(best, []):
                if tuple(g) in mods and rest[0] in mods[tuple(g)].defines:
                    return owner(g + rest, seen + 1)
        return best

    edges = {m: {} for m in mods}
    for m, mod in mods.items():
        # A name the module re-exports and also writes in its own code is a use of its owner.
        for name, target in named[m].items():
            if name in mod.idents:
                o = owner(target)
                if o != m and o in mods:
                    edges[m].setdefault(o, f"{name} (re-exported here, and used), line {mod.idents[name]}")
        for segs, line, inline in mod.uses + mod.paths:
            segs = [s for s in segs if s != "*"]
            if not segs:
                continue
            target = absolute(m + inline, segs, children[m] if not inline else set())
            if target is None:
                continue
            o = owner(target)
            if o != m and o in mods:
                edges[m].setdefault(o, f"{'::'.join(segs)}, line {line}")
    return edges


def folded(edges: dict) -> dict:
    """The graph onto the top-level modules (`divvy`, `rls`, `settings`, ...): a module of one
    may use a module of another only if no module of the other uses the first."""
    tops = {m[:1] for m in edges if m}
    out = {t: {} for t in tops}
    for m, uses in edges.items():
        for o, p in uses.items():
            if m and o and m[:1] != o[:1]:
                out[m[:1]].setdefault(o[:1], f"{fmt(m)} -> {fmt(o)}: {p}")
    return out


def main() -> int:
    srcs = [Path(a) for a in sys.argv[1:]] or sorted(
        p.parent for p in ROOT.glob("**/Cargo.toml")
        if (p.parent / "src").is_dir() and "fuzz" not in p.parts and "target" not in p.parts
    )
    srcs = [s / "src" if (s / "src").is_dir() else s for s in srcs]
    failed = False
    for src in srcs:
        edges = graph({m: f.read_text() for m, f in module_files(src).items()})
        top = folded(edges)
        cycles, top_cycles = find_cycles(edges), find_cycles(top)
        manifest = src.parent / "Cargo.toml"
        found = re.search(r'^name\s*=\s*"([^"]+)"', manifest.read_text(), re.M) if manifest.exists() else None
        name = found.group(1) if found else str(src)
        for found, g, what in ((cycles, edges, "module cycle(s)"),
                               (top_cycles, top, "cycle(s) between top-level modules")):
            if found:
                failed = True
                report(name, found, g, what)
        if not cycles and not top_cycles:
            print(f"{name}: {len(edges)} modules, {len(top)} top-level, no cycle")
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
