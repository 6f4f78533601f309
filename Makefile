# The two commands a new user runs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: demo test test-oldest test-newest bench soak fuzz asan clean

EXT_SOURCES := $(wildcard infeed/*/*.pyx infeed/*/*.pxd infeed/*/*.h infeed/tfrecord/_crc32c.c)
# What building the extensions in place leaves (every venv here shares it: see test-oldest).
EXT_BUILT := infeed/*/*.so infeed/tfrecord/_tfrecord.c infeed/example/_example.c infeed/example/_image.c infeed/ring/_ring.c

$(STAMP): setup.py pyproject.toml $(EXT_SOURCES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

# The infeed's own check (write, read back, compare every value; ~10 s), then the main job: the estimator
# trained on scikit-learn's digits through TFRecords and the daemon, evaluated, exported and served.
demo: $(STAMP)
	$(BIN)/python examples/infeed_roundtrip.py
	$(BIN)/python examples/digits.py

test: $(STAMP)
	$(BIN)/python -m pytest -q

# The two ends of the supported versions (setup.py's ranges; docs/porting.md): .venv-oldest with every lower bound
# (constraints/oldest.txt), .venv-newest with the newest release below every upper bound (constraints/newest.txt).
# Each builds the extensions with its own numpy, Cython and setuptools (no build isolation; in place, so the last
# venv built leaves its extensions to the others: built against numpy >= 2.0, they load under any numpy 2.x),
# then runs the tests of what those versions touch: the estimator, checkpoints, export, the compiled loop, the
# feeder, host calls, decoding and conversion, the Grain source, docs/embedding.md's Flax and Grain blocks, and the
# packages' doctests (~3 minutes each on 2 cores, set-up included).
COMPAT_TESTS := tests/estimator tests/xla_runtime tests/reliability/test_checkpoints.py tests/reliability/test_export.py \
	tests/infeed/example tests/infeed/tfrecord tests/infeed/commands/test_convert.py tests/infeed/test_grain_source.py \
	tests/docs infeed xla_runtime estimator

.venv-%/.installed: constraints/%.txt setup.py pyproject.toml $(EXT_SOURCES)
	test -x .venv-$*/bin/python || $(PYTHON) -m venv .venv-$*
	.venv-$*/bin/python -m pip install -q --upgrade "pip>=24"
	.venv-$*/bin/python -m pip install -q -c constraints/$*.txt Cython setuptools numpy wheel
	rm -f $(EXT_BUILT)
	.venv-$*/bin/python -m pip install -q --no-build-isolation -c constraints/$*.txt -e '.[dev]'
	.venv-$*/bin/python -m pip check
	touch $@

test-oldest test-newest: test-%: .venv-%/.installed
	.venv-$*/bin/python -m pip list 2>/dev/null | grep -E '^(jax|jaxlib|numpy|ml_dtypes|pyarrow|optax|orbax-checkpoint|etils|tqdm|flatbuffers|simplejpeg|Cython|setuptools) '
	.venv-$*/bin/python -m pytest -q $(COMPAT_TESTS)

# Every suite, ~10 minutes on 2 cores: tables, then bench-results/<date>-<host>.json, .md and plots.
bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python -m bench all

# The daemon and its rings under load for SOAK_SECONDS (default 180) from SOAK_CLIENTS processes (default 3):
# daemons started and closed, workers and servers killed, attach/detach, gc all along (not part of make test).
soak: $(STAMP)
	$(BIN)/python tests/soak/soak_daemon.py

fuzz: $(STAMP)
	$(BIN)/python -m pip install -q 'atheris>=2.3,<4'
	$(BIN)/python tests/fuzz/fuzz_infeed.py -max_total_time=$${FUZZ_SECONDS:-60}

# The extensions rebuilt with AddressSanitizer + UBSan into build/asan (the in-place .so files
# are left alone) and the atheris harness run against them for ASAN_SECONDS (default 60).
asan: $(STAMP)
	$(BIN)/python -m pip install -q 'atheris>=2.3,<4' 'Cython>=3.2,<4' 'setuptools>=68,<90'
	PY=$(BIN)/python ASAN_SECONDS=$${ASAN_SECONDS:-60} tests/fuzz/run_asan.sh

clean:
	rm -rf $(VENV) .venv-oldest .venv-newest build *.egg-info $(EXT_BUILT)
