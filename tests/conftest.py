import os
from pathlib import Path

import pytest

#: TensorFlow-written conformance files, beside the project's checkout.
FIXTURES = Path(os.environ.get("INFEED_FIXTURES", Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "tfrecord"))


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    if not (FIXTURES / "expected.json").exists():
        pytest.skip(f"TensorFlow fixtures not found at {FIXTURES} (set INFEED_FIXTURES)")
    return FIXTURES

# The atheris harness is a program, not a test module (and needs atheris): keep --doctest-modules out of it.
collect_ignore = ["fuzz/fuzz_infeed.py"]
