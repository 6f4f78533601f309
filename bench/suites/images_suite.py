"""The ``images`` suite: JPEGs decoded, cropped and resized to 224x224 into the ring, against tf.data.

Per source size (ImageNet-sized 500x375 photos, and 1024x768 ones; real
photos: crops of the two that scikit-learn ships, mirrored and tinted per
record, mosaics of four crops at 1024x768; JPEG quality 90, 4:2:0), it times,
interleaved (A B C A B C ...), nothing pinned:

- ``bare decoder``: ``simplejpeg.decode_jpeg(data, fastdct=True)`` of every
  record's image at its full size, in this process, no resize: the limit.
- ``parse, <mode> (1 process)``: ``read_batch`` and ``ExampleParser.parse`` of
  a spec with ``infeed.Image(size=(224, 224), resize=<mode>)`` into one
  preallocated batch, in this process; ``parse, <mode>, whole JPEG
  (simplejpeg)``: the same through simplejpeg's decode of the whole photo (the
  build without libjpeg-turbo's headers, and every build before the
  crop-window decoder), where the build has the window decoder.
- ``daemon W=w, <mode>``: ``infeed.Daemon`` with w workers, a consumer that
  only takes batches; the steady state's rate as in ``bench infeed`` (from
  batch W, once every worker has started, to the end, at least
  :data:`~bench.harness.STEADY_BATCHES_PER_WORKER` (8) batches per worker:
  the photos are as many as the largest W needs, times ``--scale``; a W
  whose file is too short for it, a small ``--scale``, is refused, the
  reason printed in place of its figures and ratios). The ring has 8 slots
  (at least W: one a worker from W=8 on); ``slots`` adds
  rows ``daemon W=w, S slots, <mode>`` of other ring sizes.
- ``daemon W=2, worker 0 sharing its CPU, random resized crop``, where W=2 is
  asked and two CPUs are allowed: worker 0 pinned to a CPU where another
  process spins (:func:`busy_cpu`), worker 1 alone on a second one. Batches go
  to whichever worker is free, so worker 1 makes more of them and worker 0
  adds what its half of a CPU gives: about 1.5x W=1 (dealt in turn, as before
  issue 30, both went at worker 0's pace: about 1.0-1.2x).
- ``parse (W processes at once), <mode>``, for each W > 1: W processes, started
  before timing and sharing nothing, each parsing its share of the batches
  (every W-th, as a worker does) at the same time (:mod:`bench.peers.parallel_parse`):
  what this machine's CPUs give W decoders, the bound for W workers.
- ``tf.data <mode>, T thread(s)``: ``TFRecordDataset -> map(parse, decode,
  crop, resize, num_parallel_calls=T) -> batch`` with a private thread pool
  of T threads and no intra-op parallelism: the same thread budget as T
  workers. The centre crop is TensorFlow's official ResNet one
  (``decode_and_crop_jpeg`` of the central 87.5 % square, then bilinear
  ``resize``); the random resized crop is ``sample_distorted_bounding_box``
  (area 0.08-1, aspect 3/4-4/3, 10 attempts) + ``decode_and_crop_jpeg`` +
  ``resize`` + ``random_flip_left_right``. ``tf.data decode_jpeg + resize,
  centre crop`` decodes the whole image first (the other way TensorFlow
  users write it).

With two or more W, a scaling table per source, crop and ring size
(:meth:`~bench.harness.SuiteResult.add_scaling`): records/s, speed-up over W=1,
efficiency and stage shares at each W, what W processes parsing alone gain over
one and the daemon's share of that, a W above the CPUs marked oversubscribed.

Where the time goes is measured in the same interleaved runs, per image, in
this process: the JPEG decode (of the crop's window) at the DCT scale the centre crop uses, the resize
kernel alone, and (by difference) the rest of ``parse`` (the Example, the
image's header, Python).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence

import numpy as np

import infeed
from bench.data.photos import MODES, PHOTO_SETS, SIZE, SOURCES, ensure_photos, images_of, spec, write_photos
from bench.harness import (STEADY_BATCHES_PER_WORKER, Case, Refused, SuiteResult, daemon_batches,
                           interleave, log, settle_allocator, stage_breakdown, steady_refusal)
from bench.peers.parallel_parse import ParallelParse
from bench.suites import decode_suite
from bench.suites.daemon_runs import WARMUP, DaemonCase, steady_figure
from infeed.example import image as image_module
from infeed.example.image import _central_window

__all__ = ["run", "SOURCES", "MODES", "TARGETS", "BARE", "SIZE", "BATCH_SIZE", "SLOTS", "parse_name", "whole_name",
           "daemon_name", "parallel_name", "scaling_label", "shared_cpu_name", "SHARED_MODE", "tf_name", "spec",
           "write_photos", "ensure_photos", "images_of", "busy_cpu"]

SUITE = "images"
BATCH_SIZE = 16
#: The daemon rows' ring size unless ``slots`` asks for others too (raised to W by the Daemon where fewer).
SLOTS = 8
BARE = "bare decoder"
DECODE_PART = "centre crop's part: JPEG decode of its window at its DCT scale"
RESIZE_PART = "centre crop's part: resize kernel (crop, resize, cast)"
TF_FULL = "tf.data decode_jpeg + resize, centre crop, 1 thread"


def parse_name(mode: str) -> str:
    return f"parse, {mode} (1 process)"


def whole_name(mode: str) -> str:
    """The row of ``parse`` through simplejpeg's whole-image decode."""
    return f"parse, {mode}, whole JPEG (simplejpeg)"


def daemon_name(workers: int, mode: str, slots: int = SLOTS) -> str:
    """A daemon row's name; ``slots`` other than the default ring's 8 are named in it."""
    return f"daemon W={workers}, {mode}" if slots == SLOTS else f"daemon W={workers}, {slots} slots, {mode}"


def parallel_name(processes: int, mode: str) -> str:
    return f"parse ({processes} processes at once), {mode}"


def shared_cpu_name(mode: str) -> str:
    """The row of two workers, one of them on a CPU that a busy process shares."""
    return f"daemon W=2, worker 0 sharing its CPU, {mode}"


#: The crop mode of the shared-CPU row.
SHARED_MODE = "random resized crop"


def scaling_label(mode: str, slots: int = SLOTS) -> str:
    """The name of a mode's scaling table (one per ring size)."""
    return mode if slots == SLOTS else f"{mode}, {slots} slots"


def tf_name(mode: str, threads: int) -> str:
    return f"tf.data {mode}, {threads} thread{'s' if threads > 1 else ''}"


#: (numerator, denominator) -> {source: minimum ratio of the medians}: per core, into the ring. Centre crops are
#: judged, as the issues set them, against tf.data's decode + centre crop + resize (TF_FULL: "tf.data does ~270" at
#: 1024x768); TF's fused decode_and_crop_jpeg centre crop (the official ResNet evaluation pipeline, faster on large
#: photos: libjpeg-turbo skips the IDCT and colour conversion outside the window) is to be beaten too (issue 39:
#: "faster than TensorFlow's decode_and_crop_jpeg on every photo size"). Random resized crops are judged against
#: decode_and_crop_jpeg of sample_distorted_bounding_box's window. Issue 39 decodes only the crop's window, and
#: asks that the whole path beat decoding the whole photo and nothing else (BARE).
TARGETS = {
    (daemon_name(1, "centre crop"), TF_FULL): {"500x375": 1.7, "1024x768": 1.7},
    (daemon_name(1, "centre crop"), tf_name("centre crop", 1)): {"500x375": 1.0, "1024x768": 1.0},
    (daemon_name(1, "random resized crop"), tf_name("random resized crop", 1)): {"500x375": 1.6, "1024x768": 1.3},
    (daemon_name(1, "centre crop"), BARE): {"500x375": 1.0, "1024x768": 1.0},
    (daemon_name(1, "random resized crop"), BARE): {"500x375": 1.0, "1024x768": 1.0},
    # A second worker where decoding is the work (a consumer that only takes batches; issue 19's target).
    (daemon_name(2, "centre crop"), daemon_name(1, "centre crop")): {"500x375": 1.7, "1024x768": 1.7},
    # Two workers, one sharing its CPU with a busy process: the free one takes the batches the other cannot make
    # (issue 30; dealt in turn, both went at the slower one's pace, 1.0-1.2x).
    (shared_cpu_name(SHARED_MODE), daemon_name(1, SHARED_MODE)): {"500x375": 1.3, "1024x768": 1.3},
}


# ---------------------------------------------------------------------------
# Cases


def _bare_case(images: list[bytes], nbytes: int) -> Case:
    import simplejpeg

    def run():
        for data in images:
            simplejpeg.decode_jpeg(data, fastdct=True)
        return len(images)
    return Case(BARE, run, len(images), nbytes)


def _parse_case(path: str, mode: str, records: int, nbytes: int, whole: bool = False) -> Case:
    parser = infeed.ExampleParser(spec(mode))
    if whole:                                  # every image decoder of the parser through simplejpeg
        for _, decoder, _ in parser._images:
            decoder._window = None
    out = parser.allocate(BATCH_SIZE)

    def run():
        done = 0
        with infeed.read_records(path) as reader:
            while batch := reader.read_batch(BATCH_SIZE):
                parser.parse(batch, out=out)
                done += len(batch)
        return done
    return Case(whole_name(mode) if whole else parse_name(mode), run, records, nbytes)


@contextlib.contextmanager
def busy_cpu(cpu: int):
    """A process spinning on ``cpu`` (pinned to it) while the block runs: a CPU half taken by other work."""
    proc = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _shared_cpu_case(dataset: infeed.Dataset, cpus: Sequence[int]) -> DaemonCase:
    """Two workers, worker 0 pinned to ``cpus[0]`` beside a busy process, worker 1 alone on ``cpus[1]``."""
    def pin(daemon) -> None:
        for pid, cpu in zip(daemon.worker_pids, cpus):
            os.sched_setaffinity(pid, {cpu})

    case = DaemonCase(shared_cpu_name(SHARED_MODE), dataset, 2, started=pin)
    run = case.run

    def shared() -> int:
        with busy_cpu(cpus[0]):
            return run()
    case.run = shared
    return case


def _tf_pipeline(tf, path: str, mode: str, threads: int, decode_first: bool = False):
    features = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
                "image/class/label": tf.io.FixedLenFeature([], tf.int64)}

    def centre(data):
        shape = tf.io.extract_jpeg_shape(data)
        height, width = shape[0], shape[1]
        crop = tf.cast(0.875 * tf.cast(tf.minimum(height, width), tf.float32), tf.int32)
        y, x = (height - crop + 1) // 2, (width - crop + 1) // 2
        if decode_first:
            image = tf.io.decode_jpeg(data, channels=3, dct_method="INTEGER_FAST")[y:y + crop, x:x + crop]
        else:
            image = tf.image.decode_and_crop_jpeg(data, tf.stack([y, x, crop, crop]), channels=3,
                                                  dct_method="INTEGER_FAST")
        return tf.image.resize(image, (SIZE, SIZE))

    def random(data):
        shape = tf.io.extract_jpeg_shape(data)
        box = tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4])
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            shape, box, min_object_covered=0.0, aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0),
            max_attempts=10, use_image_if_no_bounding_boxes=True)
        y, x, _ = tf.unstack(begin)
        h, w, _ = tf.unstack(size)
        image = tf.image.decode_and_crop_jpeg(data, tf.stack([y, x, h, w]), channels=3, dct_method="INTEGER_FAST")
        return tf.image.random_flip_left_right(tf.image.resize(image, (SIZE, SIZE)))

    crop = centre if MODES[mode] == "center_crop" else random

    def parse(record):
        example = tf.io.parse_single_example(record, features)
        return crop(example["image/encoded"]), example["image/class/label"]

    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    options.threading.max_intra_op_parallelism = 1
    return (tf.data.TFRecordDataset([path]).map(parse, num_parallel_calls=threads).batch(BATCH_SIZE)
            .with_options(options))


def _tf_case(tf, name: str, pipeline, records: int, nbytes: int) -> Case:
    def run():
        return sum(int(images.shape[0]) for images, _ in pipeline)
    return Case(name, run, records, nbytes)


def _check_agreement(tf, path: str) -> tuple[float, float, float]:
    """Mean absolute differences (uint8 levels) of the first batch's centre crops: infeed's against tf.data's
    pipeline, against the whole image decoded and resized with ``antialias=True`` (the reference where infeed
    decodes at a DCT scale: tf.data's bilinear resize then aliases and infeed's does not), and infeed's with
    ``dct_scaling=False`` against tf.data's pipeline, which must be TensorFlow's pixels whatever the photos."""
    with infeed.read_records(path) as reader:
        records = reader.read_batch(BATCH_SIZE)
    centre = spec("centre crop")
    ours = infeed.ExampleParser(centre).parse(records)["image"].astype(np.float32)
    whole = {**centre, "image": dataclasses.replace(centre["image"], dct_scaling=False)}
    exact = infeed.ExampleParser(whole).parse(records)["image"].astype(np.float32)
    theirs, _ = next(iter(_tf_pipeline(tf, path, "centre crop", 1)))
    theirs = np.clip(np.floor(theirs.numpy() + 0.5), 0, 255)
    pipeline, unscaled = float(np.abs(ours - theirs).mean()), float(np.abs(exact - theirs).mean())
    reference = []
    for data in images_of(records):
        image = tf.io.decode_jpeg(data, channels=3, dct_method="INTEGER_FAST").numpy()
        y, x, h, w = _central_window(image.shape[0], image.shape[1], 1.0, 0.875)
        reference.append(tf.image.resize(image[None, y:y + h, x:x + w], (SIZE, SIZE), antialias=True)[0].numpy())
    antialiased = float(np.abs(ours - np.clip(np.floor(np.stack(reference) + 0.5), 0, 255)).mean())
    if unscaled > 0.5:
        raise RuntimeError(f"infeed's centre crop without a DCT scale differs from tf.data's by {unscaled:.2f} "
                           f"levels on average")
    return pipeline, antialiased, unscaled


def _part_cases(images: list[bytes], nbytes: int) -> list[Case]:
    """The centre crop's parts alone, per image: its JPEG decode (the header, then the window at its DCT scale
    into a 1x1 row: the crop-window decoder's, where the build has it, else simplejpeg's of the whole image), and
    its resize kernel."""
    from infeed.example import _image
    from infeed.example.image import ImageDecoder

    decoder = ImageDecoder(infeed.Image(size=(SIZE, SIZE)), seed=0, stream=0)
    whole = ImageDecoder(infeed.Image(size=(SIZE, SIZE)), seed=0, stream=0)
    whole._window = None                               # simplejpeg's path: the pixels the kernel alone resizes
    out, dot = np.zeros((SIZE, SIZE, 3), np.uint8), np.zeros((1, 1, 3), np.uint8)
    scale, bias = decoder._affine[8]
    plans = []
    for data in images:
        height, width = whole._jpeg_size(data)
        y, x, h, w = _central_window(height, width, 1.0, 0.875)
        pixels = whole._jpeg_pixels(data, height, width, h / SIZE, w / SIZE).copy()
        s = pixels.shape[0] / height
        plans.append((data, (y, x, h, w), decoder._dct_divisor(h / SIZE, w / SIZE), pixels,
                      (y * s, x * s, h * s, w * s)))

    def decode_part():
        for data, (y, x, h, w), divisor, _, _ in plans:
            if decoder._window is None:
                decoder._jpeg_pixels(data, *decoder._jpeg_size(data), h / SIZE, w / SIZE)
                continue
            height, width = decoder._jpeg_size(data)
            decoder._window.decode_into(data, height, width, divisor, y, x, h, w, dot, 0, 0, 1, 1, 0, False, False,
                                        True, scale, bias)
        return len(plans)

    def resize_part():
        for _, _, _, pixels, window in plans:
            _image.resize_into(pixels, *window, out, 0, 0, SIZE, SIZE)
        return len(plans)
    return [Case(DECODE_PART, decode_part, len(plans), nbytes), Case(RESIZE_PART, resize_part, len(plans), nbytes)]


# ---------------------------------------------------------------------------
# The suite


def run(sources: Sequence[str] = tuple(SOURCES), *, workers: Sequence[int] = (1, 2), slots: Sequence[int] = (SLOTS,),
        quick: bool = False, repeats: int | None = None, scale: float = 1.0, data_dir=None, seed: int = 0,
        tensorflow: bool = True, photo_set: str = "sample") -> SuiteResult:
    """Measures every source size; returns the figures, the ratios against TARGETS, timings and notes.

    slots: the daemons' ring sizes (:data:`SLOTS` always among them), each a row per W and crop mode.
    """
    repeats = repeats if repeats is not None else (3 if quick else 7)
    unknown = sorted(set(sources) - set(SOURCES))
    if unknown:
        raise ValueError(f"unknown sources {unknown}; known: {', '.join(SOURCES)}")
    slots = sorted({SLOTS, *slots})
    result = SuiteResult(SUITE, group_label="source", name_label="pipeline",
                         params={"sources": list(sources), "repeats": repeats, "warmup": WARMUP,
                                 "batch_size": BATCH_SIZE, "size": SIZE, "workers": list(workers), "slots": slots,
                                 "seed": seed, "photos": photo_set})
    tf = decode_suite._import_tensorflow() if tensorflow else None
    result.params["tensorflow"] = getattr(tf, "__version__", None)
    result.params["jpeg_decoder"] = image_module.JPEG_DECODER
    result.notes.append(f"JPEG decoder of this build: {image_module.JPEG_DECODER}")
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="infeed-bench-images-"))
        os.makedirs(data_dir, exist_ok=True)
        for source in sources:
            height, width, full, small = SOURCES[source]
            base = max(small if quick else full, daemon_batches(max(workers)) * BATCH_SIZE)
            records = max(3 * BATCH_SIZE, round(base * scale)) // BATCH_SIZE * BATCH_SIZE
            log(f"images: writing {records} {source} photos to {data_dir} ...")
            path, took = ensure_photos(data_dir, source, records, seed, photo_set)
            _measure_source(result, tf, source, path, records, workers, slots, repeats)
            how = "reused" if took is None else f"written in {took:.1f} s"
            result.notes.append(f"data: {source}: {records} photos ({photo_set}: {PHOTO_SETS[photo_set]}), "
                                f"{os.path.getsize(path) / 1e6:.1f} MB ({os.path.getsize(path) / records / 1e3:.0f} KB "
                                f"each), {how}: {path}")
    result.notes.append("nothing pinned; the daemon's consumer only takes batches; its rows are the steady state "
                        f"(batches W+1..N, at least {STEADY_BATCHES_PER_WORKER} per worker; the photos are as many as "
                        "the largest W needs, times --scale, and a W whose file is too short for it is refused, it "
                        "and its ratios); every other row is a whole pass over the file; images/s is records/s; "
                        "MB/s counts the file's bytes")
    if tf is not None:
        result.notes.append(f"tf.data: TensorFlow {tf.__version__}, INTEGER_FAST IDCT (infeed's default), bilinear "
                            "resize; a T-thread pipeline has a private pool of T threads, num_parallel_calls=T and "
                            "no intra-op parallelism")
    else:
        result.notes.append(decode_suite.TF_MISSING if tensorflow else "tf.data comparison not run (--no-tf)")
    return result


def _measure_source(result: SuiteResult, tf, source: str, path: str, records: int, workers: Sequence[int],
                    slots: Sequence[int], repeats: int) -> None:
    nbytes = os.path.getsize(path)
    with infeed.read_records(path) as reader:
        framed = list(reader)
    images, sizes = images_of(framed), [len(r) + 16 for r in framed]       # each record's bytes, framing included
    del framed
    n_batches = records // BATCH_SIZE
    refused = {w: why for w in workers if (why := steady_refusal(w, n_batches))}
    for w, why in refused.items():
        result.refuse(source, [daemon_name(w, mode, n) for mode in MODES for n in slots], why)
    several = [w for w in workers if w > 1]
    cases = [_bare_case(images, nbytes), *_part_cases(images, nbytes)]
    daemons = []
    with contextlib.ExitStack() as stack:
        for mode in MODES:
            cases.append(_parse_case(path, mode, records, nbytes))
            if image_module.JPEG_DECODER != "simplejpeg":
                cases.append(_parse_case(path, mode, records, nbytes, whole=True))
            cases += [Case(parallel_name(w, mode), stack.enter_context(
                ParallelParse(path, f"images:{mode}", BATCH_SIZE, w, share=True)).run, records, nbytes)
                      for w in several]
            # Streamed, as in every report of this suite before indexes were built by default (from W=4).
            dataset = infeed.Dataset(path, spec(mode), batch_size=BATCH_SIZE, num_epochs=1, build_indexes=False)
            daemons += [DaemonCase(daemon_name(w, mode, n), dataset, w, slots=n)
                        for n in slots for w in workers if w not in refused]
            cpus = sorted(os.sched_getaffinity(0))
            if mode == SHARED_MODE and 2 in workers and len(cpus) >= 2:
                if 2 in refused:
                    result.refuse(source, [shared_cpu_name(mode)], refused[2])
                else:
                    daemons.append(_shared_cpu_case(dataset, cpus[:2]))
        cases += [d.case(records, nbytes) for d in daemons]
        if tf is not None:
            pipeline, antialiased, unscaled = _check_agreement(tf, path)
            result.notes.append(f"{source}: infeed's centre crops of the first batch differ from tf.data's by "
                                f"{pipeline:.2f} uint8 levels on average, from the whole image resized with "
                                f"antialias=True by {antialiased:.2f}; with dct_scaling=False from tf.data's by "
                                f"{unscaled:.2f}")
            cases += [_tf_case(tf, tf_name(mode, t), _tf_pipeline(tf, path, mode, t), records, nbytes)
                      for mode in MODES for t in workers]
            cases.append(_tf_case(tf, TF_FULL, _tf_pipeline(tf, path, "centre crop", 1, decode_first=True), records,
                                  nbytes))
        log(f"images: timing {source} ({len(cases)} cases, {repeats} runs each) ...")
        settle_allocator()
        measured = interleave(cases, repeats, WARMUP)
    steady = {d.name: d for d in daemons}
    for m in measured:
        d = steady.get(m.case.name)
        if d is None:
            result.figures.append(dataclasses.replace(m.figure(SUITE, source), batches=n_batches))
            continue
        result.figures.append(steady_figure(d, d.name, source, sizes, BATCH_SIZE, n_batches, SUITE))
        result.stages.append(stage_breakdown(source, d.name, d.median_stages()))
    for mode in MODES:
        bound = {1: parse_name(mode), **{w: parallel_name(w, mode) for w in several}}
        for n in slots:
            result.add_scaling(source, scaling_label(mode, n), {w: daemon_name(w, mode, n) for w in workers}, bound)
    _add_ratios(result, source, tf is not None, workers)
    _add_breakdown(result, source)


def _add_ratios(result: SuiteResult, source: str, with_tf: bool, workers: Sequence[int]) -> None:
    pairs = [(daemon_name(1, "centre crop"), BARE), (daemon_name(1, "random resized crop"), BARE),
             (daemon_name(1, "centre crop"), parse_name("centre crop"))]
    if image_module.JPEG_DECODER != "simplejpeg":      # the window against the whole image, as _measure_source ran
        pairs += [(parse_name(mode), whole_name(mode)) for mode in MODES]
    if with_tf:
        pairs += [(daemon_name(w, mode), tf_name(mode, w)) for mode in MODES for w in workers]
        pairs.append((daemon_name(1, "centre crop"), TF_FULL))
    pairs += [(daemon_name(w, mode), daemon_name(1, mode)) for mode in MODES for w in workers if w > 1]
    shared = shared_cpu_name(SHARED_MODE)
    if any(x.name == shared for x in [*result.figures, *result.refused]):
        pairs += [(shared, daemon_name(2, SHARED_MODE)), (shared, daemon_name(1, SHARED_MODE))]
        result.notes.append(
            f"{source}: '{shared}': worker 0 is pinned to a CPU where another process spins, worker 1 alone to a "
            f"second CPU. Batches go to whichever worker is free, so worker 1 makes more of them and worker 0 adds "
            f"what its half of a CPU gives: about 1.5x '{daemon_name(1, SHARED_MODE)}' (dealt in turn, both went at "
            f"worker 0's pace: 1.0-1.2x)")
    for num, den in pairs:
        result.add_ratio(source, f"{num} / {den}", lambda: result.rate(source, num) / result.rate(source, den),
                         TARGETS.get((num, den), {}).get(source))


def _add_breakdown(result: SuiteResult, source: str) -> None:
    """Per image: the bare decode, the decode at the centre crop's DCT scale, the rest of parse (the kernel
    included, on the image just decoded), and the kernel alone over decoded images out of the caches."""
    us = {name: 1e6 / result.figure(source, name).records_per_s
          for name in (BARE, DECODE_PART, RESIZE_PART, parse_name("centre crop"))}
    parse, decode_part = us[parse_name("centre crop")], us[DECODE_PART]
    try:
        daemon = (f"takes {1e6 / result.rate(source, daemon_name(1, 'centre crop')):,.0f} us (its worker, the ring, "
                  "the hand-off)")
    except Refused as e:
        daemon = f"is refused ({e.refusal.reason})"
    walked = result.figure(source, RESIZE_PART).records
    result.notes.append(
        f"{source}, where a centre crop's time goes, per image: full-size decode {us[BARE]:,.0f} us; ours in one "
        f"process {parse:,.0f} us = decode of the window at the DCT scale {decode_part:,.0f} us + "
        f"{parse - decode_part:,.0f} us for the kernel on the image just decoded, the Example, the header and Python "
        f"(the kernel alone, over {walked} decoded images out of the caches: {us[RESIZE_PART]:,.0f} us); the daemon (W=1) {daemon}")
