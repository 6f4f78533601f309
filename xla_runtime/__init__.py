"""xla_runtime: compiled multi-step XLA loops over a device mesh (see docs/architecture.md).

>>> import xla_runtime as xr
>>> mesh = xr.make_mesh({"data": -1})
>>> loop = xr.compile_loop(lambda state, batch: (state + batch.sum(), batch.mean()), iterations=10, mesh=mesh)
"""

from jax.sharding import PartitionSpec as P

from xla_runtime.collectives import cross_replica_mean
from xla_runtime.compilation import CompileWatch, compilation_cache_dir, enable_compilation_cache
from xla_runtime.context import current_step
from xla_runtime.feeder import Feeder, FeederStats
from xla_runtime.host_calls import HostCallError, every_n, host_call, raise_host_call_error, wait_for_host_calls
from xla_runtime.loop import CompiledLoop, compile_loop
from xla_runtime.mesh import make_mesh, replicated, state_shardings

__all__ = ["CompileWatch", "CompiledLoop", "Feeder", "FeederStats", "HostCallError", "P", "compilation_cache_dir",
           "compile_loop", "cross_replica_mean", "current_step", "enable_compilation_cache", "every_n", "host_call",
           "make_mesh", "raise_host_call_error", "replicated", "state_shardings", "wait_for_host_calls"]
