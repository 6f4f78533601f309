"""The libraries timed: a :class:`~bench.harness.timing.Case` per size and variant, calibrated to a run's target
seconds, and the rounds interleaved, each run's wall-clock and CPU time kept."""

from __future__ import annotations

import math
import statistics
import time

import numpy as np

from bench.harness import Case, heap_frozen
from bench.peers.image_decoders.checks import mae
from bench.peers.image_decoders.libraries import OUT, centre_crop, resizers, scale_eighths


def build_cases(libs, images, target_s: float, reference):
    """Case per (size, variant), passes calibrated so one run takes about target_s; quality per variant."""
    cases, meta = [], []
    for (w, h), imgs in images.items():
        for lib in libs:
            for v in lib.variants(w, h):
                run_once = v.batch(imgs) if v.batch else None
                if v.fn is not None:
                    want = (OUT, OUT, 3) if v.group == "crop224" else (h, w, 3)
                    errs = []
                    for d, ref in zip(imgs, reference[(w, h)][v.group]):   # warm, and checked
                        o = v.fn(d)
                        if np.shape(o) != want:
                            raise RuntimeError(f"{v.name} at {w}x{h} gave {np.shape(o)}, expected {want}")
                        errs.append(mae(o, ref))
                    q = statistics.mean(errs)
                else:
                    run_once()
                    q = None
                t0 = time.perf_counter()
                if v.fn is not None:
                    for d in imgs:
                        v.fn(d)
                else:
                    run_once()
                one = time.perf_counter() - t0
                passes = max(1, round(target_s / max(one, 1e-6)))

                if v.fn is not None:
                    def run(fn=v.fn, imgs=imgs, passes=passes):
                        for _ in range(passes):
                            for d in imgs:
                                fn(d)
                        return passes * len(imgs)
                else:
                    def run(run_once=run_once, passes=passes):
                        return sum(run_once() for _ in range(passes))
                cases.append(Case(f"{w}x{h} {v.group} {v.name}", run, passes * len(imgs),
                                  passes * sum(map(len, imgs))))
                meta.append(dict(size=f"{w}x{h}", group=v.group, name=v.name, library=lib.key, mae=q,
                                 summary=v.summary, headline=v.group == "crop224" and (
                                     "cv2 area" not in v.name or lib.key == "OpenCV")))
    return cases, meta


def resize_cases(images, target_s: float, ref_decode):
    """The resize alone, from the full-size and the M/8-scaled centre crop (decoded by Pillow beforehand)."""
    from PIL import Image

    cases, meta = [], []
    for (w, h), imgs in images.items():
        full = [ref_decode(d) for d in imgs]
        m = scale_eighths(h, w, pow2=False)
        scaled = [np.asarray(Image.fromarray(a).resize((math.ceil(w * m / 8), math.ceil(h * m / 8)),
                                                        Image.BILINEAR)) for a in full]
        for src_name, arrs in ((f"from {w}x{h}", full), (f"from {m}/8 scale", scaled)):
            for rname, resize in resizers().items():
                geo = [centre_crop(*a.shape[:2]) for a in arrs]
                t0 = time.perf_counter()
                for a, g in zip(arrs, geo):
                    resize(a, *g)
                passes = max(1, round(target_s / max(time.perf_counter() - t0, 1e-6)))

                def run(resize=resize, arrs=arrs, geo=geo, passes=passes):
                    for _ in range(passes):
                        for a, g in zip(arrs, geo):
                            resize(a, *g)
                    return passes * len(arrs)
                name = f"{rname} {src_name}"
                cases.append(Case(f"{w}x{h} resize {name}", run, passes * len(arrs), 0))
                meta.append(dict(size=f"{w}x{h}", group="resize", name=name, library=rname.split()[0], mae=None,
                                 summary=False, headline=False))
    return cases, meta


def interleave_cpu(cases, repeats: int, warmup: int = 1):
    """Like bench.harness.interleave (warm-up pass, then A B C A B C ...), timing each run twice: wall clock and
    this process's CPU time (all its threads).  On one pinned CPU shared with other work, the CPU time is
    the work itself, whatever share of the CPU the scheduler gave this process meanwhile."""
    import gc

    out = [([], []) for _ in cases]
    with heap_frozen():
        for rep in range(warmup + repeats):
            for case, (wall, cpu) in zip(cases, out):
                gc.collect()
                gc.disable()
                try:
                    w0, c0 = time.perf_counter(), time.process_time()
                    done = case.run()
                    c1, w1 = time.process_time(), time.perf_counter()
                finally:
                    gc.enable()
                if done != case.records:
                    raise RuntimeError(f"case {case.name!r} handled {done} images, expected {case.records}")
                if rep >= warmup:
                    wall.append(w1 - w0)
                    cpu.append(c1 - c0)
    return out
