"""docs/embedding.md's code blocks, run in order in one namespace from a scratch directory."""

import os
import re

import pytest

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "embedding.md")

pytest.importorskip("flax")


def python_blocks(path):
    """(first line number, code) of every ```python block."""
    text = open(path).read()
    for match in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
        yield text.count("\n", 0, match.start()) + 2, match.group(1)


def test_every_block_of_the_embedding_page_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "embedding"}
    blocks = list(python_blocks(DOC))
    assert len(blocks) >= 3
    try:
        for line, code in blocks:
            # Line numbers in tracebacks are the page's own.
            exec(compile("\n" * (line - 1) + code, os.path.abspath(DOC), "exec"), namespace)
    finally:
        # JAX's caches keep the page's functions, and with them their globals: this namespace. Emptied, it holds
        # no daemon (nor its ring's mapping) beyond the test.
        namespace.clear()
    out = capsys.readouterr().out
    assert "resumed: (10, 32, 8)" in out
    assert "NnxMLP" in out
    assert "20 ['opt_state', 'rng', 'step', 'variables'] ['batch_stats', 'params']" in out, out
    assert not os.path.exists("models/linen-events/checkpoints")
    assert "grain: 60" in out
    assert "hook: step 20, loss" in out and "hook: step 40, loss" in out
    assert "['eval/accuracy', 'eval/loss'," in out and "'loss'" in out
    assert os.path.exists("models/tracked/metrics.jsonl")
