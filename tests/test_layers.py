"""The tree's layers hold: each package, and each sub-package of infeed, estimator and bench, imports only the ones
below it; and no module outgrows one reader's sitting (:data:`MAX_MODULE_LINES`).

    estimator  ->  xla_runtime, infeed          (xla_runtime and infeed never import each other or estimator)
    infeed:  commands -> daemon -> ring -> tfds -> example -> tfrecord -> errors
    estimator:  estimator.py, training.py, hooks.py, profiling.py -> loop -> config -> checkpoints -> export
                                                                    summaries.writers -> summaries -> errors
                (checkpoints, export and summaries never import the loop, the config or each other but for
                warm starts from an export; regular_files sits under checkpoints and export, errors under all)
    bench:  __main__.py -> suites -> peers -> data, harness;  report -> harness
                (the machinery, harness and report, and the peers never import a suite)

Read from the sources' import statements (lazy imports inside functions included), so a cycle or an
import against the flow fails here, before it is a tangle.
"""

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: infeed's parts from the bottom up: a part may import itself and those before it.
INFEED_LAYERS = ["errors", "tfrecord", "example", "tfds", "ring", "daemon", "commands"]
#: What each package may import of the project.
PACKAGES = {"infeed": {"infeed"}, "xla_runtime": {"xla_runtime"}, "estimator": {"estimator", "infeed", "xla_runtime"}}
#: estimator's parts (a module or a sub-package, by dotted path under estimator/; the longest that holds a module
#: is its part) and what else each may import of estimator. A part not named here (estimator.py, training.py,
#: hooks.py, profiling.py and the faces: what a user calls) may import any; a named part never imports those.
ESTIMATOR_LAYERS = {
    "errors": set(),
    "regular_files": set(),                          # shared by checkpoints' and exports' digests
    "spec": {"errors"},
    "metrics": {"errors"},
    "export": {"errors", "regular_files"},
    "checkpoints": {"errors", "regular_files", "export"},     # export: warm starts from an export's variables
    "summaries": {"errors"},                         # data and event files, under the writers
    "summaries.writers": {"errors", "summaries"},
    "config": {"errors", "checkpoints", "summaries.writers"},
    "loop": {"errors", "spec", "metrics", "config", "checkpoints", "summaries", "summaries.writers"},
}
#: How a check names an import of a name from ``estimator/__init__.py`` (``from estimator import RunConfig``).
FACE = "estimator's face"
#: bench's sub-packages and what else each may import of bench. ``__main__.py`` (``python -m bench``, which finds
#: the suites) and the face ``__init__.py`` may import any; every module of bench is in one of these.
BENCH_LAYERS = {
    "harness": set(),                                # timing, results, tables, the machine's facts
    "data": set(),                                   # the datasets and photos the suites and peers read
    "report": {"harness"},                           # a results file's report, plots, comparison
    "peers": {"harness", "data"},                    # servers, the store proxy, W parsers, other decoders
    "suites": {"harness", "data", "peers"},
}
#: The most lines a module of ours may have: past it, a module holds several jobs and becomes several modules.
MAX_MODULE_LINES = 600
#: Modules above :data:`MAX_MODULE_LINES` still, and why (each to be split, not added to).
LONG_MODULES = {
    "infeed/example/_example.pyx": "the wire-format decoder: one extension module, its cdef plan shared by both paths",
    "infeed/tfrecord/_tfrecord.pyx": "the record reader: one extension module, its buffer shared by the framing paths",
}


#: Cython's imports and cimports (its sources are not Python's syntax).
_CYTHON_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+c?import\s+([\w, ]+)|c?import\s+([\w.]+))", re.M)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of ``path``, relative ones resolved."""
    if path.suffix == ".pyx":
        text = path.read_text()
        out = []
        for m in _CYTHON_IMPORT.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            if m.group(1):
                out.append((line, m.group(1)))
                out += [(line, f"{m.group(1)}.{name.strip()}") for name in m.group(2).split(",")]
            else:
                out.append((line, m.group(3)))
        return out
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1]) if path.is_relative_to(ROOT) else ""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]   # `from infeed import ring`
    return out


def _sources(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*") if p.suffix in (".py", ".pyx") and p.is_file())


def _infeed_part(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "infeed" or len(parts) < 2 or parts[1] not in INFEED_LAYERS:
        return None
    return parts[1]


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_packages_import_only_the_packages_below_them(package):
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {module}"
             for path in _sources(package) for line, module in _imports(path)
             if module.split(".")[0] in PACKAGES and module.split(".")[0] not in PACKAGES[package]]
    assert not wrong, "\n".join(wrong)


def test_infeed_sub_packages_import_only_downwards():
    wrong = []
    for path in _sources("infeed"):
        here = path.relative_to(ROOT / "infeed").parts[0].removesuffix(".py").removesuffix(".pyx")
        if here not in INFEED_LAYERS:
            continue                                   # __init__.py, __main__.py, _native.py: the package's face
        for line, module in _imports(path):
            there = _infeed_part(module)
            if there is not None and INFEED_LAYERS.index(there) > INFEED_LAYERS.index(here):
                wrong.append(f"infeed/{path.relative_to(ROOT / 'infeed')}:{line} imports {module} "
                             f"({there} is above {here})")
    assert not wrong, "\n".join(wrong)


def _estimator_part(dotted: str) -> str | None:
    """The part of ``estimator.<dotted>`` (a module, or a name in one): the longest of :data:`ESTIMATOR_LAYERS`
    that holds it; ``None`` for a part not named there; :data:`FACE` for a name of ``estimator/__init__.py``."""
    names = dotted.split(".")
    if not (ROOT / "estimator" / names[0]).is_dir() and not (ROOT / "estimator" / f"{names[0]}.py").is_file():
        return FACE
    return next((".".join(names[:n]) for n in range(len(names), 0, -1) if ".".join(names[:n]) in ESTIMATOR_LAYERS),
                None)


def _against_the_flow(here: str | None, module: str) -> bool:
    """Whether a module of the part ``here`` may not import ``module``."""
    if here is None or module.split(".")[0] != "estimator" or module == "estimator":
        return False                                 # not ours, or `from estimator import x`'s package itself
    there = _estimator_part(module.removeprefix("estimator."))
    return there != here and there not in ESTIMATOR_LAYERS[here]


def test_estimator_parts_import_only_the_parts_below_them():
    wrong = []
    for path in _sources("estimator"):
        inside = path.relative_to(ROOT / "estimator").with_suffix("").parts
        inside = inside[:-1] if inside[-1] == "__init__" else inside          # a package's face: the package
        here = _estimator_part(".".join(inside)) if inside else None          # estimator/__init__.py: the top
        wrong += [f"estimator/{path.relative_to(ROOT / 'estimator')}:{line} imports {module} "
                  f"({_estimator_part(module.removeprefix('estimator.'))} is not under {here})"
                  for line, module in _imports(path) if _against_the_flow(here, module)]
    assert not wrong, "\n".join(wrong)


def test_the_estimator_layer_check_finds_an_import_against_the_flow():
    assert _against_the_flow("checkpoints", "estimator.loop.bookkeeping")          # checkpoints under the loop
    assert _against_the_flow("export", "estimator.checkpoints.manager")            # export under checkpoints
    assert _against_the_flow("summaries", "estimator.summaries.writers.values")    # data under the writers
    assert _against_the_flow("loop", "estimator.hooks") and _against_the_flow("loop", "estimator.estimator.Estimator")
    assert _against_the_flow("config", "estimator.RunConfig")                      # through the package's face
    assert not _against_the_flow("loop", "estimator.checkpoints.manager.Checkpoints")
    assert not _against_the_flow("summaries.writers", "estimator.summaries.data")
    assert not _against_the_flow(None, "estimator.loop.inputs")                    # estimator.py drives them all
    assert _estimator_part("summaries.writers.run_writers") == "summaries.writers"
    assert _estimator_part("estimator") is None and _estimator_part("writers") is None


def _bench_part(module: str) -> str | None:
    """The sub-package of bench that ``module`` (``bench.suites.infeed_suite.DaemonCase``) is in; None for the
    command and the face (``bench.__main__``, ``bench``, ``bench.Case``)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "bench" and len(parts) > 1 and (ROOT / "bench" / parts[1]).is_dir() else None


def _bench_against_the_flow(here: str, module: str) -> bool:
    """Whether a module of bench's part ``here`` may not import ``module``."""
    if module.split(".")[0] != "bench":
        return False
    there = _bench_part(module)
    return there != here and there not in BENCH_LAYERS[here]


def test_bench_parts_import_only_the_parts_below_them():
    wrong = []
    for path in _sources("bench"):
        inside = path.relative_to(ROOT / "bench").parts
        if len(inside) == 1:
            continue                                   # __main__.py and __init__.py: the command and its face
        here = inside[0]
        assert here in BENCH_LAYERS, f"bench/{here}/ is no part of BENCH_LAYERS: say what it may import"
        wrong += [f"bench/{path.relative_to(ROOT / 'bench')}:{line} imports {module} "
                  f"({_bench_part(module) or 'the command or the face'} is not under {here})"
                  for line, module in _imports(path) if _bench_against_the_flow(here, module)]
    assert not wrong, "\n".join(wrong)


def test_the_bench_layer_check_finds_an_import_against_the_flow():
    assert _bench_against_the_flow("harness", "bench.suites.daemon_runs.DaemonCase")     # machinery under suites
    assert _bench_against_the_flow("peers", "bench.suites.infeed_suite")                 # peers under suites
    assert _bench_against_the_flow("report", "bench.data.datasets")
    assert _bench_against_the_flow("suites", "bench.__main__") and _bench_against_the_flow("harness", "bench.Case")
    assert not _bench_against_the_flow("suites", "bench.peers.store_proxy.StoreProxy")
    assert not _bench_against_the_flow("peers", "bench.data.photos") and not _bench_against_the_flow("data", "infeed")
    assert all("suites" not in allowed for part, allowed in BENCH_LAYERS.items() if part != "suites")


def _modules() -> list[Path]:
    """Every module of ours: the packages' and bench's sources (not the tests, examples or tools)."""
    return [path for package in [*sorted(PACKAGES), "bench"] for path in _sources(package)]


def test_no_module_is_longer_than_the_limit():
    """A module past :data:`MAX_MODULE_LINES` is split by job into several (``infeed/ring/ring.py`` into the
    worker table, the error record and the header beside it), never exempted: :data:`LONG_MODULES` only shrinks."""
    lines = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in _modules()}
    long = {name: n for name, n in lines.items() if n > MAX_MODULE_LINES}
    assert set(long) <= set(LONG_MODULES), "\n".join(f"{name}: {n} lines (at most {MAX_MODULE_LINES})"
                                                     for name, n in long.items() if name not in LONG_MODULES)
    assert set(LONG_MODULES) <= set(long), f"no longer over the limit, drop from LONG_MODULES: " \
                                           f"{sorted(set(LONG_MODULES) - set(long))}"


def _faces() -> list[Path]:
    """estimator's faces: each package's ``__init__.py``, and ``writers.py`` (the writers' public name)."""
    return sorted(ROOT.glob("estimator/**/__init__.py")) + [ROOT / "estimator" / "writers.py"]


@pytest.mark.parametrize("face", _faces(), ids=lambda p: str(p.relative_to(ROOT)))
def test_estimator_faces_only_re_import(face):
    """A face holds its docstring, imports and ``__all__`` (every name it imports, and no other): the code is in
    the modules behind it, where a reader of the tree finds it."""
    tree = ast.parse(face.read_text())
    imported, listed = set(), None
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imported |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__all__"]:
            listed = set(ast.literal_eval(node.value))
        else:
            assert node is tree.body[0] and isinstance(node, ast.Expr), f"line {node.lineno}: a face only re-imports"
    assert listed == imported


def _private(name: str) -> bool:
    """A private part of a dotted name: ``_src``, ``_impl`` (never a dunder such as ``__future__``)."""
    return any(part.startswith("_") and not part.endswith("__") for part in name.split("."))


def _another_package(module: str) -> bool:
    """Neither ours nor Python's own (whose underscored names, such as ``os._exit``, are documented API)."""
    top = module.split(".")[0]
    return top not in PACKAGES and top not in sys.stdlib_module_names


def _private_uses(path: Path) -> list[str]:
    """``line: name`` for each private module or name of another package that ``path`` imports
    (``from orbax.checkpoint._src.path import x``, ``import jax._src``, ``from numpy import _core``) or reaches
    through an imported name (``jax._src.monitoring``)."""
    found = [f"{line}: {module}" for line, module in _imports(path) if _another_package(module) and _private(module)]
    if path.suffix == ".py":
        tree = ast.parse(path.read_text(), str(path))
        bound = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names if _another_package(alias.name)}
        bound |= {alias.asname or alias.name for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom) and not node.level and node.module
                  and _another_package(node.module) for alias in node.names}
        found += [f"{node.lineno}: {node.value.id}.{node.attr}" for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                  and _private(node.attr)]
    return sorted(found, key=lambda use: int(use.split(":")[0]))


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_private_module_of_another_package_is_imported(package):
    """Only other packages' public APIs: a private module (``orbax.checkpoint._src``) moves in any release.
    Our own underscore modules (``infeed.tfrecord._tfrecord``, ``infeed._native``) are ours to use."""
    wrong = [f"{path.relative_to(ROOT)}:{use}" for path in _sources(package) for use in _private_uses(path)]
    assert not wrong, "\n".join(wrong)


def test_the_private_import_check_finds_each_kind(tmp_path):
    source = tmp_path / "example.py"
    source.write_text("from orbax.checkpoint._src.path import atomicity\nimport jax._src.core\nimport numpy as np\n"
                      "from numpy import _core\nfrom jax import monitoring\nmonitoring._unregister()\nnp._core\n"
                      "from __future__ import annotations\nfrom infeed._native import x\nimport jax\njax.numpy\nimport os\n"
                      "os._exit(0)\n")
    found = _private_uses(source)
    assert [use.split(":")[0] for use in found] == ["1", "1", "2", "4", "6", "7"], found


def test_only_the_three_packages_are_installed():
    """bench/ and examples/ run from a checkout: "bench" is no name to take in the user's site-packages."""
    include = re.search(r"find_packages\(include=\[([^\]]*)\]", (ROOT / "setup.py").read_text()).group(1)
    assert {name.strip().strip('"') for name in include.split(",")} == {
        "infeed", "infeed.*", "xla_runtime", "xla_runtime.*", "estimator", "estimator.*"}
