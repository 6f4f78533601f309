"""The package's metadata says what is tested: setup.py's ranges against constraints/oldest.txt and newest.txt
(each lower bound is the oldest pin, each newest pin inside its range), the Python versions, and the sdist's
manifest naming every source the extensions build from."""

import ast
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _setup_call() -> dict:
    """setup()'s keyword arguments that are literals, read from setup.py's source (nothing run)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(node for node in ast.walk(tree)
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setup")
    out = {}
    for keyword in call.keywords:
        try:
            out[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            pass                                    # ext_modules, packages: computed
    return out


def _pins(name: str) -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints" / f"{name}.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", line
            pins[_normalise(requirement.name)] = Version(spec.version)
    return pins


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


SETUP = _setup_call()
RUNTIME = {_normalise(Requirement(r).name): Requirement(r).specifier for r in SETUP["install_requires"]}
EXTRAS = {_normalise(Requirement(r).name): Requirement(r).specifier
          for extra in ("grain", "flax", "gcs", "png", "dev") for r in SETUP["extras_require"][extra]}
BUILD = {_normalise(Requirement(r).name): Requirement(r).specifier
         for r in re.findall(r'"([^"]+)"', re.search(r"requires = \[(.*?)\]",
                                                     (ROOT / "pyproject.toml").read_text()).group(1))}


def _lower_bound(specifier: SpecifierSet) -> Version:
    (lower,) = [Version(s.version) for s in specifier if s.operator == ">="]
    return lower


@pytest.mark.parametrize("end", ["oldest", "newest"])
def test_every_runtime_requirement_is_pinned_at_both_ends_inside_its_range(end):
    pins = _pins(end)
    for name, specifier in {**RUNTIME, **{n: BUILD[n] for n in ("cython", "setuptools")}}.items():
        assert name in pins, f"constraints/{end}.txt pins no {name}"
        assert pins[name] in specifier, f"{end}: {name}=={pins[name]} is outside setup.py's {specifier}"
    for name in ("grain", "flax", "pillow", "gcsfs"):
        assert pins[name] in EXTRAS[name], f"{end}: {name}=={pins[name]} is outside the extra's {EXTRAS[name]}"


def test_each_lower_bound_is_the_oldest_release_tested():
    oldest = _pins("oldest")
    for name, specifier in {**RUNTIME, **{n: EXTRAS[n] for n in ("grain", "flax", "pillow", "gcsfs")},
                            **{n: BUILD[n] for n in ("cython", "setuptools")}}.items():
        assert _lower_bound(specifier) == oldest[name], f"{name}: {specifier} but oldest.txt pins {oldest[name]}"


def test_python_versions_in_python_requires_and_the_classifiers_agree():
    requires = SpecifierSet(SETUP["python_requires"])
    minors = [c.rsplit(" :: ", 1)[1] for c in SETUP["classifiers"] if re.fullmatch(r".*Python :: 3\.\d+", c)]
    assert minors == ["3.11", "3.12", "3.13", "3.14"]
    assert all(Version(m) in requires for m in minors)
    assert Version("3.10") not in requires and Version("3.15") not in requires
    makefile = (ROOT / "Makefile").read_text()
    assert "VERSIONS_oldest := 3.11" in makefile and "VERSIONS_newest := 3.14 3.13 3.12" in makefile
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'make test PYTHON="$py314"' in ci and 'make check-install PYTHON="$(tools/find-python 3.14 3.13)"' in ci


def test_the_sdist_manifest_names_every_source_the_extensions_build_from():
    """The generated C is left out (the build's own Cython makes it); the hand-written C, the .pyx, .pxd and .h
    files go in. `make check-install` builds from the sdist itself."""
    lines = (ROOT / "MANIFEST.in").read_text().splitlines()
    assert "recursive-include infeed *.pyx *.pxd *.h" in lines
    included = {word for line in lines if line.startswith("include ") for word in line.split()[1:]}
    for source in re.findall(r'"(infeed/[\w/]+\.c)"', (ROOT / "setup.py").read_text()):
        assert source in included, f"MANIFEST.in leaves out {source}"


def _libjpeg_turbo():
    """setup.py's ``libjpeg_turbo`` alone, compiled from its source (running setup.py would build)."""
    source = (ROOT / "setup.py").read_text()
    tree = ast.parse(source)
    keep = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "libjpeg_turbo"
            or isinstance(node, ast.Assign) and node.targets[0].id in ("JPEG_DECODER", "LIBJPEG_PACKAGES")
            or isinstance(node, ast.Import)]
    namespace = {}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "setup.py", "exec"), namespace)
    return namespace["libjpeg_turbo"]


def test_the_build_finds_libjpeg_turbo_or_says_once_that_jpegs_decode_whole(tmp_path, monkeypatch, capsys):
    find = _libjpeg_turbo()
    monkeypatch.setenv("PATH", str(tmp_path))                   # no pkg-config
    monkeypatch.delenv("CPATH", raising=False)
    assert find(include_places=()) is None                      # no headers anywhere
    err = capsys.readouterr().err
    assert err.count("infeed: libjpeg-turbo's headers were not found") == 1
    assert "JPEGs are decoded whole through simplejpeg" in err and "libjpeg-dev (Debian, Ubuntu)" in err
    old = tmp_path / "old"
    old.mkdir()
    (old / "jpeglib.h").write_text("/* IJG libjpeg 6b, without the crop API */\n")
    monkeypatch.setenv("CPATH", str(old))
    assert find(include_places=()) is None                      # a libjpeg without the crop API is not enough
    assert "headers were not found" in capsys.readouterr().err
    turbo = tmp_path / "turbo"
    turbo.mkdir()
    (turbo / "jpeglib.h").write_text("EXTERN(void) jpeg_crop_scanline(j_decompress_ptr cinfo);\n")
    monkeypatch.setenv("CPATH", f"{old}:{turbo}")
    assert find(include_places=()) == {"include_dirs": [], "library_dirs": [], "libraries": ["jpeg"]}
    assert capsys.readouterr().err == ""


def test_the_crop_window_decoder_is_built_where_libjpeg_turbo_is_installed():
    """This machine's and CI's have libjpeg-dev: the wheels and the tests use the window decoder."""
    from infeed.example import image

    if _libjpeg_turbo()() is None:
        pytest.skip("libjpeg-turbo's headers are not installed here")
    assert image.JPEG_DECODER == "libjpeg-turbo crop window"
