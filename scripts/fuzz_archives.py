"""Fuzz verify's readers with mutated archives and dump manifests, in this process.

Usage:
    python scripts/fuzz_archives.py                       # 2,000 archive mutants, 200 manifests
    python scripts/fuzz_archives.py --archives 300 --manifests 100 --seconds 50 --seed 1
    python scripts/fuzz_archives.py --local-every 25      # also a real local run every 25th
    python scripts/fuzz_archives.py --local-layers        # ... and of every mutant changed
                                                          # only in its per-layer references

Each archive mutant (bit flips, overwritten or zeroed bytes, truncation, and edits made through
h5py: an attribute, a name, a value, a dataset removed or added, or replaced by a soft link, an
external link or storage in a raw file beside it) goes through `verify inspect`
and `verify run` (on an ssh device on a closed port: reaching the device is exit 3, so a
mutant that got past the archive checks shows; with --local-every / --local-layers, also a
real local run). A mutant whose stored content changed (read back raw with h5py, compared with
the original) must never reach a verdict (exit 0 or 1) — a local run included, whose per-layer
references are checked in the background while the device works — nor the device with
content run reads changed; a dataset stored elsewhere is refused (exit 2) even where the values
read through it are unchanged; no mutant may end in exit 4 (a bug).
Dump manifest mutants go through `verify diff`. Prints counts as JSON; exit 1 when a rule broke.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import hashlib
import io
import json
import random
import shutil
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from verify.cli import main  # noqa: E402

HANG_SECONDS = 60  # one mutant's inspect and runs, at most
CLOSED_PORT_DEVICE = "ssh:fuzz@127.0.0.1:1"  # refused at once: exit 3 if the device is reached


def logical(path: Path, layers: bool = True) -> str | None:
    """A digest of everything h5py reads from `path` (attributes, types, shapes, values), or
    None when it cannot be read: equal digests mean the stored content did not change. With
    `layers` False, the values of per-layer references are left out (what `run` reads)."""
    h = hashlib.sha256()
    try:
        with warnings.catch_warnings(), h5py.File(path, "r") as f:
            warnings.simplefilter("ignore")

            def visit(name: str, obj: Any) -> None:
                h.update(f"{name}|{type(obj).__name__}|".encode())
                for key in sorted(obj.attrs.keys()):
                    if obj.attrs.get_id(key).dtype.kind == "O":  # the bases hold none:
                        raise ValueError("variable-length")  # and reading one may hang
                    h.update(f"{key}={obj.attrs[key]!r}|".encode())
                if isinstance(obj, h5py.Dataset):
                    if obj.dtype.kind == "O":
                        raise ValueError("variable-length")
                    if layers or "/layers/" not in name:
                        h.update(f"{obj.dtype.str}|{obj.shape}|".encode())
                        h.update(np.ascontiguousarray(obj[()]).tobytes())

            def walk(name: str, obj: Any) -> None:  # by name, as verify reads (no visit)
                visit(name, obj)
                if isinstance(obj, h5py.Group):
                    for key in sorted(obj.keys()):
                        walk(f"{name}/{key}", obj[key])

            walk("", f)
    except Exception:  # noqa: BLE001 (whatever h5py raises: unreadable)
        return None
    return h.hexdigest()


def tail(err: str, lines: int = 1) -> str:
    """The last `lines` lines of stderr (a traceback's last frames for an exit 4)."""
    return " | ".join(ln.strip() for ln in err.strip().splitlines()[-lines:])


def run_cli(args: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(args)
    return code, err.getvalue()


# --- archive mutations ------------------------------------------------------------------------
def byte_mutation(data: bytearray, rng: random.Random) -> str:
    kind = rng.choice(["flip", "flip", "flips", "byte", "zero", "truncate"])
    n = len(data)
    if kind == "flip":
        i = rng.randrange(n)
        data[i] ^= 1 << rng.randrange(8)
    elif kind == "flips":
        for _ in range(rng.randint(2, 16)):
            i = rng.randrange(n)
            data[i] ^= 1 << rng.randrange(8)
    elif kind == "byte":
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(n)] = rng.randrange(256)
    elif kind == "zero":
        i = rng.randrange(n)
        end = min(n, i + rng.randint(1, 512))
        data[i:end] = bytes(end - i)
    else:
        del data[rng.randrange(8, n):]
    return kind


def h5_mutation(path: Path, base: Path, rng: random.Random) -> str:
    with warnings.catch_warnings(), h5py.File(path, "r+") as f:
        warnings.simplefilter("ignore")
        datasets = _datasets(f)
        kind = rng.choice(["root_attr", "name", "value", "delete", "add_case", "retype",
                           "json_type", "empty_case", *ELSEWHERE])
        if kind == "root_attr":
            key = rng.choice(list(f.attrs.keys()))
            f.attrs[key] = rng.choice([0, -1, 3, "x", "{}", "[]", "null", b"\xff", 1.5])
        elif kind == "json_type":
            key = rng.choice(["provenance", "tolerances", "tensor_order"])
            f.attrs[key] = rng.choice(['[1]', '{"*": 5}', '[{"index": "a"}]', '"s"', '1e999',
                                       '{"rule": {"k": "nan"}}', '[[]]'])
        elif kind == "name":
            ds = f[rng.choice(datasets)]
            ds.attrs["name"] = rng.choice(["", "x\ny", "../a", "data", "prob", "0"])
        elif kind == "value":
            ds = f[rng.choice(datasets)]
            if ds.size:
                flat = np.array(ds[()]).reshape(-1)
                flat[rng.randrange(flat.size)] = rng.choice([0, 1, 255]) if flat.dtype.kind in "biu" else rng.choice([0.0, 1e30, float("nan")])
                ds[...] = flat.reshape(ds.shape)
        elif kind == "delete":
            del f[rng.choice(datasets)]
        elif kind == "add_case":
            n = len(f["cases"])
            f.create_group(f"cases/{n}")
        elif kind in ELSEWHERE:
            elsewhere(f, path, base, datasets, kind, rng)
        elif kind == "empty_case":
            n = len(f["cases"])
            g = f.create_group(f"cases/{n}")
            g.create_group("inputs")
            g.create_group("outputs")
        else:
            name = rng.choice(datasets)
            ds = f[name]
            attrs = dict(ds.attrs)
            value = np.array(ds[()])
            del f[name]
            new = f.create_dataset(name, data=value.astype(rng.choice(["int64", "float64", "uint8"])))
            for k, v in attrs.items():
                new.attrs[k] = v
    return "h5:" + kind


# a dataset whose bytes HDF5 would take from somewhere other than the archive's own objects:
# every one must be refused (exit 2), even where what h5py reads through it is unchanged
ELSEWHERE = ("soft_link", "external_link", "external_storage")


def elsewhere(f: h5py.File, path: Path, base: Path, datasets: list[str], kind: str,
              rng: random.Random) -> None:
    """Replace one of `datasets` of the open archive `f` (at `path`, a mutant of the unchanged
    archive `base` beside it) by a soft link to another of them, an external link to the same
    dataset in `base`, or a dataset of the same values whose storage is a raw file beside it
    (an array: HDF5 keeps a scalar's bytes in the file whatever storage is asked for)."""
    if kind == "soft_link":
        name = rng.choice(datasets)
        del f[name]
        f[name] = h5py.SoftLink("/" + rng.choice([n for n in datasets if n != name]))
    elif kind == "external_link":
        name = rng.choice(datasets)
        del f[name]
        f[name] = h5py.ExternalLink(base.name, name)
    else:  # the same bytes, which HDF5 then reads from the raw file
        name = rng.choice([n for n in datasets if f[n].shape])
        value, attrs = np.array(f[name][()]), dict(f[name].attrs)
        del f[name]
        raw = path.with_name("elsewhere.bin")
        raw.write_bytes(np.ascontiguousarray(value).tobytes())
        ds = f.create_dataset(name, shape=value.shape, dtype=value.dtype,
                              external=[(str(raw), 0, value.nbytes or 1)])
        ds.attrs.update(attrs)


def _datasets(f: h5py.File) -> list[str]:
    names: list[str] = []
    f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    return names


def build_bases(folder: Path) -> list[Path]:
    from verify.inputs import Preprocess
    from verify.pack import PackOptions, pack

    models = ROOT / "goldens" / "models"
    bases = []
    for name, layers in (("cnn", True), ("two_io", False), ("int_bool", False)):
        path = folder / f"{name}.vtc"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pack(models / f"{name}.onnx", path, PackOptions(seed=3, layers=layers,
                                                           pre=Preprocess()))
        bases.append(path)
    return bases


def fuzz_archives(work: Path, count: int, deadline: float, seed: int,
                  local_every: int, keep: Path | None = None,
                  local_layers: bool = False) -> dict[str, Any]:
    rng = random.Random(seed)
    bases = build_bases(work)
    originals = {b: (b.read_bytes(), logical(b), logical(b, layers=False)) for b in bases}
    stats: Counter[str] = Counter()
    problems: list[str] = []
    mutant = work / "mutant.vtc"
    done = 0
    for done in range(count):
        if time.monotonic() > deadline:
            break
        # a mutant that hangs the process (the HDF5 library looping on a damaged file) ends
        # it with every thread's stack, instead of a run that never finishes
        faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
        base = rng.choice(bases)
        data, original, original_used = originals[base]
        if rng.random() < 0.75:
            buf = bytearray(data)
            kind = byte_mutation(buf, rng)
            mutant.write_bytes(bytes(buf))
        else:
            mutant.write_bytes(data)
            try:
                kind = h5_mutation(mutant, base, rng)
            except Exception:  # noqa: BLE001 (an edit h5py refuses: try another)
                continue
        changed = logical(mutant) != original
        # what run reads changed (run checks what it reads; inspect checks all of it)
        used_changed = changed and logical(mutant, layers=False) != original_used
        stats[f"mutants {'changed' if changed else 'unchanged'}"] += 1
        if kind.removeprefix("h5:") in ELSEWHERE:
            stats["mutants stored elsewhere"] += 1
        if changed and not used_changed:
            stats["mutants changed in per-layer values only"] += 1
        runs = [("inspect", ["inspect", str(mutant)]),
                ("run", ["run", str(mutant), "--device", CLOSED_PORT_DEVICE, "--iter", "1",
                         "--warmup", "0"])]
        layers_only = changed and not used_changed
        if (local_every and done % local_every == 0) or (local_layers and layers_only):
            runs.append(("local run", ["run", str(mutant), "--iter", "1", "--warmup", "0"]))
            if layers_only:
                stats["local runs on per-layer-only changes"] += 1
        for what, args in runs:
            code, err = run_cli(args)
            if keep is not None and (code == 4 or (changed and code in (0, 1, 3))):
                keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(mutant, keep / f"{done}-{what.replace(' ', '_')}-{code}.vtc")
            stats[f"{what} exit {code}"] += 1
            last = tail(err)
            if code == 4:
                problems.append(f"{kind} on {base.name}: {what} exit 4: {tail(err, 5)}")
            elif kind.removeprefix("h5:") in ELSEWHERE and code != 2:
                problems.append(f"{kind} on {base.name}: {what} exit {code}, not refused: "
                                f"{last}")
            elif (used_changed if what == "run" else changed) and code in (0, 1):
                # a local run gets to its verdict: the per-layer references it does not read
                # are checked in the background meanwhile, so any changed byte is exit 2
                problems.append(f"{kind} on {base.name}: {what} gave a verdict (exit {code}) "
                                "on changed content")
            elif used_changed and code == 3 and what == "run":
                problems.append(f"{kind} on {base.name}: run reached the device on changed "
                                f"content: {last}")
    faulthandler.cancel_dump_traceback_later()
    return {"archives": done + 1 if count else 0, "counts": dict(sorted(stats.items())),
            "problems": problems}


# --- dump manifest mutations ------------------------------------------------------------------
def mutate_json(doc: Any, rng: random.Random) -> Any:
    """One random edit somewhere in `doc`: a value's type changed, a key dropped, a list emptied."""
    paths: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                paths.append((node, k))
                walk(v)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                paths.append((node, i))
                walk(v)

    walk(doc)
    if not paths:
        return rng.choice([[], None, 1, "x"])
    parent, key = rng.choice(paths)
    action = rng.choice(["type", "type", "drop", "huge", "negative", "string"])
    if action == "drop" and isinstance(parent, dict):
        del parent[key]
    elif action == "huge":
        parent[key] = 10 ** 30
    elif action == "negative":
        parent[key] = -1
    elif action == "string":
        parent[key] = "../../etc/passwd"
    else:
        parent[key] = rng.choice([None, 1, 1.5, "x", [], {}, True, [1, "a"], {"a": 1}])
    return doc


def make_dump(work: Path) -> Path:
    archive = work / "dumpsrc.vtc"
    from verify.pack import PackOptions, pack

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pack(ROOT / "goldens" / "models" / "two_io.onnx", archive, PackOptions(seed=1))
    dump = work / "dump"
    code, err = run_cli(["run", str(archive), "--iter", "1", "--warmup", "0",
                         "--bin-io-dump", str(dump)])
    if code != 0:
        raise SystemExit(f"could not make the dump to mutate: exit {code}: {err}")
    return dump


def fuzz_manifests(work: Path, count: int, deadline: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed + 1)
    dump = make_dump(work)
    manifest = json.loads((dump / "manifest.json").read_text(encoding="utf-8"))
    mutant = work / "mutant-dump"
    stats: Counter[str] = Counter()
    problems: list[str] = []
    done = 0
    for done in range(count):
        if time.monotonic() > deadline:
            break
        shutil.rmtree(mutant, ignore_errors=True)
        shutil.copytree(dump, mutant)
        doc = mutate_json(json.loads(json.dumps(manifest)), rng)
        (mutant / "manifest.json").write_text(json.dumps(doc), encoding="utf-8")
        code, err = run_cli(["diff", str(dump), str(mutant)])
        stats[f"diff exit {code}"] += 1
        if code == 4:
            problems.append(f"manifest mutant {done}: diff exit 4: {tail(err, 5)}")
    return {"manifests": done + 1 if count else 0, "counts": dict(sorted(stats.items())),
            "problems": problems}


def fuzz(archives: int, manifests: int, seconds: float, seed: int,
         local_every: int = 0, keep: Path | None = None,
         local_layers: bool = False) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    with tempfile.TemporaryDirectory(prefix="verify-fuzz-") as tmp:
        work = Path(tmp)
        a = fuzz_archives(work, archives, deadline - seconds * 0.2 * bool(manifests), seed,
                          local_every, keep, local_layers)
        m = fuzz_manifests(work, manifests, deadline, seed)
    return {"seed": seed, "archive": a, "manifest": m,
            "problems": a["problems"] + m["problems"]}


def main_() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archives", type=int, default=2000)
    parser.add_argument("--manifests", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=3600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--local-every", type=int, default=0,
                        help="also run every Nth archive mutant on the local device (slow)")
    parser.add_argument("--local-layers", action="store_true",
                        help="also run on the local device every mutant changed only in its "
                             "per-layer references (those no closed-port run can judge)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="copy the mutants that broke a rule (or reached a device) here")
    args = parser.parse_args()
    result = fuzz(args.archives, args.manifests, args.seconds, args.seed, args.local_every,
                  args.keep, args.local_layers)
    print(json.dumps(result, indent=1))
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main_())
