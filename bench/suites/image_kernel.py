"""The image kernel alone on one cache-warm 500x375 picture: its centre crop (328x328) to 224x224 uint8.

    python -m bench.suites.image_kernel                 # best microseconds per crop over 7 rounds of 300
    python -m bench.suites.image_kernel --calls 11      # just N crops, for instruction counts:
    valgrind --tool=callgrind python -m bench.suites.image_kernel --calls 11   # and --calls 21: the difference / 10
    callgrind_annotate --inclusive=yes callgrind.out.PID | grep -F 'resize_into ['   # its count

``python -m bench images`` times the kernel over 512 different decoded pictures (its "resize kernel" row),
which no longer fit the caches; here the picture stays in them, as it does right after its decode.
"""

import argparse
import time

import numpy as np

from infeed.example import _image

WINDOW = (23.5, 86.0, 328.0, 328.0)            # the central 87.5 % square of 375x500, as infeed.Image takes it


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, help="make this many crops and stop (no timing)")
    args = p.parse_args(argv)
    image = np.random.default_rng(0).integers(0, 256, (375, 500, 3), dtype=np.uint8)
    out = np.zeros((224, 224, 3), np.uint8)
    if args.calls is not None:
        for _ in range(args.calls):
            _image.resize_into(image, *WINDOW, out, 0, 0, 224, 224)
        return
    best = float("inf")
    for _ in range(7):
        began = time.perf_counter()
        for _ in range(300):
            _image.resize_into(image, *WINDOW, out, 0, 0, 224, 224)
        best = min(best, (time.perf_counter() - began) / 300)
    print(f"resize_into, 375x500 centre crop -> 224x224 uint8: {best * 1e6:.0f} us per crop (best of 7 x 300)")


if __name__ == "__main__":
    main()
