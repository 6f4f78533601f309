"""The libraries as packages: installed and wheel sizes, and the last release's month from a registry list
(``--pypi-list`` or ``$BENCH_PYPI_LIST``, where one is at hand: the summary's "last release" column is "?" without)."""

from __future__ import annotations

import glob
import os
import re

#: The environment variable that names a registry list when ``--pypi-list`` does not: a tab-separated file, a
#: package a line (name, latest version, month of that release, download rank).
PYPI_LIST_VARIABLE = "BENCH_PYPI_LIST"


def installed_bytes(dist: str, extra_files=()) -> int | None:
    from importlib import metadata

    try:
        d = metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return None
    total = 0
    for f in d.files or ():
        p = d.locate_file(f)
        try:
            total += os.path.getsize(p)
        except OSError:
            pass
    for p in extra_files:
        try:
            total += os.path.getsize(p)
        except OSError:
            pass
    return total


def wheel_file(wheels: str | None, dist: str, version: str) -> str | None:
    if not wheels:
        return None
    norm = re.sub(r"[-_.]+", "_", dist).lower()
    for p in sorted(glob.glob(os.path.join(wheels, "*"))):
        base = os.path.basename(p)
        name = re.sub(r"[-_.]+", "_", base).lower()
        if name.startswith(f"{norm}_{re.sub(r'[-_.]+', '_', version).lower()}_") or \
                name.startswith(f"{norm}_{re.sub(r'[-_.]+', '_', version).lower()}.") or \
                base.lower().startswith(f"{norm}-{version}".lower()):
            return p
    return None


def pypi_facts(path: str | None) -> dict[str, tuple[str, str, str]]:
    """name -> (latest version, month of that release, download rank) from the registry list at ``path``; empty
    for none (``path`` None or empty)."""
    out = {}
    if not path:
        return out
    wanted = {re.sub(r"[-_.]+", "-", k.lower()) for k in ("simplejpeg", "pyturbojpeg", "pillow",
                                                          "opencv-python-headless", "imagecodecs", "tensorflow")}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 3 and parts[0].lower() in wanted:
                out[parts[0].lower()] = (parts[1], parts[2], parts[3] if len(parts) > 3 else "")
    return out


def mb(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} kB"
