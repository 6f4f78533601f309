"""Explicit collectives, for steps that run their body per shard under ``jax.shard_map``.

Most steps need none: under ``jit`` over a mesh, XLA inserts the all-reduce
that a mean over a sharded batch implies (what TPUEstimator's
CrossShardOptimizer did by hand). A step written per shard, with
``jax.shard_map(body, mesh=mesh, in_specs=..., out_specs=..., check_vma=False)``,
reduces its gradients itself::

    grads = cross_replica_mean(jax.grad(loss)(params, local_batch))

With ``check_vma=True`` (shard_map's default) JAX tracks which values vary
across the axis, and the gradient of a replicated parameter comes back
already summed over it: divide by the axis size instead of averaging again.
Per-shard values (a local loss, a metric) are averaged with this helper either way.
"""

from __future__ import annotations

import jax

__all__ = ["cross_replica_mean"]


def cross_replica_mean(tree, axis_name: str = "data"):
    """Every leaf of ``tree`` averaged over the devices of mesh axis ``axis_name`` (inside ``shard_map``)."""
    return jax.tree.map(lambda x: jax.lax.pmean(x, axis_name), tree)
