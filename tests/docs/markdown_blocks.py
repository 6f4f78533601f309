"""The fenced code blocks of a Markdown page, with the marks that say how the doc tests run them.

A ```python block runs as it is, in the page's namespace, in the page's order. An HTML comment (nothing on
the rendered page) on the line before a block marks it:

- ``<!-- fragment -->``: compiled only. It leaves out what a reader fills in (``...``, their model, their
  bucket), or it is another library's code (TensorFlow's side of a port).
- ``<!-- requires: wandb -->``: run where these modules import; compiled only elsewhere.

A block inside ``<!-- setup: why ... -->`` is hidden from readers and runs like the others: what a reader
brings (their data files), made small.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```(\S*)\s*$")
MARK = re.compile(r"^<!--\s*(fragment|requires:\s*([\w., ]+?))\s*-->\s*$")


@dataclass
class Block:
    lang: str           # the info string: python, sh, ... ("" for none)
    code: str
    line: int           # the page's line of the block's first line of code
    fragment: bool = False
    requires: tuple = ()
    hidden: bool = False            # inside <!-- setup ... -->


def blocks(path: Path) -> list[Block]:
    """Every fenced block of the page, in order."""
    lines = Path(path).read_text().splitlines()
    found, mark, hidden, i = [], None, False, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("<!-- setup"):
            hidden = True
        elif hidden and line.strip() == "-->":
            hidden = False
        elif match := MARK.match(line):
            mark = match
        elif match := FENCE.match(line):
            end = next(j for j in range(i + 1, len(lines)) if lines[j] == "```")
            requires = tuple(re.split(r"[,\s]+", mark.group(2).strip())) if mark and mark.group(2) else ()
            found.append(Block(match.group(1), "\n".join(lines[i + 1:end]) + "\n", i + 2,
                               fragment=bool(mark and mark.group(1) == "fragment"), requires=requires,
                               hidden=hidden))
            mark, i = None, end
        elif line.strip():
            mark = None                 # a mark binds the block right after it only
        i += 1
    return found
