"""Every page of docs/ and README.md as a reader uses it: each page's ```python blocks run in order in one
namespace from a scratch directory (marks: tests/docs/markdown_blocks.py), the commands its shell blocks
name exist with the flags they give, its relative links lead to files and headings that exist, and the
version ranges it states are setup.py's."""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .markdown_blocks import blocks

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
RUN = [page for page in PAGES if any(b.lang == "python" for b in blocks(page))]
#: Modules a page needs throughout (extras of the dev install): its test is skipped without them.
NEEDS = {"embedding.md": ("flax", "grain"), "grain.md": ("grain",)}


def importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def check_embedding(out: str, namespace: dict) -> None:
    assert "resumed: (10, 32, 8)" in out
    assert "NnxMLP" in out
    assert "20 ['opt_state', 'rng', 'step', 'variables'] ['batch_stats', 'params']" in out, out
    assert not os.path.exists("models/linen-events/checkpoints")
    assert "grain: 60" in out
    assert "hook: step 20, loss" in out and "hook: step 40, loss" in out
    assert "['eval/accuracy', 'eval/loss'," in out and "'loss'" in out
    assert os.path.exists("models/tracked/metrics.jsonl")


def check_porting(out: str, namespace: dict) -> None:
    assert out.count("Prediction is") == 10
    assert namespace["served"]["y"].shape == (64,)                 # the hooks' BestExporter's export, served
    assert namespace["quiet"].log_step_count_steps is None
    assert namespace["evaluations"][-1]["examples"] == 100         # every validation example, once


#: What a page's blocks print or leave, beyond running.
CHECKS = {"embedding.md": check_embedding, "porting.md": check_porting}


@pytest.fixture
def own_logging():
    """A page may configure logging as a program does: put back as it was."""
    root, logger = logging.getLogger(), logging.getLogger("estimator")
    saved = root.handlers[:], root.level, logger.level
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    logger.setLevel(saved[2])


@pytest.mark.parametrize("page", RUN, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_python_blocks_of_a_page_run_in_order(page, tmp_path, monkeypatch, capsys, own_logging):
    for module in NEEDS.get(page.name, ()):
        pytest.importorskip(module)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")         # as porting.md says: no login
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    namespace = {"__name__": page.stem}
    try:
        for block in (b for b in blocks(page) if b.lang == "python"):
            # Line numbers in tracebacks are the page's own.
            code = compile("\n" * (block.line - 1) + block.code, str(page), "exec")
            if not block.fragment and all(importable(m) for m in block.requires):
                exec(code, namespace)
        CHECKS.get(page.name, lambda out, namespace: None)(capsys.readouterr().out, namespace)
    finally:
        # JAX's caches keep the page's functions, and with them their globals: this namespace. Emptied, it
        # holds no daemon (nor its ring's mapping) beyond the test.
        namespace.clear()


# --- shell blocks --------------------------------------------------------------------------------

def commands(code: str):
    """Each command line of a shell block: continuations joined, comments dropped, split at ``&&``/``;``."""
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        command = []
        for word in words + [";"]:
            if word in (";", "&&", "||", "|") or word.endswith(";"):
                if word.endswith(";") and word != ";":
                    command.append(word[:-1])
                if command:
                    yield command
                command = []
            else:
                command.append(word.strip("()"))


@functools.cache
def help_text(*argv: str) -> str:
    done = subprocess.run([sys.executable, *argv, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(argv)} --help: {done.stderr[-2000:]}"
    return done.stdout


def check_command(words: list[str]) -> None:
    """A ``python -m MODULE``/``python FILE.py``/``infeed SUB``/``make TARGET`` command names what exists,
    with flags its ``--help`` lists; other commands (pip, apt-get, a shell loop) are the reader's own."""
    name = os.path.basename(words[0])
    if re.fullmatch(r"python[\d.]*", name):
        if words[1] == "-m":
            module, args = words[2], words[3:]
            assert importable(module), module
            if module == "pytest":
                assert all((ROOT / a.split("::")[0]).exists() for a in args if not a.startswith("-")), words
                return
            argv = ("-m", module) + ((args[0],) if module == "bench" and args and not args[0].startswith("-")
                                     else ())
        else:
            assert (ROOT / words[1]).is_file(), words[1]
            argv, args = (words[1],), words[2:]
    elif name == "infeed":
        argv, args = ("-m", "infeed", words[1]), words[2:]
    elif name == "make":
        makefile = (ROOT / "Makefile").read_text()
        targets = set(re.findall(r"^([\w.-]+):", makefile, re.M)) | set(re.search(r"^\.PHONY:(.*)$", makefile,
                                                                                   re.M).group(1).split())
        assert {w for w in words[1:] if "=" not in w and not w.startswith("-")} <= targets, words
        return
    else:
        return
    flags = {a.split("=")[0] for a in args if a.startswith("--")}
    listed = help_text(*argv)
    assert all(re.search(rf"{re.escape(f)}\b", listed) for f in flags), (words, flags)


SHELL = [(page, block) for page in PAGES for block in blocks(page) if block.lang in ("sh", "bash", "console")]


@pytest.mark.parametrize("page, block", SHELL, ids=[f"{p.relative_to(ROOT)}:{b.line}" for p, b in SHELL])
def test_the_commands_of_a_shell_block_exist_with_their_flags(page, block):
    for words in commands(block.code):
        check_command(words)


# --- links and versions ----------------------------------------------------------------------------

def anchors(page: Path) -> set[str]:
    """GitHub's ids of the page's headings."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue                    # https:, mailto:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def ranges() -> dict[str, str]:
    """setup.py's and the build's version ranges, by lowercase name."""
    text = (ROOT / "pyproject.toml").read_text() + (ROOT / "setup.py").read_text()     # setup.py's last: it wins
    found = {name.lower(): spec for name, spec in re.findall(r'"([A-Za-z][\w.-]*)(?:\[\w+\])?([<>=!][^";]*)"', text)}
    found["python"] = re.search(r'python_requires="([^"]+)"', text).group(1)
    return found


def test_the_version_ranges_the_docs_state_are_setup_pys():
    wanted, stated = ranges(), []
    versions = (ROOT / "docs" / "embedding.md").read_text().split("## Versions")[1].split("\n## ")[0]
    stated += re.findall(r"([A-Za-z][\w.-]*)\s+`(>=[^`]+)`", versions)
    table = (ROOT / "docs" / "porting.md").read_text().split("## Supported versions")[1].split("\n## ")[0]
    for cell, spec in re.findall(r"^\| ([^|]+?) \|[^|\n]*\|[^|\n]*\| `([^`]+)` \|", table, re.M):
        stated += [(name, spec) for name in re.sub(r"\(.*?\)", "", cell).replace(",", " ").split()]
    assert len(stated) > 15
    wrong = [(name, spec, wanted.get(name.lower())) for name, spec in stated if wanted.get(name.lower()) != spec]
    assert not wrong, wrong
