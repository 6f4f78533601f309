"""Where checkpoints can be written, checked before anything is: refused at once with what to do instead, never a
save that hangs or splits one checkpoint between two stores.

Orbax writes a checkpoint's arrays through tensorstore and everything else (its metadata, the commit file, our
manifest) through ``etils.epath``. Local paths take both. ``gs://`` takes both where:

- ``etils.epath`` has a GCS client: gcsfs (``pip install 'tpu-estimator-jax[gcs]'``) or TensorFlow's gfile;
- both clients can find credentials, which they look up in turn, each with no bound on the time it takes
  (tensorstore's lookup, off Google Cloud, was still waiting after 200 s): Google's default credentials
  (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's application default credentials, a Compute Engine metadata
  server; :func:`infeed.tfrecord.filesystems.google_credentials_source`), else tensorstore's
  ``GOOGLE_AUTH_TOKEN_FOR_TESTING``;
- with an emulator, both talk to it: gcsfs follows ``STORAGE_EMULATOR_HOST``, tensorstore does not, and reads
  ``TENSORSTORE_GCS_HTTP_URL`` instead (with ``GOOGLE_AUTH_TOKEN_FOR_TESTING``: the emulator takes any token).
  With only the first set, the arrays would go to Google's servers and the commit file to the emulator.

Other schemes are refused: orbax 0.11.38 to 0.12.8 make ``s3://b/k`` into ``s3:/b/k``, which tensorstore refuses as
not absolute (and s3fs cannot rename a directory, which orbax's commits need).
"""

from __future__ import annotations

import importlib.util
import os

from estimator.errors import InvalidArgumentError
from infeed.tfrecord.filesystems import google_credentials_source

__all__ = ["CHECKPOINT_SCHEMES", "check_checkpoint_storage"]

#: The URI schemes checkpoints can be written to (a path without a scheme is local).
CHECKPOINT_SCHEMES = ("gs", "file")

_EMULATOR_FOR_TENSORSTORE = ("TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING")


def check_checkpoint_storage(directory: str, what: str) -> None:
    """Raises InvalidArgumentError naming ``what`` (``RunConfig.model_dir``, ...) when checkpoints cannot be
    written to ``directory`` here, saying what to do instead; checked from the environment, without a request."""
    if "://" not in directory:
        return
    scheme = directory.split("://", 1)[0].lower()
    if scheme not in CHECKPOINT_SCHEMES:
        raise InvalidArgumentError(
            f"{what}: checkpoints cannot be written to {scheme}:// ({directory!r}): orbax-checkpoint writes its arrays "
            "to local paths and gs:// only (and s3fs cannot rename a directory, which its commits need). Use a local "
            "directory (a mounted bucket included) or gs://; with model_dir on a bucket, RunConfig(checkpoint_dir=...) "
            "puts the checkpoints elsewhere")
    if scheme != "gs":
        return
    if not any(importlib.util.find_spec(m) for m in ("gcsfs", "tensorflow")):
        raise InvalidArgumentError(f"{what}: gs:// checkpoints ({directory!r}) are written through etils.epath, which "
                                   "needs gcsfs (pip install 'tpu-estimator-jax[gcs]') or TensorFlow's gfile")
    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
    if emulator:
        missing = [name for name in _EMULATOR_FOR_TENSORSTORE if not os.environ.get(name)]
        if missing:
            url = emulator if "://" in emulator else f"http://{emulator}"
            raise InvalidArgumentError(
                f"{what}: STORAGE_EMULATOR_HOST={emulator} points gs:// at an emulator, but orbax writes a "
                f"checkpoint's arrays through tensorstore, which does not read it: set {' and '.join(missing)} too "
                f"(TENSORSTORE_GCS_HTTP_URL={url} GOOGLE_AUTH_TOKEN_FOR_TESTING=emulator), or the arrays of "
                f"{directory} would go to Google's servers and the rest to the emulator")
        return
    if google_credentials_source() is None and not os.environ.get("GOOGLE_AUTH_TOKEN_FOR_TESTING"):
        config = os.environ.get("CLOUDSDK_CONFIG") or "~/.config/gcloud"
        raise InvalidArgumentError(
            f"{what}: no Google credentials to write gs:// checkpoints ({directory!r}) with: "
            f"GOOGLE_APPLICATION_CREDENTIALS is unset, {config}/application_default_credentials.json does not exist, "
            "and this is no Compute Engine machine (GCE_METADATA_HOST unset), where gcsfs and tensorstore would wait "
            "on the metadata server with no bound. Set one of them (gcloud auth application-default login), or "
            "STORAGE_EMULATOR_HOST with TENSORSTORE_GCS_HTTP_URL and GOOGLE_AUTH_TOKEN_FOR_TESTING for an emulator")
