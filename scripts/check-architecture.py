#!/usr/bin/env python3
"""check-architecture: every file and folder docs/architecture.md names exists.

A name in backticks that ends in `.rs`, `.lua`, `.html`, `.py`, `.sh` or `/` (`server/written.rs`,
`limiter/slots.rs`, `proxy/upstream/`, `window.lua`) must be the end of a path in the tree, so a
room that moves or goes takes the page with it. Run by .ci/run; prints what it cannot find and
exits 1 if there is any.

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


def missing(text: str, paths: set) -> list:
    """The names in `text` that end no path of `paths`."""
    names = sorted(set(NAME.findall(text)))
    return [n for n in names if not any(p == n or p.endswith("/" + n) for p in paths)]


def main() -> int:
    page = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "architecture.md"
    lost = missing(page.read_text(), tree_paths())
    for n in lost:
        print(f"{page.name}: names `{n}`, which is not in the tree")
    if not lost:
        print(f"{page.name}: every file and folder it names exists")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
