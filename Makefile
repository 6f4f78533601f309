# The two commands a new user runs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: demo test bench soak fuzz asan clean

$(STAMP): setup.py pyproject.toml $(wildcard infeed/*/*.pyx infeed/*/*.pxd infeed/*/*.h infeed/tfrecord/_crc32c.c)
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
	$(BIN)/python -m pip install -q 'atheris>=2.3,<4' 'Cython>=3.0.10,<4' 'setuptools>=68,<90'
	PY=$(BIN)/python ASAN_SECONDS=$${ASAN_SECONDS:-60} tests/fuzz/run_asan.sh

clean:
	rm -rf $(VENV) build *.egg-info infeed/*/*.so infeed/tfrecord/_tfrecord.c infeed/example/_example.c infeed/example/_image.c infeed/ring/_ring.c
