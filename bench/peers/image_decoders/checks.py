"""What each library decodes to RGB (progressive, CMYK, grayscale JPEGs; PNG where it has a PNG decoder), how far
from the reference (:func:`mae`), and whether its decode call lets other Python threads run (:func:`gil_check`)."""

from __future__ import annotations

import threading
import time

import numpy as np

from bench.peers.image_decoders.libraries import Library


def mae(a, b) -> float:
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    if a.shape != b.shape:
        return float("nan")
    return float(np.abs(np.round(a) - b).mean())


def capabilities(lib: Library, files) -> dict[str, str]:
    """progressive / CMYK / gray -> RGB and PNG: 'ok', 'ok (MAE x)', 'wrong colours (MAE x)', 'error', 'n/a'."""
    out = {}
    for name, (data, want, kind) in files.items():
        fn = lib.png if kind == "png" else lib.rgb
        if fn is None:
            out[name] = "n/a"
            continue
        try:
            got = np.asarray(fn(data))
        except Exception as e:
            out[name] = f"error ({type(e).__name__})"
            continue
        if got.shape != want.shape:
            out[name] = f"shape {got.shape}"
            continue
        err = mae(got, want)
        out[name] = "ok" if err < 3 else f"ok (MAE {err:.1f})" if err < 12 else f"wrong colours (MAE {err:.0f})"
    return out


def gil_check(fn, data: bytes, trials: int = 3) -> str:
    """Whether ``fn(data)`` lets another Python thread run while it decodes.

    A second thread makes one call; this thread meanwhile stamps the time in a loop.  A call that holds the GIL
    leaves no stamps inside it; one that releases it leaves them all through it.  The figure is the share of the
    call's middle 80% that this thread covered (gaps under 1 ms), the best of ``trials``: it needs no second
    free CPU, so a busy machine does not fake a 'no'.
    """
    fn(data)
    best = 0.0
    for _ in range(trials):
        span = {}

        def work():
            span["t0"] = time.perf_counter()
            fn(data)
            span["t1"] = time.perf_counter()
        stamps = []
        t = threading.Thread(target=work)
        t.start()
        while t.is_alive():
            stamps.append(time.perf_counter())
        t.join()
        t0, t1 = span["t0"], span["t1"]
        lo, hi = t0 + 0.1 * (t1 - t0), t1 - 0.1 * (t1 - t0)
        inside = [x for x in stamps if lo <= x <= hi]
        covered = sum(b - a for a, b in zip(inside, inside[1:]) if b - a < 1e-3)
        best = max(best, covered / (hi - lo))
    # A call that holds the GIL leaves 0%; one that releases it leaves as much as the OS gives this thread
    # (on a busy machine well under 100%).
    return f"{'yes' if best > 0.05 else 'no'} (other thread ran {100 * best:.0f}% of a call)"
