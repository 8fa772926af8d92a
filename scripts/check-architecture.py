#!/usr/bin/env python3
"""check-architecture: every file, folder and test docs/architecture.md names exists.

A name in backticks that ends in `.rs`, `.lua`, `.html`, `.py`, `.sh` or `/` (`server/written.rs`,
`limiter/slots.rs`, `proxy/upstream/`, `window.lua`) must be the end of a path in the tree, so a
room that moves or goes takes the page with it; a test the page names as holding two paths equal
(a backticked snake_case name of five words or more) must be a function of the tree. Run by
.ci/run; prints what it cannot find and exits 1 if there is any.

Usage: scripts/check-architecture.py [PAGE] (default: docs/architecture.md).
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"`([A-Za-z0-9_./-]+(?:\.rs|\.lua|\.html|\.py|\.sh|/))`")


def tree_paths() -> set:
    """Every file and folder of the tree, as paths relative to the root, folders ending in `/`."""
    out = set()
    for p in ROOT.rglob("*"):
        rel = p.relative_to(ROOT)
        if ".git" in rel.parts or "target" in rel.parts:
            continue
        out.add(rel.as_posix() + ("/" if p.is_dir() else ""))
    return out


TEST = re.compile(r"`([a-z][a-z0-9]*(?:_[a-z0-9]+){4,})`")


def missing(text: str, paths: set) -> list:
    """The names in `text` that end no path of `paths`."""
    names = sorted(set(NAME.findall(text)))
    return [n for n in names if not any(p == n or p.endswith("/" + n) for p in paths)]


def functions() -> set:
    """Every `fn` name in the tree's Rust files."""
    names = set()
    for p in ROOT.rglob("*.rs"):
        if ".git" in p.parts or "target" in p.parts:
            continue
        names.update(re.findall(r"\bfn\s+([a-z_][a-z0-9_]*)", p.read_text(errors="replace")))
    return names


def main() -> int:
    page = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "architecture.md"
    text = page.read_text()
    lost = missing(text, tree_paths())
    fns = functions()
    lost += [n for n in sorted(set(TEST.findall(text))) if n not in fns]
    for n in lost:
        print(f"{page.name}: names `{n}`, which is not in the tree")
    if not lost:
        print(f"{page.name}: every file, folder and test it names exists")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
