import os
from pathlib import Path

# Multi-device code runs on 8 CPU "devices"; XLA reads this when JAX first starts, so set it before any import.
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

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
