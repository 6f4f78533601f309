"""Datasets built by tensorflow-datasets, read by their own metadata (no TensorFlow, no TFDS): the build's
shards in order and their example counts (:mod:`infeed.tfds.build`), and the spec of its features
(:mod:`infeed.tfds.features`). ``infeed.Dataset.from_tfds(folder, split, ...)`` reads one.

>>> build = open_build("~/tensorflow_datasets/mnist")               # doctest: +SKIP
>>> build.split("train").examples                                   # doctest: +SKIP
60000
"""

from infeed.tfds.build import TfdsBuild, TfdsSplit, holds_build, open_build
from infeed.tfds.features import StoredFeature, stored_features, tfds_spec

__all__ = ["TfdsBuild", "TfdsSplit", "holds_build", "open_build", "StoredFeature", "stored_features", "tfds_spec",
           "build_spec"]


def build_spec(build: TfdsBuild, split: str, **kwargs) -> dict:
    """:func:`~infeed.tfds.features.tfds_spec` of ``build``'s features, its limits read from ``split``'s shards
    (``kwargs``: tfds_spec's), to edit before a Dataset takes it; ``Dataset.from_tfds`` makes the same."""
    return tfds_spec(stored_features(build.features), build.split(split).files, **kwargs)
