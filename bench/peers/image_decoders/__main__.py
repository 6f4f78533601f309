"""Choosing the JPEG decoder for the image stage (issue 16): libraries timed side by side on one core.

For each installed library among simplejpeg, PyTurboJPEG, Pillow, OpenCV
(opencv-python-headless), imagecodecs and TensorFlow (the reference), it times,
single-threaded, on one pinned CPU and interleaved across libraries (every case
once per round, A B C A B C ..., so a noisy neighbour slows all alike).  The
figure is images per CPU-second of the process (the median of the rounds): on a
CPU shared with other work, wall-clock time also counts the other processes'
time slices; the wall-clock rate and the CPU share are printed beside it.

- ``decode``: JPEG bytes to an RGB uint8 array at full size, with the library's
  default (accurate) DCT, plus its fast-DCT / decode-into-a-buffer variants;
- ``crop224``: the ResNet evaluation crop: the central 87.5% square of the
  shorter side, resized to 224x224, by each library's fastest reasonable path
  (DCT scaling in M/8 or 1/2**k steps so that the scaled crop stays >= 224,
  a lossless crop, a partial decode, then a bilinear/area resize);
- ``resize``: the resize alone (Pillow bilinear with antialias, cv2 INTER_AREA),
  from the full-size crop and from the 1/8-step DCT-scaled crop, to split the
  crop224 figures.

Test images are made from the two photos scikit-learn ships
(``sklearn.datasets.load_sample_images()``: china.jpg and flower.jpg, 427x640):
random crops of the target aspect, resized (Pillow bicubic), flipped, colour
jittered, with mild grain (``--noise``), encoded by Pillow at quality 90, 4:2:0,
baseline.  Sizes: 500x375 and 640x480 (ImageNet-like) and 1024x768.

It also checks what each library decodes to RGB (progressive, CMYK, grayscale
JPEGs; PNG where it has a PNG decoder), whether its decode call releases the GIL
(two threads on two CPUs against one), and prints a Markdown summary with
versions, wheel and installed sizes, last release month and the libjpeg-turbo
each one bundles.  Libraries that are not importable are skipped with a note.
Nothing from ``infeed`` is imported; ``bench.harness`` (standard library only)
does the interleaving.

examples (from the repository root, with an interpreter that has the libraries):
  python -m bench.peers.image_decoders
  python -m bench.peers.image_decoders --quick                     # ~2 minutes (the full run: ~8 on 2 busy cores)
  python -m bench.peers.image_decoders --wheels /tmp/wheels        # wheel sizes: files 'pip download --no-deps' left
  python -m bench.peers.image_decoders --turbojpeg-lib /path/libturbojpeg.so.0 --json out.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys

import numpy as np

from bench.harness import log, pinned_to_one_cpu, relative_spread, settle_allocator
from bench.peers.image_decoders.checks import capabilities, gil_check
from bench.peers.image_decoders.images import SIZES, feature_images, gil_probe_image, make_images
from bench.peers.image_decoders.libraries import MAKERS, OUT, Library, centre_crop, have
from bench.peers.image_decoders.packages import PYPI_LIST_VARIABLE, installed_bytes, mb, pypi_facts, wheel_file
from bench.peers.image_decoders.timing import build_cases, interleave_cpu, resize_cases


def rate_text(x: float) -> str:
    return f"{x:,.0f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers.image_decoders", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n\n")[-1:]))
    p.add_argument("--rounds", type=int, default=9, help="timed rounds over all cases (default 9)")
    p.add_argument("--target-s", type=float, default=0.2, help="seconds one case's run aims at (default 0.2)")
    p.add_argument("--per-size", type=int, default=16, help="test images per size (default 16)")
    p.add_argument("--noise", type=float, default=3.0, help="grain (Gaussian sigma, levels) added before encoding")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu", type=int, default=None, help="CPU to pin to (default: the last one allowed)")
    p.add_argument("--only", default=None, help="comma-separated libraries: " + ",".join(MAKERS))
    p.add_argument("--quick", action="store_true", help="3 rounds, 0.1 s runs, 8 images per size")
    p.add_argument("--wheels", default=None, help="folder with the wheels 'pip download --no-deps' fetched")
    p.add_argument("--pypi-list", default=os.environ.get(PYPI_LIST_VARIABLE) or None,
                   help="registry list (tab-separated: name, version, month, rank) for the summary's last release "
                        f"column (default ${PYPI_LIST_VARIABLE}; without one the column is '?')")
    p.add_argument("--turbojpeg-lib", default=None, help="libturbojpeg shared library for PyTurboJPEG")
    p.add_argument("--no-gil-check", action="store_true")
    p.add_argument("--json", default=None, help="save the figures there")
    args = p.parse_args(argv)
    if args.pypi_list and not os.path.isfile(args.pypi_list):
        p.error(f"--pypi-list (or ${PYPI_LIST_VARIABLE}): {args.pypi_list} is not a file")
    if not args.pypi_list:
        log(f"no registry list (--pypi-list or ${PYPI_LIST_VARIABLE}): the summary's last release column is '?'")
    if args.quick:
        args.rounds, args.target_s, args.per_size = 3, 0.1, 8

    notes = []
    libs: list[Library] = []
    wanted = args.only.split(",") if args.only else list(MAKERS)
    for key in wanted:
        try:
            libs.append(MAKERS[key](args))
        except ImportError as e:
            notes.append(f"{key}: skipped ({e})")
    for n in notes:
        log(n)
    if not have("PIL") or not have("sklearn"):
        log("Pillow and scikit-learn are needed to make the test images (pip install pillow scikit-learn)")
        return 2

    log("making test images ...")
    images = make_images(SIZES, args.per_size, args.seed, args.noise)
    from PIL import Image

    def ref_decode(d):
        return np.asarray(Image.open(io.BytesIO(d)).convert("RGB"))

    reference = {}
    for (w, h), imgs in images.items():
        full = [ref_decode(d) for d in imgs]
        crops = []
        for a in full:
            y0, x0, side = centre_crop(h, w)
            crops.append(np.asarray(Image.fromarray(a).resize((OUT, OUT), Image.BILINEAR,
                                                              box=(x0, y0, x0 + side, y0 + side))))
        reference[(w, h)] = {"decode": full, "crop224": crops}

    files = feature_images()
    caps = {lib.key: capabilities(lib, files) for lib in libs}
    gil = {}
    if not args.no_gil_check:
        probe = gil_probe_image()
        for lib in libs:
            gil[lib.key] = gil_check(lib.gil, probe) if lib.gil else "n/a"

    load0 = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    settle_allocator()
    with pinned_to_one_cpu(args.cpu) as cpu:
        log(f"pinned to CPU {cpu}; calibrating ...")
        cases, meta = build_cases(libs, images, args.target_s, reference)
        if have("PIL"):
            rc, rm = resize_cases(images, args.target_s, ref_decode)
            cases, meta = cases + rc, meta + rm
        log(f"{len(cases)} cases x {args.rounds} rounds (+1 warm-up), "
            f"~{len(cases) * (args.rounds + 1) * args.target_s:.0f} s")
        measured = interleave_cpu(cases, repeats=args.rounds, warmup=1)

    rows = []
    for case, (wall, cpu_s), info in zip(cases, measured, meta):
        rates = [case.records / s for s in cpu_s]
        rows.append(dict(info, rate=statistics.median(rates), rate_min=min(rates), rate_max=max(rates),
                         spread=relative_spread(cpu_s), wall_rate=case.records / statistics.median(wall),
                         cpu_share=sum(cpu_s) / sum(wall), cpu_s=cpu_s, wall_s=wall, records=case.records))

    # --- machine and images
    cpu_model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu_model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    except OSError:
        pass
    print("# JPEG decoders, single-threaded (python -m bench.peers.image_decoders)\n")
    print(f"machine: {cpu_model}, {os.cpu_count()} CPUs, pinned to CPU {cpu}; Python {platform.python_version()}, "
          f"numpy {np.__version__}; load average before {load0}; {args.rounds} rounds.\n\n"
          "img/s: images per CPU-second of this process (median of the rounds); spread: interquartile range "
          "of the rounds over their median; wall img/s: by the clock, which counts the time other processes "
          "had this CPU; CPU share: CPU time over wall time.\n")
    print("| size | images | mean KB | bits/pixel |\n|---|---|---|---|")
    for (w, h), imgs in images.items():
        kb = statistics.mean(map(len, imgs)) / 1e3
        print(f"| {w}x{h} | {len(imgs)} | {kb:.1f} | {kb * 8e3 / (w * h):.2f} |")
    print()
    for n in notes:
        print(f"- {n}")
    if notes:
        print()

    # --- detail
    print("| size | group | case | img/s | min-max | spread | wall img/s | CPU share | MAE |\n"
          "|---|---|---|---:|---:|---:|---:|---:|---:|")
    best = {}
    for r in rows:
        if r["group"] == "crop224" and r["headline"]:
            k = (r["library"], r["size"])
            if k not in best or r["rate"] > best[k]["rate"]:
                best[k] = r
    for r in rows:
        star = " *" if best.get((r["library"], r["size"])) is r else ""
        q = "" if r["mae"] is None else f"{r['mae']:.2f}"
        sp = "" if r["spread"] is None else f"{100 * r['spread']:.0f}%"
        print(f"| {r['size']} | {r['group']} | {r['name']}{star} | {rate_text(r['rate'])} | "
              f"{rate_text(r['rate_min'])}-{rate_text(r['rate_max'])} | {sp} | {rate_text(r['wall_rate'])} | "
              f"{100 * r['cpu_share']:.0f}% | {q} |")
    print("\n`*`: the library's fastest crop224 path at that size with its own resize, or Pillow's bilinear "
          "for a library that has none (the summary's figure). MAE: mean absolute "
          "difference, in levels of 255, from Pillow's accurate full decode (decode) or from that decode cropped "
          "and resized by Pillow's bilinear (crop224).\n")

    # --- summary
    facts = pypi_facts(args.pypi_list)
    sizes = [f"{w}x{h}" for (w, h) in images]
    head = (["library", "version", "wheel", "installed", "last release", "bundles"]
            + [f"decode {s}" for s in sizes] + [f"crop224 {s}" for s in sizes] + ["notes"])
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * 6 + "---:|" * (2 * len(sizes)) + "---|")
    summary = []
    for lib in libs:
        wf = wheel_file(args.wheels, lib.dist, lib.version)
        wsize = mb(os.path.getsize(wf)) + (" (sdist)" if wf and not wf.endswith(".whl") else "") if wf else "?"
        inst = mb(installed_bytes(lib.dist, lib.extra_files)) + (" with the system library" if lib.extra_files else "")
        latest, month, rank = facts.get(lib.dist.lower(), ("", "?", ""))
        rel = month + (f" ({latest})" if latest and latest != lib.version else "")
        dec = []
        for s in sizes:
            r = next((r for r in rows if r["library"] == lib.key and r["size"] == s and r["summary"]), None)
            dec.append(rate_text(r["rate"]) if r else "-")
        crop = [rate_text(best[(lib.key, s)]["rate"]) if (lib.key, s) in best else "-" for s in sizes]
        c = caps[lib.key]
        note = [f"crop decode: {lib.crop_decode}", f"into buffer: {lib.into_buffer}",
                f"progressive: {c['progressive']}", f"CMYK: {c['CMYK']}", f"gray: {c['gray']}",
                f"PNG: {c['PNG']}"]
        if lib.key in gil:
            note.append(f"GIL released: {gil[lib.key]}")
        if rank:
            note.append(f"PyPI download rank {rank} of 15000")
        note += lib.notes
        print("| " + " | ".join([lib.key, lib.version, wsize, inst, rel, lib.bundles] + dec + crop
                                + ["; ".join(note)]) + " |")
        summary.append(dict(library=lib.key, dist=lib.dist, version=lib.version, wheel=wsize, installed=inst,
                            release=rel, bundles=lib.bundles, decode=dict(zip(sizes, dec)),
                            crop224=dict(zip(sizes, crop)), notes=note))
    print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(argv=sys.argv, python=platform.python_version(), cpu=cpu_model, rows=rows,
                           summary=summary, notes=notes), f, indent=1, default=str)
        log(f"saved {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
