"""What an export directory is called and holds, for the writer and the reader alike: the format's name and
version, the variables' file, the rule for a program's name, and local paths only.

(``signature.json`` and the digests of the other files: :mod:`estimator.export.integrity`.)
"""

from __future__ import annotations

import os
import re

from estimator.errors import InvalidArgumentError

__all__ = ["FORMAT", "FORMAT_VERSION", "VARIABLES", "NAME", "NAME_RULE", "local_path"]

FORMAT = "estimator.export"
FORMAT_VERSION = 1
VARIABLES = "variables.npz"

NAME = re.compile(r"\w[\w.-]{0,99}")      # a plain file name: no path, not hidden, not "." or ".."
NAME_RULE = "a plain file name (a letter, digit or _, then at most 99 of those, '.' or '-')"


def local_path(directory, what: str):
    """``directory``, refused with InvalidArgumentError when it is a URI: an export is written, renamed
    into place and checked file by file with the operating system's calls, which a bucket does not take."""
    if isinstance(directory, (str, os.PathLike)) and "://" in os.fsdecode(os.fspath(directory)):
        raise InvalidArgumentError(f"{what}: export directories are local paths, got {directory!r}: export to a "
                                   "local directory, then copy it to the bucket (gcloud storage cp -r, aws s3 cp "
                                   "--recursive), and load it from a local copy")
    return directory            # anything else as it came: the callers' own checks name a wrong type
