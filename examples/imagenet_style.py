"""ImageNet-style: JPEG photos in sharded TFRecords, augmented in the daemon's workers, a CNN trained and exported.

Run with ``python examples/imagenet_style.py`` (1.5-2 minutes on 2 cores; ``--help`` for the sizes).
Real photos cannot be downloaded here, so the job draws an ImageNet-style dataset of its own: six classes of
shapes (circle, square, triangle, ring, cross, stripes) in random colours, sizes and turns, near the middle of
backgrounds cut from the two photos that ship with scikit-learn (china.jpg and flower.jpg) at random places and
scales, mirrored, their colours and noise jittered; 300-500 pixels a side, JPEG-encoded with simplejpeg. They
are written as ``train-0000i-of-0000N`` and ``validation-0000i-of-0000N`` TFRecord files in the layout of
TensorFlow's ``build_imagenet_data.py`` (``image/encoded``, ``image/class/label``, ``image/class/text``,
``image/height``, ``image/width``, ``image/format``, ``image/filename``, ...; labels count from 0, where that
script keeps 0 for a background class).

A small CNN in plain JAX is trained by an ``Estimator`` whose ``input_fn`` returns an ``infeed.Dataset`` with
an ``infeed.Image(resize="random_resized_crop", flip=True, mean=..., std=...)`` feature: the daemon's workers
decode each JPEG (at the smallest DCT scale that keeps the crop larger than the output), crop, resize, flip and
normalise it straight into the batch. The model is evaluated on every validation picture once, centre-cropped
(``resize="center_crop"``), exported, reloaded without its code and served the same centre crops, decoded in
this process by ``infeed.ExampleParser``. A summary table is printed; TensorBoard event files are left in the
model directory.

The exit status is 1 when the validation accuracy is below ``--min-accuracy`` (0.6; chance is 1/6) or a check
fails (the evaluated pictures, the served accuracy).
"""

from __future__ import annotations

import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import estimator as est
import infeed
from estimator.summaries import read_scalars

from digits import job_parser, report, run_job      # examples/, beside this file

CLASSES = ("circle", "square", "triangle", "ring", "cross", "stripes")
LABEL = "image/class/label"
#: ImageNet's per-channel mean and standard deviation on the 0-255 scale (what ResNet's preprocessing subtracts).
MEAN, STD = (123.68, 116.78, 103.94), (58.39, 57.12, 57.38)
#: The CNN: 3x3 convolutions of these (width, stride), then a global average and a dense layer to the classes.
LAYERS = ((16, 2), (32, 2), (32, 1), (64, 2), (64, 1), (128, 2))
#: Sides of the written images, in pixels (ImageNet's photos are mostly 300-500 pixels a side).
SIDES = (300, 500)


# --- data ---------------------------------------------------------------------------------------
def load_photos() -> tuple[np.ndarray, ...]:
    """scikit-learn's two sample photos (china.jpg and flower.jpg, 427x640 RGB), shipped with it: no network."""
    from sklearn.datasets import load_sample_images

    return tuple(load_sample_images().images)


def background(photos, height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """A ``[height, width, 3]`` float32 cut from one of the photos: a window of 35-100% of the largest one of
    the output's aspect, at a random place, mirrored half the time, resized (nearest pixel), colours jittered."""
    photo = photos[rng.integers(len(photos))]
    largest = min(photo.shape[0], photo.shape[1] * height / width)
    crop_h = max(1, int(largest * rng.uniform(0.35, 1.0)))
    crop_w = max(1, min(photo.shape[1], round(crop_h * width / height)))
    top = rng.integers(photo.shape[0] - crop_h + 1)
    left = rng.integers(photo.shape[1] - crop_w + 1)
    rows = top + np.arange(height) * crop_h // height
    cols = left + np.arange(width) * crop_w // width
    if rng.random() < 0.5:
        cols = cols[::-1]
    gain = rng.uniform(0.6, 1.3) * rng.uniform(0.85, 1.15, 3)
    return photo[rows[:, None], cols[None, :]].astype(np.float32) * gain.astype(np.float32)


def shape_mask(label: int, side: int, rng: np.random.Generator) -> np.ndarray:
    """A bool ``[side, side]`` mask of class ``CLASSES[label]`` inscribed in the square's circle, turned at random."""
    u, v = (np.mgrid[0:side, 0:side] + 0.5) * (2.0 / side) - 1.0
    angle = rng.uniform(0, 2 * math.pi)
    along, across = u * math.cos(angle) + v * math.sin(angle), v * math.cos(angle) - u * math.sin(angle)
    radius2 = u * u + v * v
    name = CLASSES[label]
    if name == "circle":
        return radius2 <= 1.0
    if name == "square":
        return np.maximum(np.abs(along), np.abs(across)) <= 0.7
    if name == "triangle":             # an equilateral triangle: three edges half the circle's radius from its centre
        return np.all([u * math.cos(angle + k * 2 * math.pi / 3) + v * math.sin(angle + k * 2 * math.pi / 3) <= 0.5
                       for k in range(3)], axis=0)
    if name == "ring":
        return (radius2 <= 1.0) & (radius2 >= rng.uniform(0.3, 0.6) ** 2)
    if name == "cross":
        arm = rng.uniform(0.2, 0.35)
        return ((np.abs(along) <= arm) | (np.abs(across) <= arm)) & (np.maximum(np.abs(along), np.abs(across)) <= 0.9)
    if name == "stripes":              # a disc of 3-5 parallel bars
        return (radius2 <= 1.0) & (np.sin(along * math.pi * rng.uniform(1.5, 2.5)) > 0)
    raise ValueError(f"no class {label}")


def draw_image(photos, label: int, rng: np.random.Generator) -> np.ndarray:
    """One ``[H, W, 3]`` uint8 picture: a shape of class ``label`` in a random colour over a background cut from the
    photos; sides of ``SIDES`` pixels, the shape 35-80% of the shorter one, wholly inside, near the middle."""
    height, width = (int(rng.integers(SIDES[0], SIDES[1] + 1)) for _ in range(2))
    pixels = background(photos, height, width, rng)
    side = int(min(height, width) * rng.uniform(0.35, 0.8))
    shift = rng.normal(0.0, 0.1 * min(height, width), 2)          # near the middle, as ImageNet's objects
    top = int(np.clip((height - side) / 2 + shift[0], 0, height - side))
    left = int(np.clip((width - side) / 2 + shift[1], 0, width - side))
    mask = shape_mask(label, side, rng)
    colour = rng.uniform(0, 255, 3).astype(np.float32)
    window = pixels[top:top + side, left:left + side]
    window[mask] = colour * rng.uniform(0.8, 1.0) + window[mask] * rng.uniform(0.0, 0.2)
    pixels += rng.standard_normal((height, width, 1), dtype=np.float32) * rng.uniform(0, 8)
    return np.clip(pixels, 0, 255, out=pixels).astype(np.uint8)


def encode_jpeg(pixels: np.ndarray, rng: np.random.Generator) -> bytes:
    import simplejpeg

    return simplejpeg.encode_jpeg(pixels, quality=int(rng.integers(75, 96)), colorsubsampling="420")


def imagenet_record(pixels: np.ndarray, encoded: bytes, label: int, filename: str) -> bytes:
    """One record in the layout of TensorFlow's ``build_imagenet_data.py`` (less its synset and boxes)."""
    return infeed.encode_example({
        "image/height": pixels.shape[0], "image/width": pixels.shape[1], "image/colorspace": "RGB",
        "image/channels": 3, "image/class/label": label, "image/class/text": CLASSES[label],
        "image/format": "JPEG", "image/filename": filename, "image/encoded": encoded})


def write_split(directory: str, split: str, records: int, shards: int, photos, seed: int) -> list[str]:
    """``split-0000i-of-0000N`` TFRecord files holding ``records`` examples, the classes balanced and shuffled;
    every picture drawn from its own generator ``(seed, split, index)``, whatever the sharding."""
    split_id = ("train", "validation").index(split)
    os.makedirs(directory, exist_ok=True)
    labels = np.random.default_rng((seed, split_id)).permutation(np.arange(records) % len(CLASSES))
    paths = []
    for shard, indices in enumerate(np.array_split(np.arange(records), shards)):
        paths.append(os.path.join(directory, f"{split}-{shard:05d}-of-{shards:05d}"))
        with infeed.TFRecordWriter(paths[-1]) as writer:
            for i in indices:
                rng = np.random.default_rng((seed, split_id, int(i)))
                pixels = draw_image(photos, int(labels[i]), rng)
                writer.write(imagenet_record(pixels, encode_jpeg(pixels, rng), int(labels[i]), f"{split}_{i:06d}.JPEG"))
    return paths


# --- input --------------------------------------------------------------------------------------
def input_spec(args, resize: str) -> dict:
    """The spec: the JPEG decoded, cropped (``resize``), resized to ``--image-size``, normalised into bfloat16 (half
    the bytes of float32 through the ring; the model computes in float32); the label."""
    image = infeed.Image(size=(args.image_size, args.image_size), dtype="bfloat16", resize=resize,
                         flip=resize == "random_resized_crop", area=(args.min_area, 1.0), mean=MEAN, std=STD)
    return {"image": image, LABEL: infeed.FixedLen((), "int64")}


# --- model --------------------------------------------------------------------------------------
@jax.jit
def init_fn(rng, features):
    """He-initialised convolutions (``LAYERS``) and a dense layer to the classes, from one normal draw sliced
    (XLA:CPU compiles that faster than one threefry program per layer)."""
    channels = (features["image"].shape[-1], *(width for width, _ in LAYERS))
    shapes = [(3, 3, c_in, c_out) for c_in, c_out in zip(channels[:-1], channels[1:])] + [(channels[-1], len(CLASSES))]
    draw = jax.random.normal(rng, (sum(math.prod(s) for s in shapes),))
    params, start = {}, 0
    for i, shape in enumerate(shapes):
        fan_in = math.prod(shape[:-1])
        w = draw[start:start + math.prod(shape)].reshape(shape) * math.sqrt(2.0 / fan_in)
        params[f"conv{i}" if len(shape) == 4 else "dense"] = {"w": w, "b": jnp.zeros(shape[-1])}
        start += math.prod(shape)
    return {"params": params}


def conv3x3(x, w, stride: int):
    """A 3x3 convolution (zero padded, every ``stride``-th pixel) as one matmul over the nine shifted views.

    ``jax.lax.conv_general_dilated`` computes the same, but XLA:CPU runs its weight gradient 70-150 times slower
    inside a compiled loop (the Estimator's ``lax.scan``) than outside one: a training step of 3 s instead of 0.13 s
    at the default size (docs/porting.md, "On a CPU"). A matmul's gradient is a matmul, as fast in the loop as out.
    """
    height, width = -(-x.shape[1] // stride), -(-x.shape[2] // stride)
    padded = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    views = [padded[:, dy:dy + stride * (height - 1) + 1:stride, dx:dx + stride * (width - 1) + 1:stride]
             for dy in range(3) for dx in range(3)]
    return jnp.concatenate(views, axis=-1) @ w.reshape(-1, w.shape[-1])


def logits_of(params, images):
    x = images.astype(jnp.float32)
    for i, (_, stride) in enumerate(LAYERS):
        x = jax.nn.relu(conv3x3(x, params[f"conv{i}"]["w"], stride) + params[f"conv{i}"]["b"])
    return x.mean(axis=(1, 2)) @ params["dense"]["w"] + params["dense"]["b"]


def model_fn(variables, features, labels, mode, params):
    logits = logits_of(variables["params"], features["image"])
    predictions = {"class": logits.argmax(-1), "probabilities": jax.nn.softmax(logits)}
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions=predictions)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)    # per example: padding left out
    accuracy = est.metrics.accuracy(labels, predictions["class"])
    return est.EstimatorSpec(mode, loss=loss, eval_metrics={"accuracy": accuracy})


# --- serving ------------------------------------------------------------------------------------
def decode_files(paths: list[str], spec: dict) -> dict:
    """Every record of ``paths`` decoded in this process by ``infeed.ExampleParser`` (no daemon)."""
    parser = infeed.ExampleParser(spec)
    records = [record for path in paths for record in infeed.read_records(path)]
    return parser.parse(records)


# --- the job ------------------------------------------------------------------------------------
def parse_args(argv):
    ap = job_parser("python examples/imagenet_style.py", __doc__.splitlines()[0])
    ap.add_argument("--train-records", type=int, default=2000, help="training pictures (default 2000)")
    ap.add_argument("--validation-records", type=int, default=500, help="validation pictures (default 500)")
    ap.add_argument("--train-shards", type=int, default=4, help="training TFRecord files (default 4)")
    ap.add_argument("--validation-shards", type=int, default=2, help="validation TFRecord files (default 2)")
    ap.add_argument("--image-size", type=int, default=64, help="side of the decoded crops (default 64)")
    ap.add_argument("--min-area", type=float, default=0.25,
                    help="smallest share of a picture a training crop covers (default 0.25; ImageNet's 0.08)")
    ap.add_argument("--steps", type=int, default=600, help="training steps (default 600)")
    ap.add_argument("--iterations-per-loop", type=int, default=100, help="steps per compiled loop (default 100)")
    ap.add_argument("--batch-size", type=int, default=64, help="training batch (default 64)")
    ap.add_argument("--eval-batch-size", type=int, default=128, help="evaluation batch (default 128)")
    ap.add_argument("--learning-rate", type=float, default=3e-3, help="Adam's peak learning rate (default 3e-3)")
    ap.add_argument("--workers", type=int, default=2, help="daemon worker processes (default 2)")
    ap.add_argument("--seed", type=int, default=0, help="pictures, shuffle, crops and initialisation (default 0)")
    ap.add_argument("--min-accuracy", type=float, default=0.6, help="validation accuracy to pass (default 0.6)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    return run_job(parse_args(argv), "imagenet-style-", run)


def run(args, root: str, model_dir: str) -> int:
    data_dir = os.path.join(root, "data")
    photos = load_photos()
    t0 = time.perf_counter()
    train_files = write_split(data_dir, "train", args.train_records, args.train_shards, photos, args.seed)
    validation_files = write_split(data_dir, "validation", args.validation_records, args.validation_shards, photos,
                                   args.seed)
    t_write = time.perf_counter() - t0
    written = sum(os.path.getsize(p) for p in train_files + validation_files)

    def train_input_fn(params):
        return infeed.Dataset(train_files, input_spec(args, "random_resized_crop"), batch_size=params["batch_size"],
                              labels=LABEL, shuffle_files=True, shuffle_buffer=min(args.train_records, 1024),
                              seed=args.seed, num_epochs=None)

    def validation_input_fn(params):
        return infeed.Dataset(validation_files, input_spec(args, "center_crop"), batch_size=params["batch_size"],
                              labels=LABEL)

    k = args.iterations_per_loop
    config = est.RunConfig(model_dir=model_dir, iterations_per_loop=k, save_checkpoints_steps=args.steps,
                           save_summary_steps=k, log_step_count_steps=None if args.quiet else k, seed=args.seed,
                           infeed_workers=args.workers)
    schedule = optax.warmup_cosine_decay_schedule(0.0, args.learning_rate, min(100, args.steps // 10), args.steps)
    estimator = est.Estimator(model_fn, init_fn, optax.adam(schedule), config,
                              train_batch_size=args.batch_size, eval_batch_size=args.eval_batch_size)

    t0 = time.perf_counter()
    estimator.train(train_input_fn, max_steps=args.steps)
    t_train = time.perf_counter() - t0
    losses = [v for _, v in read_scalars(model_dir).get("loss", [])]

    t0 = time.perf_counter()
    result = estimator.evaluate(validation_input_fn)
    t_eval = time.perf_counter() - t0

    side = args.image_size
    path = estimator.export(os.path.join(root, "export"), {"image": est.TensorSpec((None, side, side, 3), "bfloat16")})
    validation = decode_files(validation_files, input_spec(args, "center_crop"))
    served = est.load_exported(path)({"image": validation["image"]})
    served_right = int(np.sum(served["class"] == validation[LABEL]))

    n = args.validation_records
    right = round(result["accuracy"] * n)
    checks = {
        f"accuracy >= {args.min_accuracy:g}": result["accuracy"] >= args.min_accuracy,
        "evaluated every validation picture once": result["examples"] == n,
        "the export scores as evaluate (to 1%)": abs(served_right - right) <= max(1, n // 100),
    }
    failed = [name for name, ok in checks.items() if not ok]
    first = int(served["class"][0])
    rows = [
        ("data", f"{args.train_records:,} train / {n:,} validation JPEGs ({SIDES[0]}-{SIDES[1]} px a side) in "
                 f"{len(train_files)} + {len(validation_files)} TFRecord files, {written / 1e6:.1f} MB, "
                 f"written in {t_write:.1f} s"),
        ("classes", f"{len(CLASSES)}: {', '.join(CLASSES)} (chance {1 / len(CLASSES):.3f})"),
        ("input", f"infeed.Image {side}x{side} bfloat16, normalised: random_resized_crop (area {args.min_area:g}-1) "
                  f"and flip to train, center_crop to evaluate; {args.workers} daemon workers"),
        ("model", f"{len(LAYERS)} 3x3 convolutions (width/stride {' '.join(f'{w}/{s}' for w, s in LAYERS)}), "
                  f"global average, dense; Adam {args.learning_rate:g}, cosine decay"),
        ("train steps", f"{estimator.global_step():,} (batch {args.batch_size}, {k} steps per compiled loop)"),
        ("train time", f"{t_train:.1f} s, {estimator.global_step() * args.batch_size / t_train:,.0f} pictures/s "
                       f"(daemon start and compilation included)"),
        ("train loss", f"{losses[0]:.3f} at the first summary, {losses[-1]:.3f} at the last" if losses else "none"),
        ("eval accuracy", f"{result['accuracy']:.4f} ({right}/{n}), loss {result['loss']:.4f}, {t_eval:.1f} s"),
        ("export", path),
        ("served", f"{served_right}/{n} right from the export (centre crops decoded by infeed.ExampleParser); "
                   f"the first picture: {CLASSES[first]} (p {served['probabilities'][0, first]:.2f}), "
                   f"labelled {CLASSES[int(validation[LABEL][0])]}"),
    ]
    return report("imagenet-style", rows, model_dir, failed)


if __name__ == "__main__":
    sys.exit(main())
