"""Device meshes and the shardings of state and batches over them.

>>> mesh = make_mesh({"data": -1})                  # every device on one data-parallel axis
>>> replicated(mesh).spec == P()
True

Meshes are made with ``AxisType.Auto`` axes: a step function is ordinary JAX
code, and XLA's sharding propagation decides the layout of everything between
the shardings given for inputs and state. There is no ``pmap``: a jitted
program over a mesh is one SPMD program on every device (and every host).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

__all__ = ["make_mesh", "replicated", "named", "state_shardings", "check_divisible"]


def make_mesh(shape: Mapping[str, int], devices: Sequence | None = None) -> Mesh:
    """A mesh with named axes of the given sizes over ``devices`` (default: every device of every process).

    One size may be -1: all the devices the other axes leave. The sizes must
    multiply to the number of devices.
    """
    if not isinstance(shape, Mapping) or not shape:
        raise ValueError(f"a mesh shape is a dict of axis name -> size, got {shape!r}")
    devices = list(jax.devices() if devices is None else devices)
    names, sizes = list(shape), list(shape.values())
    if any(not isinstance(s, int) or (s < 1 and s != -1) for s in sizes) or sizes.count(-1) > 1:
        raise ValueError(f"mesh axis sizes are positive ints, with at most one -1; got {dict(shape)}")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"{len(devices)} devices do not divide into the axes {dict(shape)}")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(f"a mesh of {dict(zip(names, sizes))} needs {math.prod(sizes)} devices; "
                         f"there are {len(devices)}")
    return jax.make_mesh(tuple(sizes), tuple(names), axis_types=(AxisType.Auto,) * len(names), devices=devices)


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array."""
    return NamedSharding(mesh, P())


def named(mesh: Mesh, spec) -> NamedSharding:
    """``spec`` (a PartitionSpec, or a NamedSharding already) as a NamedSharding over ``mesh``."""
    if isinstance(spec, NamedSharding):
        return spec
    if spec is None:
        return replicated(mesh)
    if not isinstance(spec, P):
        raise ValueError(f"expected a PartitionSpec or NamedSharding, got {spec!r}")
    return NamedSharding(mesh, spec)


def _is_spec(x) -> bool:
    return x is None or isinstance(x, (P, NamedSharding))


def state_shardings(state, mesh: Mesh, spec):
    """NamedShardings for every leaf of ``state``.

    ``spec``: None (replicated), one PartitionSpec / NamedSharding for every
    leaf, a rule list ``[(regex, PartitionSpec), ...]`` matched against each
    leaf's path (``jax.tree_util.keystr``, e.g. ``"['params']['dense']['kernel']"``;
    the first rule that ``re.search``-es wins, no match is replicated), or a
    pytree of PartitionSpecs shaped like ``state`` (or a prefix of it).
    """
    if _is_spec(spec):
        sharding = named(mesh, spec)
        return jax.tree.map(lambda _: sharding, state)
    if isinstance(spec, list) and all(isinstance(r, tuple) and len(r) == 2 for r in spec):
        rules = [(re.compile(pattern), named(mesh, s)) for pattern, s in spec]

        def pick(path, _):
            name = jax.tree_util.keystr(path)
            return next((s for pattern, s in rules if pattern.search(name)), replicated(mesh))
        return jax.tree_util.tree_map_with_path(pick, state)
    try:
        return jax.tree.map(lambda s, leaf: jax.tree.map(lambda _: named(mesh, s), leaf), spec, state,
                            is_leaf=_is_spec)
    except ValueError as e:
        raise ValueError(f"state_sharding does not match the state's structure: {e}") from None


def check_divisible(name: str, shape: tuple, sharding: NamedSharding) -> None:
    """A clear ValueError when a dimension of ``shape`` does not split evenly over its mesh axes."""
    for dim, axes in enumerate(sharding.spec):
        if axes is None:
            continue
        axes = axes if isinstance(axes, tuple) else (axes,)
        size = math.prod(sharding.mesh.shape[a] for a in axes)
        if dim >= len(shape):
            raise ValueError(f"{name} has shape {tuple(shape)}: it has no dimension {dim} to split over "
                             f"mesh axis {'x'.join(axes)!r}")
        if shape[dim] % size:
            raise ValueError(f"{name} has shape {tuple(shape)}: dimension {dim} ({shape[dim]}) does not divide "
                             f"by mesh axis {'x'.join(axes)!r} of size {size}")
