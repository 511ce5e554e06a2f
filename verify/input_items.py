"""One `-d` item (or `run --input` value) parsed into named arrays for a model's inputs,
each array checked against its input's shape and cast without loss; a case's missing inputs
filled with seeded random data. The grammar (its docstring) and the items accumulated into
cases are `inputs.py`'s."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from verify.datafiles import (check_file, fmt_names, is_image, load_data_file, mapping_arrays,
                              pick, to_array)
from verify.errors import InputError
from verify.input_casts import cast, kind
from verify.input_images import image_input
from verify.input_random import RandomSpec, parse_rand, random_input
from verify.input_shapes import Dim, fmt_shape, shape_fits, shape_hint

if TYPE_CHECKING:
    from verify.inputs import InputInfo, Preprocess


class MissingShapeError(InputError):
    """Random data was asked for an input whose dims nothing fixed (`needed`: each such
    input with its declared dims; `random_ints`: inputs given random integers)."""

    def __init__(self, message: str, needed: Sequence[tuple[str, tuple[Dim, ...]]],
                 random_ints: Sequence[str] = (), head: str | None = None) -> None:
        super().__init__(message)
        self.needed = tuple(needed)
        self.random_ints = list(random_ints)
        self.head = head if head is not None else message.split("; pass", 1)[0]


class ItemParser:
    """The model's inputs as `-d` items see them: `parse_item` reads one item into named
    arrays (or random specs), `conform` checks and casts one array, `complete` fills a case."""

    def __init__(self, inputs: Sequence[InputInfo], shapes: dict[str, tuple[Dim, ...] | None],
                 pre: Preprocess, base_dir: Path) -> None:
        self.infos = {i.name: i for i in inputs}
        self.shapes = shapes
        self.pre = pre
        self.base_dir = base_dir
        # longest first, so `input:0_1` wins over `input:0` and over `input`
        self.names_longest = sorted(self.infos, key=len, reverse=True)

    def listing(self) -> str:
        return fmt_names(self.infos) if self.infos else "(none)"

    def parse_item(self, item: str) -> dict[str, np.ndarray | RandomSpec]:
        if not self.infos:
            raise InputError(f"-d {item!r}: the model has no inputs")
        name = next((n for n in self.names_longest if item.startswith(n + ":")), None)
        if name is not None:
            value = item[len(name) + 1:]
            if not value.strip():
                raise InputError(f"-d {item!r}: no value for input '{name}'; "
                                 f"write {name}:FILE, {name}:LITERAL or {name}:rand")
            return self._parse_value(value, name, item)
        return self._parse_value(item, None, item)

    def _single(self, item: str) -> str:
        if len(self.infos) == 1:
            return next(iter(self.infos))
        raise InputError(f"-d {item!r} names no input and the model has {len(self.infos)} "
                         f"({self.listing()}); write -d NAME:{item}")

    def _parse_value(self, value: str, name: str | None, item: str) -> dict[str, np.ndarray | RandomSpec]:
        literal = _try_literal(value)
        if literal is not _NOT_LITERAL:
            label = f"literal {value.strip()!r}"
            if isinstance(literal, dict):
                return self._assign(mapping_arrays(literal, label), name, label, item)
            target = name or self._single(item)
            return {target: self.conform(to_array(literal, label), target, label)}
        stripped = value.strip()
        if stripped == "rand" or (stripped.startswith("rand(") and stripped.endswith(")")):
            target = name or self._single(item)
            return {target: parse_rand(value, item)}
        path = Path(value).expanduser()
        path = path if path.is_absolute() else self.base_dir / path
        if stripped[:1] in ("[", "{") and not path.exists():
            try:
                json.loads(value)
            except ValueError as e:
                raise InputError(f"-d {item!r}: invalid JSON literal ({e})") from None
        if name is None and ":" in value and not path.exists():
            prefix = value.split(":", 1)[0]
            raise InputError(f"-d {item!r}: no input named '{prefix}' and no file '{value}'; "
                             f"the model's inputs are {self.listing()}")
        check_file(path, value)
        if is_image(path.suffix):
            target = name or self._single(item)
            image = image_input(path, value, self.infos[target], self.shapes[target], self.pre)
            return {target: self.conform(image, target, value)}
        return self._assign(load_data_file(path, value), name, value, item)

    def _assign(self, loaded: np.ndarray | dict[str, np.ndarray], name: str | None,
                label: str, item: str) -> dict[str, np.ndarray | RandomSpec]:
        if name is not None:
            arr = loaded if isinstance(loaded, np.ndarray) else pick(loaded, name, label)
            return {name: self.conform(arr, name, label)}
        if isinstance(loaded, np.ndarray):
            target = self._single(item)
            return {target: self.conform(loaded, target, label)}
        if len(loaded) == 1 and len(self.infos) == 1:
            target = next(iter(self.infos))
            return {target: self.conform(next(iter(loaded.values())), target, label)}
        unknown = [k for k in loaded if k not in self.infos]
        if unknown:
            raise InputError(f"{label}: {_plural(unknown, 'array')} {fmt_names(unknown)} "
                             f"{'matches' if len(unknown) == 1 else 'match'} no input; "
                             f"the model's inputs are {self.listing()}")
        return {k: self.conform(v, k, label) for k, v in loaded.items()}

    # --- shape and dtype ---------------------------------------------------------------------
    def conform(self, arr: np.ndarray, name: str, label: str) -> np.ndarray:
        """Check `arr` against input `name`'s shape; cast it to its dtype without loss."""
        shape = self.shapes[name]
        if shape is not None and not shape_fits(arr.shape, shape):
            hint = ("Write a literal of that shape." if label.startswith("literal ")
                    else shape_hint(arr.shape, shape))
            raise InputError(f"{label}: input '{name}' expects {fmt_shape(shape)}, got "
                             f"{fmt_shape(arr.shape)}. {hint}")
        out = cast(arr, self.infos[name].dtype, name, label)
        # not np.ascontiguousarray: it turns a 0-d scalar into shape (1,)
        return out if out.flags.c_contiguous else out.copy(order="C")

    def complete(self, case: dict[str, np.ndarray | RandomSpec], index: int,
                 seed: int) -> dict[str, np.ndarray]:
        """Fill the inputs the case leaves out (or asks `rand` for). A dim symbol fixed by a
        given array or --shape (`batch` of one input) fixes the same symbol in the others."""
        bound: dict[str, int] = {}
        for name, info in self.infos.items():
            value = case.get(name)
            concrete = value.shape if isinstance(value, np.ndarray) else self.shapes[name]
            for decl, got in zip(info.shape or (), concrete or ()):
                if isinstance(decl, str) and isinstance(got, int):
                    bound.setdefault(decl, got)
        needed, random_ints = [], []
        for name, info in self.infos.items():
            if isinstance(case.get(name, RandomSpec()), RandomSpec):
                shape = self._bound_shape(name, bound)
                if shape is not None and not all(isinstance(d, int) for d in shape):
                    needed.append((name, shape))
                if kind(info.dtype) in "iu":
                    random_ints.append(name)
        if needed:
            name, shape = needed[0]
            dims = "[" + ", ".join(repr(d) if isinstance(d, str) else "'?'" if d is None else str(d)
                                   for d in shape) + "]"
            opts = " ".join(f"--shape {n}:" + "x".join(str(d) if isinstance(d, int) else "1"
                                                       for d in s) for n, s in needed)
            head = f"input '{name}' has dynamic dims {dims}"
            if len(needed) > 1:
                head += f" (and {fmt_names([n for n, _ in needed[1:]])})"
            raise MissingShapeError(f"{head}; pass {opts}", needed, random_ints, head)
        out = {}
        for name, info in self.infos.items():
            value = case.get(name, RandomSpec())
            if isinstance(value, RandomSpec):
                value = random_input(info, self._bound_shape(name, bound), value, index, seed)
            out[name] = value
        return out

    def _bound_shape(self, name: str, bound: Mapping[str, int]) -> tuple[Dim, ...] | None:
        shape, declared = self.shapes[name], self.infos[name].shape
        if shape is None or declared is None:
            return shape
        return tuple(bound.get(dec, dec) if isinstance(dec, str) and not isinstance(d, int)
                     else d for d, dec in zip(shape, declared))


def split_items(raw: str) -> list[str]:
    """Split on ';' outside JSON brackets and strings; drop empty items (a trailing ';')."""
    items, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(raw):
        if ch == '"' and (i == 0 or raw[i - 1] != "\\"):
            quoted = not quoted
        elif not quoted and ch in "[{":
            depth += 1
        elif not quoted and ch in "]}":
            depth -= 1
        elif ch == ";" and depth <= 0 and not quoted:
            items.append(raw[start:i])
            start = i + 1
    items.append(raw[start:])
    return [s.strip() for s in items if s.strip()]


_NOT_LITERAL = object()


def _try_literal(value: str) -> object:
    """A number, bool, list or object in JSON syntax; anything else (a path) is not one."""
    try:
        obj = json.loads(value)
    except ValueError:
        return _NOT_LITERAL
    return _NOT_LITERAL if isinstance(obj, str) or obj is None else obj


def _plural(items: Sequence[object], word: str) -> str:
    return word if len(items) == 1 else word + "s"
