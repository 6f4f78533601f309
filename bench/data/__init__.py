"""The data the suites read, written deterministically from a seed: the tf.train.Example layouts
(:mod:`~bench.data.datasets`) and the JPEG photos (:mod:`~bench.data.photos`)."""
