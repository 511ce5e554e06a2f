"""Images as model inputs: decoded with Pillow, converted to RGB (L for one channel), resized
bilinearly to the input's H x W, laid out NCHW or NHWC as the input's dims say (or --layout),
preprocessed (x*scale, (x-mean)/std per channel, BGR) and cast to the input's dtype."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from verify.datafiles import open_image
from verify.errors import InputError
from verify.input_casts import dtype_name, image_cast, kind
from verify.input_shapes import Dim, fmt_shape

if TYPE_CHECKING:
    from verify.inputs import InputInfo, Preprocess


class ImageSizeError(InputError):
    """An image for an input of dynamic height or width: `head` says so, `name` is the input,
    `tries` the shapes to suggest, each with what to say of it (the image's own size, then
    that rounded up to a multiple of 32), for pack to try on the model (`inputs.build_cases`)."""

    def __init__(self, message: str, head: str, name: str,
                 *tries: tuple[tuple[int, ...], str]) -> None:
        super().__init__(message)
        self.head, self.name, self.tries = head, name, tries


def image_input(path: Path, label: str, info: InputInfo, shape: tuple[Dim, ...] | None,
                pre: Preprocess) -> np.ndarray:
    """An image file as input `info`'s array (`shape`: its dims with --shape laid over)."""
    from PIL import Image

    name = info.name
    if shape is None:
        raise InputError(f"{label}: input '{name}' declares no shape; pass --shape "
                         f"{name}:1x3xHxW (or 1xHxWx3) to lay the image out")
    if len(shape) not in (2, 3, 4) or kind(info.dtype) not in "fiu":
        raise InputError(f"{label}: input '{name}' of shape {fmt_shape(shape)} and "
                         f"type {dtype_name(info.dtype)} cannot take an image; images fit "
                         "(N,C,H,W), (N,H,W,C), (C,H,W), (H,W,C) or (H,W) number inputs")
    batch = len(shape) == 4
    spatial = list(shape[1:] if batch else shape)
    if len(spatial) == 2:
        c_axis, channels = None, 1
    else:
        c_axis = channel_axis(spatial, label, info, shape, pre)
        c_dim = spatial[c_axis]
        channels = c_dim if isinstance(c_dim, int) else 3
        if channels not in (1, 3):
            raise InputError(f"{label}: input '{name}' {fmt_shape(shape)} has {channels} "
                             "channels; an image gives 1 (gray) or 3 (RGB)")
        del spatial[c_axis]
    if batch and isinstance(shape[0], int) and shape[0] != 1:
        raise InputError(f"{label}: input '{name}' expects batch {shape[0]}, an image gives 1; "
                         "give a .npy or .npz holding the whole batch")
    for opt, vals in (("--mean", pre.mean), ("--std", pre.std)):
        if vals is not None and len(vals) not in (1, channels):
            raise InputError(f"{opt} has {len(vals)} values but input '{name}' has "
                             f"{channels} {'channel' if channels == 1 else 'channels'}")
    img = open_image(path, label)
    # a 16-bit, 32-bit or float image is one channel (Pillow has no deeper colour modes): kept
    # at its own depth, in its own units, and given to a 3-channel input as gray in each
    # channel; converting it to RGB clipped 16-bit values at 255 and truncated floats to 0
    high_depth = img.mode in ("I", "I;16", "I;16B", "I;16L", "F")
    img = img.convert("F" if high_depth else "L" if channels == 1 else "RGB")
    h, w = (d if isinstance(d, int) else None for d in spatial)
    if h is None or w is None:
        # Keeping the image's own size would fix H/W silently, and models with dynamic H/W
        # still expect particular sizes (PP-OCR rec: H 48); the user picks, told the size.
        def laid(height: int, width: int) -> tuple[int, ...]:  # the input's shape for them
            dims = ([height, width] if c_axis is None else [channels, height, width]
                    if c_axis == 0 else [height, width, channels])
            return tuple([1, *dims] if batch else dims)

        own = laid(h or img.height, w or img.width)
        # a fixed side the image does not have is resized to: "keep that size" would be false
        fixed = [f"{what} {d}" for what, d, size in (("height", h, img.height),
                                                     ("width", w, img.width))
                 if d is not None and d != size]
        keep = (f"to keep its {'width' if h is not None else 'height'} (it is resized to the "
                f"model's fixed {fixed[0]})" if fixed else "to keep that size")
        head = (f"{label}: input '{name}' {fmt_shape(shape)} has dynamic height or width; the "
                f"image is {img.width}x{img.height} (WxH)")
        # the same rounded up to a multiple of 32, the stride detectors need (PP-OCR det)
        up = laid(h or -(-img.height // 32) * 32, w or -(-img.width // 32) * 32)
        tries = [(own, f"{keep} (the model runs with it here)")] + ([] if up == own else [
            (up, "(its size rounded up to a multiple of 32: the model runs with that here, "
                 "not with its own)")])
        raise ImageSizeError(f"{head}: pass --shape {name}:{'x'.join(map(str, own))} {keep}, "
                             "or the size the model expects", head, name, *tries)
    if h == 0 or w == 0:  # --shape may set a dim to 0 (an empty tensor); no image fills that
        raise InputError(f"{label}: input '{name}' {fmt_shape(shape)} has height {h} and width "
                         f"{w}; an image needs both > 0 (set them with --shape)")
    size = (w, h)
    if size != img.size:
        img = img.resize(size, Image.Resampling.BILINEAR)
    x = np.asarray(img, dtype=np.float64).reshape(size[1], size[0], -1)  # HWC
    if x.shape[2] != channels:  # a high-depth gray image into a 3-channel input
        x = np.repeat(x, channels, axis=2)
    x = x * pre.scale
    if pre.mean is not None:
        x = x - np.asarray(pre.mean, dtype=np.float64)
    if pre.std is not None:
        x = x / np.asarray(pre.std, dtype=np.float64)
    if pre.bgr and channels == 3:
        x = x[..., ::-1]
    if c_axis == 0:
        x = x.transpose(2, 0, 1)
    elif c_axis is None:
        x = x[..., 0]
    if batch:
        x = x[None]
    return image_cast(x, info.dtype, name, label)

def channel_axis(spatial: list[Dim], label: str, info: InputInfo, shape: tuple[Dim, ...],
                 pre: Preprocess) -> int:
    """0 for C,H,W and 2 for H,W,C (positions after the batch dim). The declared dims
    decide before --shape's: a --shape 1x3x5x3 for (N,H,W,3) is still NHWC."""
    name = info.name
    if pre.layout is not None:
        return 0 if pre.layout == "nchw" else 2
    declared = info.shape
    candidates = [spatial]
    if declared is not None and len(declared) - len(spatial) in (0, 1):
        candidates.insert(0, list(declared[len(declared) - len(spatial):]))
    for dims in candidates:
        first, last = dims[0] in (1, 3), dims[2] in (1, 3)
        if first != last:
            return 0 if first else 2
        if isinstance(dims[0], int) and not isinstance(dims[2], int):
            return 2
        if isinstance(dims[2], int) and not isinstance(dims[0], int):
            return 0
    if spatial[0] in (1, 3):
        return 0
    raise InputError(f"{label}: cannot tell whether input '{name}' "
                     f"{fmt_shape(shape or ())} is NCHW or NHWC; "
                     "pass --layout nchw or --layout nhwc")
