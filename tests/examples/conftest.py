"""The scripts of examples/, loaded by path as ``python examples/NAME.py`` runs them (examples/ first on sys.path)."""

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def load_example(monkeypatch):
    def load(name: str):
        monkeypatch.syspath_prepend(str(EXAMPLES))
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        return module
    return load
