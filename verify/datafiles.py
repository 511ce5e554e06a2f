"""User data files read into arrays, never through pickle: .npy, .npz, .json (nested lists
or an object of them), .pb (an ONNX TensorProto) and images (Pillow, EXIF rotation applied).
Every way a file can be unusable is one InputError line naming it. `inputs` builds cases from
these (`pack -d`, `run --input`); `load_array_file` reads one array as stored, unprocessed.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import onnx

from verify.errors import InputError
from verify.files import NPY_READ_ERRORS, npy_reason, npy_refusal, read_head, read_user_file

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".pgm")  # named in messages
ARRAY_SUFFIXES = (".npy", ".npz", ".json", ".pb")


@functools.lru_cache(maxsize=1)
def _pillow_suffixes() -> frozenset[str]:
    from PIL import Image

    return frozenset(Image.registered_extensions())


def is_image(suffix: str) -> bool:
    """Whether a file suffix is an image format the installed Pillow decodes (.webp, .tif,
    .gif, ... besides IMAGE_SUFFIXES)."""
    suffix = suffix.lower()
    return suffix in IMAGE_SUFFIXES or (suffix not in ARRAY_SUFFIXES
                                        and suffix in _pillow_suffixes())


def load_array_file(path: Path, name: str) -> np.ndarray:
    """One array for input `name` from .npy/.npz/.json/.pb, or an image decoded as is:
    (H,W,3) uint8 RGB, or (H,W) for a grayscale file; no resizing or layout, since there is
    no model shape to follow (build_cases does that). npz/JSON objects: the array `name`,
    or the only one."""
    path = Path(path)
    label = str(path)
    check_file(path, label)
    suffix = path.suffix.lower()
    if is_image(suffix):
        img = open_image(path, label)
        gray = img.mode in ("1", "L", "I", "I;16", "I;16B", "I;16L", "F")
        return np.asarray(img.convert("L" if gray else "RGB"))
    loaded = load_data_file(path, label)
    if isinstance(loaded, np.ndarray):
        return loaded
    return pick(loaded, name, label)


def check_file(path: Path, label: str) -> None:
    if path.is_dir():
        raise InputError(f"{label}: is a directory, not a data file (a folder given to -d is "
                         "onnx_test_runner's: test_data_set_N/input_K.pb, or the folder of "
                         "such sets)")
    if not path.is_file():
        where = "" if str(path) == label else f" (looked for {path})"
        raise InputError(f"{label}: no such file{where}")
    suffix = path.suffix.lower()
    if suffix not in ARRAY_SUFFIXES and not is_image(suffix):
        raise InputError(f"{label}: unsupported file type '{suffix or path.name}'; use .npy, .npz, "
                         f".json, .pb or an image ({' '.join(IMAGE_SUFFIXES)}, or any other "
                         "format Pillow reads)")


def load_data_file(path: Path, label: str) -> np.ndarray | dict[str, np.ndarray]:
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return load_npy(path, label)
    if suffix == ".npz":
        return load_npz(path, label)
    if suffix == ".json":
        try:
            obj = json.loads(read_user_file(path, InputError, "a .json file", label).decode("utf-8"))
        except UnicodeDecodeError:
            raise InputError(f"{label}: not a UTF-8 text file; .json must hold nested lists") from None
        except ValueError as e:
            raise InputError(f"{label}: invalid JSON ({e})") from None
        if isinstance(obj, dict):
            return mapping_arrays(obj, label)
        return to_array(obj, label)
    return load_pb(path, label)


_PICKLE_REFUSED = ("holds pickled Python objects, which verify never loads; save a numeric "
                   "array instead: np.save(path, arr.astype(np.float32))")


def _unreadable(e: Exception, path: Path, label: str, suffix: str, saver: str) -> InputError:
    """One line for an .npy or .npz that numpy could not read."""
    if isinstance(e, PermissionError):  # not a damaged file: say what it is
        return InputError(f"{label}: cannot read: {e.strerror or e}")
    refusal = npy_refusal(e, read_head(path, 2))
    if refusal == "pickled":
        return InputError(f"{label}: {_PICKLE_REFUSED}")
    if refusal == "no magic" and suffix == ".npy":
        return InputError(f"{label}: not an .npy file (it does not start with numpy's magic); "
                          "save it with np.save")
    return InputError(f"{label}: truncated or corrupt {suffix} file "
                      f"({npy_reason(e) if str(e) else 'empty'}); save it again with {saver}")


def load_npy(path: Path, label: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except NPY_READ_ERRORS as e:
        raise _unreadable(e, path, label, ".npy", "np.save") from None


def load_npz(path: Path, label: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise InputError(f"{label}: holds a single .npy array, not an archive; "
                                 "rename it to .npy")
            return {k: z[k] for k in z.files}
    except NPY_READ_ERRORS as e:
        raise _unreadable(e, path, label, ".npz", "np.savez") from None


def load_pb(path: Path, label: str) -> np.ndarray | dict[str, np.ndarray]:
    from google.protobuf.message import DecodeError

    tensor = onnx.TensorProto()
    try:
        tensor.ParseFromString(read_user_file(path, InputError, "a TensorProto .pb file", label))
        arr = onnx.numpy_helper.to_array(tensor)
    except (DecodeError, ValueError, TypeError, RuntimeError) as e:
        raise InputError(f"{label}: not a serialized ONNX TensorProto ({e})") from None
    return {tensor.name: arr} if tensor.name else arr


def open_image(path: Path, label: str):  # -> PIL.Image.Image, imported lazily
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        img = Image.open(path)
        if img.mode in ("RGB", "RGBA") and any(";16" in _rawmode(t) for t in img.tile):
            # Pillow has no 16-bit colour mode: it keeps each channel's high byte
            raise InputError(f"{label}: a 16-bit colour image; Pillow decodes colour at 8 "
                             "bits per channel (the low 8 would be lost): give its pixels as "
                             "a .npy or .npz array (e.g. from cv2.imread(path, "
                             "cv2.IMREAD_UNCHANGED)), or save it at 8 bits")
        img.load()
        return ImageOps.exif_transpose(img)
    except UnidentifiedImageError:
        raise InputError(f"{label}: cannot decode image (not a format Pillow reads, "
                         "or the file is not an image)") from None
    except PermissionError as e:  # not a damaged file: say what it is
        raise InputError(f"{label}: cannot read: {e.strerror or e}") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise InputError(f"{label}: truncated or corrupt image ({e})") from None


def _rawmode(tile: object) -> str:
    """The raw mode a Pillow tile decodes from ('RGB;16B'): its args, or their first item."""
    args = getattr(tile, "args", None)
    args = args[0] if isinstance(args, tuple) and args else args
    return args if isinstance(args, str) else ""


def mapping_arrays(obj: dict, label: str) -> dict[str, np.ndarray]:
    return {str(k): to_array(v, f"{label} key '{k}'") for k, v in obj.items()}


def to_array(obj: object, label: str) -> np.ndarray:
    try:
        arr = np.array(obj)
    except ValueError:
        raise InputError(f"{label}: not a numeric array (ragged nested lists)") from None
    if arr.dtype == object:
        raise InputError(f"{label}: not a numeric array (holds null, objects or integers "
                         "beyond 64 bits)")
    return arr


def pick(arrays: dict[str, np.ndarray], name: str, label: str) -> np.ndarray:
    if name in arrays:
        return arrays[name]
    if len(arrays) == 1:
        return next(iter(arrays.values()))
    held = fmt_names(arrays) if arrays else "nothing"
    raise InputError(f"{label}: has no array named '{name}' (it holds {held})")


def fmt_names(names: object) -> str:
    return ", ".join(f"'{n}'" for n in names)  # type: ignore[attr-defined]
