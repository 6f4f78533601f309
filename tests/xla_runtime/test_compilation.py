"""JAX's persistent compilation cache (one directory per process, read by the next process) and CompileWatch."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest

import xla_runtime as xr
from xla_runtime import compilation

ROOT = os.path.dirname(os.path.dirname(xr.__file__))

CACHED_LOOP = textwrap.dedent("""
    import json, sys, jax, jax.numpy as jnp, numpy as np
    import xla_runtime as xr
    jax.jit(lambda x: x + 1)(jnp.zeros(3))      # a compilation before the cache is set: JAX decides then
    xr.enable_compilation_cache(sys.argv[1])
    loop = xr.compile_loop(lambda s, b: (s + b.sum(), b.mean()), 3, xr.make_mesh({"data": 1}, jax.devices()[:1]))
    with xr.CompileWatch() as watch:
        total = float(loop(jnp.zeros(()), np.ones((3, 4), np.float32))[0])
    print(json.dumps({"total": total, **watch.as_dict()}))
""")


def _run_cached_loop(cache_dir) -> dict:
    # JAX_ENABLE_COMPILATION_CACHE=false, as python -m bench's processes have it: asking for a directory overrides it
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_ENABLE_COMPILATION_CACHE="false")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", CACHED_LOOP, str(cache_dir)], capture_output=True, text=True,
                         env=env, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_next_process_reads_the_loop_from_the_persistent_cache(tmp_path):
    cache = tmp_path / "made" / "by" / "enable"
    first = _run_cached_loop(cache)
    assert first["total"] == 12.0 and first["cache_writes"] >= 1 and first["cache_hits"] == 0
    assert any(cache.iterdir())
    second = _run_cached_loop(cache)
    assert second["total"] == 12.0 and second["cache_hits"] >= 1 and second["cache_writes"] == 0
    assert second["programs"] == second["cache_hits"]


def test_a_second_directory_in_the_same_process_is_refused_and_the_same_one_is_not(tmp_path, jax_cache_settings):
    assert xr.compilation_cache_dir() is None
    xr.enable_compilation_cache(tmp_path / "a")
    assert xr.compilation_cache_dir() == str(tmp_path / "a") and (tmp_path / "a").is_dir()
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    xr.enable_compilation_cache(os.path.relpath(tmp_path / "a"))           # the same directory, spelt otherwise
    with pytest.raises(ValueError, match=rf"already keeps its compiled programs in {tmp_path / 'a'}.*"
                                         rf"{tmp_path / 'b'} cannot be used too"):
        xr.enable_compilation_cache(tmp_path / "b")
    assert xr.compilation_cache_dir() == str(tmp_path / "a") and not (tmp_path / "b").exists()


def test_compile_watch_counts_programs_and_their_seconds_while_open(jax_cache_settings):      # with no cache
    with xr.CompileWatch() as watch:
        jax.block_until_ready(jax.jit(lambda x: jnp.sin(x) * 7)(jnp.arange(6.0)))
    assert watch.programs >= 1 and watch.compile_seconds > 0 and watch.trace_seconds > 0
    assert watch.seconds == pytest.approx(watch.trace_seconds + watch.lower_seconds + watch.compile_seconds)
    assert watch.cache_hits == 0 and watch.cache_writes == 0
    before = watch.as_dict()
    jax.jit(lambda x: jnp.cos(x) * 5)(jnp.arange(4.0))          # after the block: not counted
    assert watch.as_dict() == before


@pytest.mark.parametrize("jaxlib_version, processes, platform, hangs", [
    ("0.12.1", 2, "cpu", True), ("0.12.1", 1, "cpu", False), ("0.12.1", 2, "gpu", False),
    ("0.12.0.1", 2, "cpu", False), ("0.10.2", 4, "cpu", False)])
def test_the_cache_is_known_to_hang_only_loops_of_several_cpu_processes_under_jaxlib_0_12_1(
        jaxlib_version, processes, platform, hangs):
    assert compilation.cache_hangs_here(jaxlib_version, processes, platform) is hangs


def test_where_the_cache_hangs_it_is_turned_off_with_one_warning_and_elsewhere_left_on(
        tmp_path, jax_cache_settings, monkeypatch, caplog):
    xr.enable_compilation_cache(tmp_path)                   # one process: kept
    assert compilation.keep_cache_off_where_it_hangs() is False and jax.config.jax_enable_compilation_cache
    monkeypatch.setattr(compilation, "cache_hangs_here", lambda *args: True)     # as two processes of jaxlib 0.12.1
    with caplog.at_level("WARNING", logger="xla_runtime.compilation"):
        assert compilation.keep_cache_off_where_it_hangs() is True
        assert compilation.keep_cache_off_where_it_hangs() is True
    assert not jax.config.jax_enable_compilation_cache and xr.compilation_cache_dir() == str(tmp_path)
    [record] = caplog.records
    assert f"the persistent compilation cache ({tmp_path}) is off in this process" in record.message
    with xr.CompileWatch() as watch:                        # and nothing is written there
        jax.block_until_ready(jax.jit(lambda x: jnp.tan(x) * 3)(jnp.arange(3.0)))
    assert watch.programs >= 1 and watch.cache_writes == 0 and not any(tmp_path.iterdir())
