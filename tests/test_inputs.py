"""verify.inputs: -d specs into named arrays. Tiny models are built inline, images with Pillow."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from verify.datafiles import load_array_file
from verify.errors import EXIT_USAGE, InputError
from verify.inputs import InputInfo, Preprocess, build_cases, model_inputs, parse_shape_option

F32, I64 = np.dtype(np.float32), np.dtype(np.int64)


def make_model(*inputs: tuple[str, int, list | None], initializers: tuple = ()) -> onnx.ModelProto:
    """A model whose graph inputs are `inputs`; each is passed through an Identity."""
    vis = [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs]
    outs = [helper.make_tensor_value_info(f"out{i}", t, None) for i, (_, t, _) in enumerate(inputs)]
    nodes = [helper.make_node("Identity", [n], [f"out{i}"]) for i, (n, _, _) in enumerate(inputs)]
    graph = helper.make_graph(nodes, "g", vis, outs, initializer=list(initializers))
    return helper.make_model(graph, ir_version=13, opset_imports=[helper.make_opsetid("", 17)])


def infos(*inputs: tuple[str, int, list | None]) -> list[InputInfo]:
    return model_inputs(make_model(*inputs))


def error(fn, *args, **kwargs) -> str:
    with pytest.raises(InputError) as e:
        fn(*args, **kwargs)
    assert e.value.exit_code == EXIT_USAGE
    return str(e.value)


def save_image(path: Path, size: tuple[int, int], mode: str = "RGB",
               pixels: dict[tuple[int, int], object] | None = None) -> Path:
    img = Image.new(mode, size)
    for xy, value in (pixels or {}).items():
        img.putpixel(xy, value)
    img.save(path)
    return path


NCHW = ("data", TensorProto.FLOAT, [1, 3, 2, 4])
NHWC = ("data", TensorProto.FLOAT, [1, 2, 4, 3])


# --- model_inputs -----------------------------------------------------------------------------
def test_model_inputs_skips_initializers_and_reads_dims():
    w = numpy_helper.from_array(np.ones(2, np.float32), "w")
    model = make_model(("x", TensorProto.FLOAT, ["N", 3, None]), ("w", TensorProto.FLOAT, [2]),
                       ("ids", TensorProto.INT64, None), initializers=(w,))
    assert model_inputs(model) == [InputInfo("x", ("N", 3, None), F32),
                                   InputInfo("ids", None, I64)]


# --- .npy ---------------------------------------------------------------------------------------
def test_npy_named_and_bare(tmp_path):
    arr = np.arange(12, dtype=np.float32).reshape(1, 3, 2, 2)
    np.save(tmp_path / "x.npy", arr)
    ins = infos(("x", TensorProto.FLOAT, [1, 3, 2, 2]))
    for spec in ("x:x.npy", "x.npy", str(tmp_path / "x.npy")):
        [case] = build_cases(ins, [spec], base_dir=tmp_path)
        np.testing.assert_array_equal(case["x"], arr)
        assert case["x"].dtype == np.float32


def test_relative_paths_resolve_against_cwd(tmp_path, monkeypatch):
    np.save(tmp_path / "x.npy", np.ones(2, np.float32))
    monkeypatch.chdir(tmp_path)
    [case] = build_cases(infos(("x", TensorProto.FLOAT, [2])), ["x.npy"])
    np.testing.assert_array_equal(case["x"], [1, 1])


def test_pickled_npy_is_refused(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with open(tmp_path / "raw.npy", "wb") as f:
        pickle.dump({"a": 1}, f)
    ins = infos(("x", TensorProto.FLOAT, [2]))
    for name in ("obj.npy", "raw.npy"):
        assert error(build_cases, ins, [f"x:{name}"], base_dir=tmp_path) == (
            f"{name}: holds pickled Python objects, which verify never loads; save a numeric "
            "array instead: np.save(path, arr.astype(np.float32))")
        assert error(load_array_file, tmp_path / name, "x").startswith(f"{tmp_path / name}: holds pickled")


def test_truncated_and_empty_npy(tmp_path):
    np.save(tmp_path / "full.npy", np.ones((10, 10)))
    data = (tmp_path / "full.npy").read_bytes()
    (tmp_path / "cut.npy").write_bytes(data[:300])
    (tmp_path / "empty.npy").write_bytes(b"")
    ins = infos(("x", TensorProto.DOUBLE, [10, 10]))
    assert error(build_cases, ins, ["cut.npy"], base_dir=tmp_path) == (
        "cut.npy: truncated or corrupt .npy file (Failed to read all data for array. Expected "
        "(10, 10) = 100 elements, could only read 21 elements. (file seems not fully written?)); "
        "save it again with np.save")
    assert error(build_cases, ins, ["empty.npy"], base_dir=tmp_path) == (
        "empty.npy: truncated or corrupt .npy file (No data left in file); save it again with np.save")


def test_a_mangled_or_oversized_npy_header_is_one_line(tmp_path):
    np.save(tmp_path / "full.npy", np.ones((3, 4), np.float32))
    data = bytearray((tmp_path / "full.npy").read_bytes())
    mangled = bytearray(data)
    mangled[10:20] = b"xxxxxxxxxx"  # numpy's tokenizer raises its own error, not ValueError
    (tmp_path / "mangled.npy").write_bytes(bytes(mangled))
    huge = bytearray(data)
    huge[8:10] = (65535).to_bytes(2, "little")  # refused in three lines naming allow_pickle
    (tmp_path / "huge.npy").write_bytes(bytes(huge) + b" " * 70000)
    ins = infos(("x", TensorProto.FLOAT, [3, 4]))
    assert error(build_cases, ins, ["mangled.npy"], base_dir=tmp_path) == (
        "mangled.npy: truncated or corrupt .npy file (('EOF in multi-line statement', (2, 0))); "
        "save it again with np.save")
    assert error(build_cases, ins, ["huge.npy"], base_dir=tmp_path) == (
        "huge.npy: truncated or corrupt .npy file (Header info length (65535) is large and may "
        "not be safe to load securely.); save it again with np.save")


def _npy_with_header(header: str) -> bytes:
    """An .npy 1.0 file of just `header` (padded as numpy pads it) and no data."""
    text = header.encode("latin1")
    text += b" " * (64 - (10 + len(text) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text


def test_hostile_npy_and_npz_files_are_one_line(tmp_path):
    """Headers that overflow, that would allocate terabytes before reading, a text file named
    .npy (numpy calls it "pickled"), and a compressed .npz whose deflate stream is damaged."""
    (tmp_path / "bigint.npy").write_bytes(_npy_with_header(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (9999999999999999999999,), }"))
    (tmp_path / "tib.npy").write_bytes(_npy_with_header(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }"))
    (tmp_path / "text.npy").write_text("1 2 3\n")
    np.savez_compressed(tmp_path / "c.npz", x=np.arange(10000, dtype=np.float32))
    data = bytearray((tmp_path / "c.npz").read_bytes())
    data[200:250] = bytes(50)
    (tmp_path / "bad.npz").write_bytes(bytes(data))
    ins = infos(("x", TensorProto.FLOAT, [2]))
    assert error(build_cases, ins, ["bigint.npy"], base_dir=tmp_path).startswith(
        "bigint.npy: truncated or corrupt .npy file (")
    assert error(build_cases, ins, ["tib.npy"], base_dir=tmp_path) == (
        "tib.npy: truncated or corrupt .npy file (Unable to allocate 4.00 TiB for an array with "
        "shape (1099511627776,) and data type float32); save it again with np.save")
    assert error(build_cases, ins, ["text.npy"], base_dir=tmp_path) == (
        "text.npy: not an .npy file (it does not start with numpy's magic); save it with np.save")
    assert error(build_cases, ins, ["bad.npz"], base_dir=tmp_path).startswith(
        "bad.npz: truncated or corrupt .npz file (")


def test_a_polygraphy_array_that_is_a_damaged_or_empty_npz_is_one_line(tmp_path):
    import base64
    import io
    import json

    from verify.errors import InputError
    from verify.foreign import read_polygraphy

    def feed(raw: bytes) -> Path:
        path = tmp_path / "feed.json"
        path.write_text(json.dumps([{"x": {"array": base64.b64encode(raw).decode(),
                                           "polygraphy_class": "ndarray"}}]))
        return path

    empty = io.BytesIO()
    np.savez(empty)
    mangled = io.BytesIO()
    np.savez(mangled, x=np.ones(3, np.float32))
    raw = bytearray(mangled.getvalue())
    at = raw.index(b"{'descr'")
    raw[at:at + 10] = b"xxxxxxxxxx"
    for data in (empty.getvalue(), bytes(raw)):
        with pytest.raises(InputError, match="a Polygraphy array that is not a valid .npy"):
            read_polygraphy(feed(data), "feed.json")


def test_missing_file_directory_and_unknown_type(tmp_path):
    ins = infos(("x", TensorProto.FLOAT, [2]))
    assert error(build_cases, ins, ["x:nope.npy"], base_dir=tmp_path) == (
        f"nope.npy: no such file (looked for {tmp_path / 'nope.npy'})")
    (tmp_path / "d.npy").mkdir()
    assert error(build_cases, ins, ["d.npy"], base_dir=tmp_path).startswith(
        "d.npy: is a directory, not a data file (a folder given to -d is onnx_test_runner")
    (tmp_path / "a.txt").write_text("1 2")
    assert error(build_cases, ins, ["a.txt"], base_dir=tmp_path) == (
        "a.txt: unsupported file type '.txt'; use .npy, .npz, .json, .pb or an image "
        "(.png .jpg .jpeg .bmp .ppm .pgm, or any other format Pillow reads)")


# --- .npz ---------------------------------------------------------------------------------------
def test_npz_matches_arrays_by_name(tmp_path):
    ins = infos(("a", TensorProto.FLOAT, [2]), ("b", TensorProto.INT64, [1]))
    np.savez(tmp_path / "ab.npz", a=np.array([1, 2], np.float32), b=np.array([7]))
    [case] = build_cases(ins, ["ab.npz"], base_dir=tmp_path)
    np.testing.assert_array_equal(case["a"], [1, 2])
    np.testing.assert_array_equal(case["b"], [7])
    [case] = build_cases(ins, ["b:ab.npz"], base_dir=tmp_path)
    np.testing.assert_array_equal(case["b"], [7])
    assert case["a"].shape == (2,)  # filled randomly


def test_npz_unknown_names_and_missing_name(tmp_path):
    ins = infos(("a", TensorProto.FLOAT, [2]), ("b", TensorProto.FLOAT, [2]))
    np.savez(tmp_path / "z.npz", a=np.ones(2), c=np.ones(2), d=np.ones(2))
    assert error(build_cases, ins, ["z.npz"], base_dir=tmp_path) == (
        "z.npz: arrays 'c', 'd' match no input; the model's inputs are 'a', 'b'")
    assert error(build_cases, ins, ["b:z.npz"], base_dir=tmp_path) == (
        "z.npz: has no array named 'b' (it holds 'a', 'c', 'd')")


def test_npz_lone_array_fits_one_input(tmp_path):
    np.savez(tmp_path / "one.npz", np.arange(3, dtype=np.float32))  # stored as arr_0
    [case] = build_cases(infos(("x", TensorProto.FLOAT, [3])), ["one.npz"], base_dir=tmp_path)
    np.testing.assert_array_equal(case["x"], [0, 1, 2])


def test_npz_pickled_and_corrupt(tmp_path):
    np.savez(tmp_path / "obj.npz", x=np.array([None], dtype=object))
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 not really a zip")
    ins = infos(("x", TensorProto.FLOAT, [1]))
    assert error(build_cases, ins, ["obj.npz"], base_dir=tmp_path).startswith(
        "obj.npz: holds pickled Python objects, which verify never loads")
    assert error(build_cases, ins, ["bad.npz"], base_dir=tmp_path).startswith(
        "bad.npz: truncated or corrupt .npz file (")


# --- .json and literals -------------------------------------------------------------------------
def test_json_lists_and_objects(tmp_path):
    ins = infos(("a", TensorProto.FLOAT, [2, 2]), ("b", TensorProto.INT32, []))
    (tmp_path / "a.json").write_text("[[1, 2], [3, 4.5]]")
    (tmp_path / "ab.json").write_text(json.dumps({"a": [[0, 0], [0, 1]], "b": 5}))
    [case] = build_cases(ins, ["a:a.json"], base_dir=tmp_path)
    np.testing.assert_array_equal(case["a"], [[1, 2], [3, 4.5]])
    [case] = build_cases(ins, ["ab.json"], base_dir=tmp_path)
    assert case["b"].dtype == np.int32 and case["b"].shape == () and case["b"] == 5
    [case] = build_cases(ins, ["a:ab.json"], base_dir=tmp_path)  # the object's key 'a'
    np.testing.assert_array_equal(case["a"], [[0, 0], [0, 1]])


def test_json_errors(tmp_path):
    ins = infos(("x", TensorProto.FLOAT, [2]))
    (tmp_path / "bad.json").write_text("[1, 2")
    (tmp_path / "ragged.json").write_text("[[1, 2], [3]]")
    (tmp_path / "text.json").write_text('["a", "b"]')
    (tmp_path / "null.json").write_text("[1, null]")
    assert error(build_cases, ins, ["bad.json"], base_dir=tmp_path) == (
        "bad.json: invalid JSON (Expecting ',' delimiter: line 1 column 6 (char 5))")
    assert error(build_cases, ins, ["ragged.json"], base_dir=tmp_path) == (
        "ragged.json: not a numeric array (ragged nested lists)")
    assert error(build_cases, ins, ["text.json"], base_dir=tmp_path) == (
        "text.json: input 'x' takes float32, got string values; give numbers")
    assert error(build_cases, ins, ["null.json"], base_dir=tmp_path) == (
        "null.json: not a numeric array (holds null, objects or integers beyond 64 bits)")


def test_literals_named_bare_scalar_bool_and_object():
    ins = infos(("x", TensorProto.FLOAT, [2, 2]))
    for spec in ("x:[[1,2],[3,4]]", "[[1,2],[3,4]]"):
        [case] = build_cases(ins, [spec])
        np.testing.assert_array_equal(case["x"], [[1, 2], [3, 4]])
        assert case["x"].dtype == np.float32
    [case] = build_cases(infos(("s", TensorProto.FLOAT, [])), ["s:3.5"])
    assert case["s"].shape == () and case["s"] == 3.5
    [case] = build_cases(infos(("m", TensorProto.BOOL, [2])), ["m:[true,false]"])
    np.testing.assert_array_equal(case["m"], [True, False])
    two = infos(("a", TensorProto.FLOAT, [1]), ("b", TensorProto.INT64, [1]))
    [case] = build_cases(two, ['{"a": [0.5], "b": [3]}'])
    assert case["a"] == 0.5 and case["b"] == 3 and case["b"].dtype == np.int64
    assert error(build_cases, ins, ["x:[[1,2],[3,4]"]) == (
        "-d 'x:[[1,2],[3,4]': invalid JSON literal (Expecting ',' delimiter: line 1 column 13 (char 12))")
    assert error(build_cases, infos(("s", TensorProto.FLOAT, [1])), ["s:3"]) == (
        "literal '3': input 's' expects (1), got (). Write a literal of that shape.")


# --- .pb (onnx_test_runner's TensorProto files) -------------------------------------------------
def test_pb_tensor_proto(tmp_path):
    ins = infos(("a", TensorProto.FLOAT, [2]), ("b", TensorProto.FLOAT, [2]))
    t = numpy_helper.from_array(np.array([1.5, 2.5], np.float32), "b")
    (tmp_path / "input_1.pb").write_bytes(t.SerializeToString())
    [case] = build_cases(ins, ["input_1.pb"], base_dir=tmp_path)  # matched by the tensor's name
    np.testing.assert_array_equal(case["b"], [1.5, 2.5])
    [case] = build_cases(ins, ["a:input_1.pb"], base_dir=tmp_path)
    np.testing.assert_array_equal(case["a"], [1.5, 2.5])


# --- images -------------------------------------------------------------------------------------
def test_image_nchw_pixel_lands_in_place(tmp_path):
    save_image(tmp_path / "p.png", (4, 2), pixels={(3, 1): (10, 20, 30), (0, 0): (1, 2, 3)})
    [case] = build_cases(infos(NCHW), ["p.png"], base_dir=tmp_path)
    x = case["data"]
    assert x.shape == (1, 3, 2, 4) and x.dtype == np.float32
    np.testing.assert_array_equal(x[0, :, 1, 3], [10, 20, 30])  # (x=3, y=1) -> [c, y=1, x=3]
    np.testing.assert_array_equal(x[0, :, 0, 0], [1, 2, 3])


def test_image_nhwc_pixel_lands_in_place(tmp_path):
    save_image(tmp_path / "p.png", (4, 2), pixels={(3, 1): (10, 20, 30)})
    [case] = build_cases(infos(NHWC), ["p.png"], base_dir=tmp_path)
    x = case["data"]
    assert x.shape == (1, 2, 4, 3)
    np.testing.assert_array_equal(x[0, 1, 3], [10, 20, 30])
    assert x.sum() == 60


def test_image_scale_mean_std_bgr_in_order(tmp_path):
    save_image(tmp_path / "p.png", (4, 2), pixels={(3, 1): (10, 20, 30)})
    pre = Preprocess(scale=0.5, mean=(1.0, 2.0, 3.0), std=(2.0, 4.0, 0.5), bgr=True)
    for shape, pick in ((NCHW, lambda x: x[0, :, 1, 3]), (NHWC, lambda x: x[0, 1, 3])):
        [case] = build_cases(infos(shape), ["p.png"], pre=pre, base_dir=tmp_path)
        # RGB (10,20,30) * 0.5 = (5,10,15); - mean = (4,8,12); / std = (2,2,24); BGR -> (24,2,2)
        np.testing.assert_allclose(pick(case["data"]), [24, 2, 2])


def test_image_resized_bilinear_to_model_size(tmp_path):
    img = Image.new("RGB", (40, 20), (100, 150, 200))
    img.paste((0, 0, 0), (20, 0, 40, 20))  # right half black
    img.save(tmp_path / "big.bmp")
    [case] = build_cases(infos(NCHW), ["big.bmp"], base_dir=tmp_path)
    x = case["data"]
    assert x.shape == (1, 3, 2, 4)
    np.testing.assert_array_equal(x[0, :, :, 0], [[100, 100], [150, 150], [200, 200]])
    np.testing.assert_array_equal(x[0, :, :, 3], 0)


def test_image_formats_ppm_pgm_jpg(tmp_path):
    save_image(tmp_path / "c.ppm", (4, 2), pixels={(1, 1): (9, 8, 7)})
    save_image(tmp_path / "g.pgm", (4, 2), mode="L", pixels={(2, 0): 77})
    Image.new("RGB", (4, 2), (120, 60, 30)).save(tmp_path / "c.jpg", quality=100)
    [case] = build_cases(infos(NCHW), ["c.ppm"], base_dir=tmp_path)
    np.testing.assert_array_equal(case["data"][0, :, 1, 1], [9, 8, 7])
    gray = infos(("g", TensorProto.FLOAT, [1, 1, 2, 4]))
    [case] = build_cases(gray, ["g.pgm"], base_dir=tmp_path)
    assert case["g"][0, 0, 0, 2] == 77 and case["g"].sum() == 77
    [case] = build_cases(infos(NCHW), ["c.jpg"], base_dir=tmp_path)
    np.testing.assert_allclose(case["data"][0, :, 0, 0], [120, 60, 30], atol=4)  # lossy
    [case] = build_cases(gray, ["c.ppm"], base_dir=tmp_path)  # RGB file into 1 channel: L
    assert case["g"].shape == (1, 1, 2, 4)


def test_image_into_uint8_input_and_dynamic_hw(tmp_path):
    save_image(tmp_path / "p.png", (5, 3), pixels={(4, 2): (255, 1, 2)})
    dyn = infos(("q", TensorProto.UINT8, ["N", "H", "W", 3]))
    msg = error(build_cases, dyn, ["p.png"], base_dir=tmp_path)  # never silently its own size
    assert msg == ("p.png: input 'q' (N,H,W,3) has dynamic height or width; the image is 5x3 "
                   "(WxH): pass --shape q:1x3x5x3 to keep that size, or the size the model expects")
    [case] = build_cases(dyn, ["p.png"], shapes=dict([parse_shape_option(msg.split()[-11])]),
                         base_dir=tmp_path)  # the hint, as given, works
    assert case["q"].shape == (1, 3, 5, 3) and case["q"].dtype == np.uint8
    np.testing.assert_array_equal(case["q"][0, 2, 4], [255, 1, 2])
    [case] = build_cases(dyn, ["p.png"], shapes={"q": (1, 6, 10, 3)}, base_dir=tmp_path)
    assert case["q"].shape == (1, 6, 10, 3)  # resized to what --shape says
    # a fixed side the image does not have: the hint keeps the other side and says so
    boxes = infos(("b", TensorProto.FLOAT, ["N", 4]))
    assert error(build_cases, boxes, ["p.png"], base_dir=tmp_path) == (
        "p.png: input 'b' (N,4) has dynamic height or width; the image is 5x3 (WxH): pass "
        "--shape b:3x4 to keep its height (it is resized to the model's fixed width 4), or "
        "the size the model expects")
    assert error(build_cases, infos(("q", TensorProto.UINT8, [1, 3, 3, 5])), ["p.png"],
                 pre=Preprocess(scale=1 / 255), base_dir=tmp_path) == (
        "p.png: input 'q' takes uint8, but the image after --scale/--mean/--std spans [0, 1] "
        "with fractions or out of range; adjust them or feed a float model")


def test_image_into_hw_and_chw_inputs(tmp_path):
    save_image(tmp_path / "p.png", (4, 2), pixels={(3, 1): (30, 30, 30)})
    [case] = build_cases(infos(("g", TensorProto.FLOAT, [2, 4])), ["p.png"], base_dir=tmp_path)
    assert case["g"][1, 3] == 30 and case["g"].sum() == 30  # (H,W): gray, no batch dim
    [case] = build_cases(infos(("c", TensorProto.FLOAT, [2, 4, 3])), ["p.png"], base_dir=tmp_path)
    np.testing.assert_array_equal(case["c"][1, 3], [30, 30, 30])  # (H,W,C)


def test_high_depth_images_keep_their_values_in_every_channel(tmp_path):
    """A 16-bit PNG or a float TIFF into a 3-channel input: converted to RGB it was clipped
    at 255 (16-bit) or truncated to 0 (float), packed without a word."""
    from PIL import Image

    deep = np.array([[0, 1000], [40000, 65535]], np.uint16)
    Image.fromarray(deep).save(tmp_path / "d16.png")
    floats = np.array([[0.25, 0.5], [0.75, 1.5]], np.float32)
    Image.fromarray(floats).save(tmp_path / "f.tif")
    for name, want in (("d16.png", deep.astype(np.float32)), ("f.tif", floats)):
        for spec, at in ((("x", TensorProto.FLOAT, [1, 3, 2, 2]), lambda x: x[0]),
                         (("x", TensorProto.FLOAT, [1, 2, 2, 3]),
                          lambda x: x[0].transpose(2, 0, 1)),
                         (("x", TensorProto.FLOAT, [2, 2]), lambda x: x[None])):
            [case] = build_cases(infos(spec), [name], base_dir=tmp_path)
            for channel in at(case["x"]):
                np.testing.assert_array_equal(channel, want)


def _png16(path: Path, pixels: np.ndarray) -> None:
    """A 16-bit colour PNG (Pillow cannot write one): (H,W,3) RGB or (H,W,4) RGBA."""
    import struct
    import zlib

    h, w, planes = pixels.shape
    rows = pixels.astype(">u2")
    raw = b"".join(b"\0" + rows[i].tobytes() for i in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    colour = {3: 2, 4: 6}[planes]
    path.write_bytes(b"\x89PNG\r\n\x1a\n"
                     + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, colour, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


@pytest.mark.parametrize("planes", [3, 4])
def test_sixteen_bit_colour_images_are_refused_not_cut_to_eight_bits(tmp_path, planes):
    """Pillow decodes a 16-bit RGB(A) PNG at 8 bits per channel: 3000 became 11, packed
    without a word (a 16-bit gray one keeps its values, see above)."""
    pixels = (np.arange(2 * 2 * planes).reshape(2, 2, planes) * 3000).astype(np.uint16)
    _png16(tmp_path / "c16.png", pixels)
    with pytest.raises(InputError, match=r"c16.png: a 16-bit colour image; .* 8 bits .*\.npy"):
        build_cases(infos(("x", TensorProto.FLOAT, [1, 3, 2, 2])), ["c16.png"],
                    base_dir=tmp_path)
    with pytest.raises(InputError, match="16-bit colour"):
        load_array_file(tmp_path / "c16.png", "x")


def test_one_input_given_two_shapes_is_refused():
    """`--shape x:2x3 --shape x:3x3` kept the last without a word."""
    from verify.inputs import parse_shape_options

    assert parse_shape_options(["x:2x3", "y:4", "x:2,3"]) == {"x": (2, 3), "y": (4,)}
    assert error(parse_shape_options, ["x:2x3", "x:3x3"]) == (
        "--shape 'x:3x3': input 'x' already has --shape 2x3; give one shape per input")
    assert error(parse_shape_options, ["2x3", "3x3"]) == (
        "--shape '3x3': the model's input already has --shape 2x3; give one shape per input")


def test_file_named_like_rand(tmp_path):
    np.save(tmp_path / "rand.npy", np.array([5.0], np.float32))
    [case] = build_cases(infos(("x", TensorProto.FLOAT, [1])), ["x:rand.npy"], base_dir=tmp_path)
    assert case["x"][0] == 5


def test_image_layout_override_and_ambiguity(tmp_path):
    save_image(tmp_path / "p.png", (3, 3), pixels={(2, 0): (10, 20, 30)})
    cube = infos(("x", TensorProto.FLOAT, [1, 3, 3, 3]))  # both readings possible: NCHW wins
    [case] = build_cases(cube, ["p.png"], base_dir=tmp_path)
    np.testing.assert_array_equal(case["x"][0, :, 0, 2], [10, 20, 30])
    [case] = build_cases(cube, ["p.png"], pre=Preprocess(layout="nhwc"), base_dir=tmp_path)
    np.testing.assert_array_equal(case["x"][0, 0, 2], [10, 20, 30])
    free = infos(("x", TensorProto.FLOAT, ["N", "A", "B", "C"]))
    assert error(build_cases, free, ["p.png"], base_dir=tmp_path) == (
        "p.png: cannot tell whether input 'x' (N,A,B,C) is NCHW or NHWC; "
        "pass --layout nchw or --layout nhwc")
    [case] = build_cases(free, ["p.png"], pre=Preprocess(layout="nchw"),
                         shapes={"x": (1, 3, 3, 3)}, base_dir=tmp_path)
    assert case["x"].shape == (1, 3, 3, 3)


def test_image_shape_errors(tmp_path):
    save_image(tmp_path / "p.png", (4, 2))
    assert error(build_cases, infos(("x", TensorProto.FLOAT, [1, 4, 2, 5])), ["p.png"],
                 base_dir=tmp_path) == (
        "p.png: cannot tell whether input 'x' (1,4,2,5) is NCHW or NHWC; "
        "pass --layout nchw or --layout nhwc")
    assert error(build_cases, infos(("x", TensorProto.FLOAT, [1, 4, 2, 5])), ["p.png"],
                 pre=Preprocess(layout="nchw"), base_dir=tmp_path) == (
        "p.png: input 'x' (1,4,2,5) has 4 channels; an image gives 1 (gray) or 3 (RGB)")
    assert error(build_cases, infos(("x", TensorProto.FLOAT, [4, 3, 2, 4])), ["p.png"],
                 base_dir=tmp_path) == (
        "p.png: input 'x' expects batch 4, an image gives 1; give a .npy or .npz holding the "
        "whole batch")
    assert error(build_cases, infos(("x", TensorProto.FLOAT, [10])), ["p.png"],
                 base_dir=tmp_path) == (
        "p.png: input 'x' of shape (10) and type float32 cannot take an image; images fit "
        "(N,C,H,W), (N,H,W,C), (C,H,W), (H,W,C) or (H,W) number inputs")
    assert error(build_cases, infos(("x", TensorProto.FLOAT, None)), ["x:p.png"],
                 base_dir=tmp_path) == (
        "p.png: input 'x' declares no shape; pass --shape x:1x3xHxW (or 1xHxWx3) to lay the "
        "image out")
    [case] = build_cases(infos(("x", TensorProto.FLOAT, None)), ["x:p.png"],
                         shapes={"x": (1, 2, 4, 3)}, base_dir=tmp_path)
    assert case["x"].shape == (1, 2, 4, 3)
    assert error(build_cases, infos(("g", TensorProto.FLOAT, [1, 1, 2, 4])), ["p.png"],
                 pre=Preprocess(mean=(1.0, 2.0, 3.0)), base_dir=tmp_path) == (
        "--mean has 3 values but input 'g' has 1 channel")
    # --shape may give a dynamic dim 0 (an empty tensor), but no image fills it (was a traceback)
    dyn = infos(("x", TensorProto.FLOAT, ["N", 3, "H", "W"]))
    assert error(build_cases, dyn, ["p.png"], shapes={"x": (1, 3, 0, 4)}, base_dir=tmp_path) == (
        "p.png: input 'x' (1,3,0,4) has height 0 and width 4; an image needs both > 0 "
        "(set them with --shape)")


def test_undecodable_and_truncated_images(tmp_path):
    (tmp_path / "fake.jpg").write_bytes(b"this is not a jpeg")
    save_image(tmp_path / "full.png", (64, 64))
    img = Image.effect_noise((64, 64), 50).convert("RGB")
    img.save(tmp_path / "full.png")
    (tmp_path / "cut.png").write_bytes((tmp_path / "full.png").read_bytes()[:200])
    ins = infos(("x", TensorProto.FLOAT, [1, 3, 8, 8]))
    assert error(build_cases, ins, ["fake.jpg"], base_dir=tmp_path) == (
        "fake.jpg: cannot decode image (not a format Pillow reads, or the file is not an image)")
    assert error(build_cases, ins, ["cut.png"], base_dir=tmp_path).startswith(
        "cut.png: truncated or corrupt image (")


# --- random data --------------------------------------------------------------------------------
def test_random_is_seeded_reproducible_and_differs_per_case():
    ins = infos(("x", TensorProto.FLOAT, [64]), ("ids", TensorProto.INT64, [64]),
                ("m", TensorProto.BOOL, [64]))
    a = build_cases(ins, ["x:rand", "x:rand"], seed=7)
    b = build_cases(ins, ["x:rand", "x:rand"], seed=7)
    c = build_cases(ins, [], seed=8)
    assert len(a) == 2 and len(c) == 1
    for name in ("x", "ids", "m"):
        np.testing.assert_array_equal(a[0][name], b[0][name])
        np.testing.assert_array_equal(a[1][name], b[1][name])
        assert not np.array_equal(a[0][name], a[1][name])
        assert not np.array_equal(a[0][name], c[0][name])
    assert a[0]["x"].dtype == np.float32 and -1 <= a[0]["x"].min() and a[0]["x"].max() < 1
    assert a[0]["ids"].dtype == np.int64 and set(np.unique(a[0]["ids"])) <= set(range(10))
    assert a[0]["m"].dtype == np.bool_ and a[0]["m"].any() and not a[0]["m"].all()


def test_random_stream_depends_on_name_not_order():
    one = build_cases(infos(("x", TensorProto.FLOAT, [8])), [], seed=3)
    two = build_cases(infos(("y", TensorProto.FLOAT, [8]), ("x", TensorProto.FLOAT, [8])), [], seed=3)
    np.testing.assert_array_equal(one[0]["x"], two[0]["x"])


def test_random_ranges():
    ins = infos(("x", TensorProto.FLOAT, [200]), ("i", TensorProto.INT32, [200]))
    [case] = build_cases(ins, ["x:rand(2,3);i:rand(-5,5)"])
    assert 2 <= case["x"].min() and case["x"].max() < 3
    assert case["i"].dtype == np.int32 and set(np.unique(case["i"])) == set(range(-5, 5))
    assert error(build_cases, ins, ["x:rand(3)"]) == (
        "-d 'x:rand(3)': write rand or rand(LOW,HIGH) with LOW < HIGH, e.g. rand(-1,1)")
    assert error(build_cases, ins, ["x:rand(3,2)"]) == (
        "-d 'x:rand(3,2)': write rand or rand(LOW,HIGH) with LOW < HIGH, e.g. rand(-1,1)")
    assert error(build_cases, infos(("u", TensorProto.UINT8, [2])), ["u:rand(-9,-1)"]) == (
        "input 'u' takes uint8; rand(-9,-1) must hold integers within [0, 255]")
    assert error(build_cases, infos(("i", TensorProto.INT64, [2])), ["i:rand(0.2,0.5)"]) == (
        "input 'i' takes int64; rand(0.2,0.5) must hold integers within "
        "[-9223372036854775808, 9223372036854775807]")
    # a float range past the dtype's largest value drew infinities (then all-Inf ground truth
    # that `run` passed)
    assert error(build_cases, ins, ["x:rand(1e40,1e41)"]) == (
        "input 'x' takes float32; rand(1e+40,1e+41) must lie within [-3.40282e+38, 3.40282e+38]")
    assert error(build_cases, infos(("h", TensorProto.FLOAT16, [2])), ["h:rand(0,7e4)"]) == (
        "input 'h' takes float16; rand(0,70000) must lie within [-65504, 65504]")


def test_string_input_refused():
    """Not carried at all (a .npy of strings needs pickle): refused where the model's inputs
    are read, before any data is, rather than filled from JSON and failing later."""
    assert error(model_inputs, make_model(("s", TensorProto.STRING, [1]))) == (
        "input 's' takes strings; verify feeds numeric and bool tensors only (a .npy file "
        "holds strings only through pickle)")


# --- dynamic dims and --shape -------------------------------------------------------------------
def test_dynamic_dims_need_shape():
    ins = infos(("x", TensorProto.FLOAT, ["N", 4]))
    assert error(build_cases, ins, []) == "input 'x' has dynamic dims ['N', 4]; pass --shape x:1x4"
    assert error(build_cases, infos(("x", TensorProto.FLOAT, [None, 4])), ["x:rand"]) == (
        "input 'x' has dynamic dims ['?', 4]; pass --shape x:1x4")
    assert error(build_cases, infos(("x", TensorProto.FLOAT, None)), []) == (
        "input 'x' declares no shape; pass --shape x:DIMS, e.g. x:1x16")
    [case] = build_cases(ins, [], shapes=dict([parse_shape_option("x:3x4")]))
    assert case["x"].shape == (3, 4)
    [case] = build_cases(ins, [], shapes=dict([parse_shape_option("2,4")]))  # bare: the only input
    assert case["x"].shape == (2, 4)
    [case] = build_cases(ins, ["x:[[1,2,3,4],[5,6,7,8]]"])  # a given array sets dynamic dims
    assert case["x"].shape == (2, 4)
    [case] = build_cases(infos(("x", TensorProto.FLOAT, None)), ["x:[[[1]]]"])
    assert case["x"].shape == (1, 1, 1)


def test_parse_shape_option():
    assert parse_shape_option("data:1x3x224x224") == ("data", (1, 3, 224, 224))
    assert parse_shape_option("data:1,3,224,224") == ("data", (1, 3, 224, 224))
    assert parse_shape_option("input:0:2x5") == ("input:0", (2, 5))
    assert parse_shape_option("7") == ("", (7,))
    for bad in ("x:1xAx3", "x:", "x:-1x3", "x:1x"):
        assert error(parse_shape_option, bad) == (
            f"--shape {bad!r}: write NAME:1x3x224x224 (or NAME:1,3,224,224) with non-negative "
            "integer dims")


def test_shape_option_errors():
    ins = infos(("x", TensorProto.FLOAT, ["N", 4]), ("y", TensorProto.FLOAT, [2]))
    assert error(build_cases, ins, [], shapes={"z": (1, 4)}) == (
        "--shape z:1x4: no input named 'z'; the model's inputs are 'x', 'y'")
    assert error(build_cases, ins, [], shapes={"": (1, 4)}) == (
        "--shape 1x4: names no input; the model's inputs are 'x', 'y'")
    assert error(build_cases, ins, [], shapes={"x": (1, 4, 5)}) == (
        "--shape x:1x4x5 gives 3 dims but input 'x' has 2: (N,4)")
    assert error(build_cases, ins, [], shapes={"x": (1, 5)}) == (
        "--shape x:1x5 conflicts with input 'x' declared as (N,4); only dynamic dims can be set")
    assert error(build_cases, ins, ["x:[[1,2,3,4]]"], shapes={"x": (2, 4)}) == (
        "literal '[[1,2,3,4]]': input 'x' expects (2,4), got (1,4). Write a literal of that shape.")


# --- shape and dtype checks of given arrays -----------------------------------------------------
@pytest.mark.parametrize(("got", "hint"), [
    ((1, 224, 224, 3), "It looks transposed; use arr.transpose(0,3,1,2)."),
    ((3, 224, 224), "Add the batch dim: arr[None]."),
    ((1, 1, 3, 224, 224), "Drop the leading dim: arr[0]."),
    ((1, 3, 50176), "Reshape it: arr.reshape(1,3,224,224)."),
    ((1, 3, 112, 112), "Give an array of that shape."),
])
def test_shape_mismatch_messages(tmp_path, got, hint):
    np.save(tmp_path / "a.npy", np.zeros(got, np.float32))
    ins = infos(("data", TensorProto.FLOAT, [1, 3, 224, 224]))
    shown = "(" + ",".join(map(str, got)) + ")"
    assert error(build_cases, ins, ["data:a.npy"], base_dir=tmp_path) == (
        f"a.npy: input 'data' expects (1,3,224,224), got {shown}. {hint}")


def test_dynamic_dims_shown_by_name_in_shape_errors(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((2, 5), np.float32))
    assert error(build_cases, infos(("x", TensorProto.FLOAT, ["N", 4])), ["a.npy"],
                 base_dir=tmp_path) == "a.npy: input 'x' expects (N,4), got (2,5). Give an array of that shape."


def test_dtype_casts_allowed_when_lossless(tmp_path):
    np.save(tmp_path / "f64.npy", np.array([0.1, 2.5]))
    np.save(tmp_path / "i64.npy", np.array([-3, 2**31 - 1]))
    np.save(tmp_path / "i8.npy", np.array([1, 2], np.int8))
    [case] = build_cases(infos(("x", TensorProto.FLOAT, [2])), ["f64.npy"], base_dir=tmp_path)
    assert case["x"].dtype == np.float32 and case["x"][0] == np.float32(0.1)
    [case] = build_cases(infos(("x", TensorProto.INT32, [2])), ["i64.npy"], base_dir=tmp_path)
    assert case["x"].dtype == np.int32 and case["x"][1] == 2**31 - 1
    [case] = build_cases(infos(("x", TensorProto.FLOAT16, [2])), ["i8.npy"], base_dir=tmp_path)
    assert case["x"].dtype == np.float16
    [case] = build_cases(infos(("m", TensorProto.BOOL, [2])), ["m:[1,0]"])
    np.testing.assert_array_equal(case["m"], [True, False])


def test_dtype_errors(tmp_path):
    np.save(tmp_path / "f.npy", np.array([1.0, 2.0], np.float32))
    np.save(tmp_path / "big.npy", np.array([-1, 3_000_000_000]))
    np.save(tmp_path / "huge.npy", np.array([1.0, 1e6]))
    np.save(tmp_path / "odd.npy", np.array([2**24 + 1, 0]))
    assert error(build_cases, infos(("ids", TensorProto.INT64, [2])), ["f.npy"], base_dir=tmp_path) == (
        "f.npy: input 'ids' takes int64, got float32 values; floats are never rounded to integers, "
        "save the array as int64")
    assert error(build_cases, infos(("ids", TensorProto.INT32, [2])), ["big.npy"], base_dir=tmp_path) == (
        "big.npy: input 'ids' takes int32, but the int64 values span [-1, 3000000000]; they do not "
        "fit [-2147483648, 2147483647]")
    assert error(build_cases, infos(("h", TensorProto.FLOAT16, [2])), ["huge.npy"], base_dir=tmp_path) == (
        "huge.npy: input 'h' takes float16, but float64 values up to 1e+06 overflow it")
    assert error(build_cases, infos(("x", TensorProto.FLOAT, [2])), ["odd.npy"], base_dir=tmp_path) == (
        "odd.npy: input 'x' takes float32, but int64 values like 16777217 are not exact in it")
    assert error(build_cases, infos(("m", TensorProto.BOOL, [2])), ["m:[1,2]"]) == (
        "literal '[1,2]': input 'm' takes bool, but int64 values include 2; give 0/1 or true/false")


# --- names, specs and cases ---------------------------------------------------------------------
def test_names_with_colons_match_longest_prefix(tmp_path):
    ins = infos(("input:0", TensorProto.FLOAT, [1]), ("input:0_1", TensorProto.FLOAT, [1]),
                ("in/x", TensorProto.FLOAT, [1]))
    np.save(tmp_path / "a:b.npy", np.array([4.0], np.float32))
    [case] = build_cases(ins, ["input:0:[1]", "input:0_1:[2]", "in/x:a:b.npy"], base_dir=tmp_path)
    assert (case["input:0"][0], case["input:0_1"][0], case["in/x"][0]) == (1, 2, 4)
    nested = infos(("a", TensorProto.FLOAT, [1]), ("a:b", TensorProto.FLOAT, [1]))
    [case] = build_cases(nested, ["a:b:[7]", "a:[8]"])  # 'a:b' is the longer name
    assert (case["a:b"][0], case["a"][0]) == (7, 8)


def test_bare_file_with_colon_and_unknown_names(tmp_path):
    np.save(tmp_path / "run:1.npy", np.array([4.0], np.float32))
    ins = infos(("x", TensorProto.FLOAT, [1]))
    [case] = build_cases(ins, ["run:1.npy"], base_dir=tmp_path)  # not a name, but a file
    assert case["x"][0] == 4
    two = infos(("a", TensorProto.FLOAT, [1]), ("b", TensorProto.FLOAT, [1]))
    assert error(build_cases, two, ["c:x.npy"], base_dir=tmp_path) == (
        "-d 'c:x.npy': no input named 'c' and no file 'c:x.npy'; the model's inputs are 'a', 'b'")


def test_bare_spec_for_multi_input_model(tmp_path):
    np.save(tmp_path / "x.npy", np.ones(1, np.float32))
    two = infos(("a", TensorProto.FLOAT, [1]), ("b", TensorProto.FLOAT, [1]))
    assert error(build_cases, two, ["x.npy"], base_dir=tmp_path) == (
        "-d 'x.npy' names no input and the model has 2 ('a', 'b'); write -d NAME:x.npy")
    assert error(build_cases, two, ["[1]"]) == (
        "-d '[1]' names no input and the model has 2 ('a', 'b'); write -d NAME:[1]")
    assert error(build_cases, two, ["rand"]) == (
        "-d 'rand' names no input and the model has 2 ('a', 'b'); write -d NAME:rand")


def test_empty_and_valueless_specs():
    ins = infos(("x", TensorProto.FLOAT, [1]))
    assert error(build_cases, ins, [""]) == (
        "-d '': empty data spec; give NAME:FILE, FILE, a literal or NAME:rand")
    assert error(build_cases, ins, ["x:"]) == (
        "-d 'x:': no value for input 'x'; write x:FILE, x:LITERAL or x:rand")
    assert error(build_cases, [], ["x.npy"]) == "-d 'x.npy': the model has no inputs"
    assert build_cases([], []) == [{}]


def test_cases_split_when_a_name_repeats(tmp_path):
    ins = infos(("a", TensorProto.FLOAT, [1]), ("b", TensorProto.FLOAT, [1]))
    cases = build_cases(ins, ["a:[1]", "b:[10]", "a:[2]", "b:[20]"])
    assert [(c["a"][0], c["b"][0]) for c in cases] == [(1, 10), (2, 20)]
    cases = build_cases(ins, ["a:[1];b:[10]", "a:[2];b:[20];"])  # ';' inside one -d
    assert [(c["a"][0], c["b"][0]) for c in cases] == [(1, 10), (2, 20)]
    cases = build_cases(ins, ["a:[1]", "a:[2]", "b:[20]"])  # b missing in case 0: random
    assert len(cases) == 2 and cases[1]["b"][0] == 20 and -1 <= cases[0]["b"][0] < 1
    assert list(cases[0]) == ["a", "b"]  # every case complete, in model order


def test_one_input_images_make_one_case_each(tmp_path):
    save_image(tmp_path / "1.png", (4, 2), pixels={(0, 0): (1, 1, 1)})
    save_image(tmp_path / "2.png", (4, 2), pixels={(0, 0): (2, 2, 2)})
    cases = build_cases(infos(NCHW), ["1.png", "2.png"], base_dir=tmp_path)
    assert [c["data"][0, 0, 0, 0] for c in cases] == [1, 2]
    npz = tmp_path / "ab.npz"
    np.savez(npz, a=np.ones(1, np.float32), b=np.zeros(1, np.float32))
    two = infos(("a", TensorProto.FLOAT, [1]), ("b", TensorProto.FLOAT, [1]))
    assert len(build_cases(two, [str(npz), str(npz)])) == 2


def test_preprocess_validation():
    assert error(Preprocess, layout="chw") == "--layout chw: use nchw or nhwc"
    assert error(Preprocess, std=(1.0, 0.0, 1.0)) == "--std 1,0,1: a zero std would divide by zero"
    assert error(Preprocess, mean=()) == "--mean : give finite numbers, e.g. 0.485,0.456,0.406"


# --- load_array_file ----------------------------------------------------------------------------
def test_load_array_file_formats(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(3))
    np.savez(tmp_path / "z.npz", x=np.ones(2), y=np.zeros(2))
    (tmp_path / "j.json").write_text('{"x": [1, 2]}')
    save_image(tmp_path / "p.png", (4, 2), pixels={(3, 1): (10, 20, 30)})
    np.testing.assert_array_equal(load_array_file(tmp_path / "a.npy", "x"), [0, 1, 2])
    np.testing.assert_array_equal(load_array_file(tmp_path / "z.npz", "y"), [0, 0])
    np.testing.assert_array_equal(load_array_file(tmp_path / "j.json", "x"), [1, 2])
    img = load_array_file(tmp_path / "p.png", "x")
    assert img.shape == (2, 4, 3) and img.dtype == np.uint8 and list(img[1, 3]) == [10, 20, 30]
    assert error(load_array_file, tmp_path / "z.npz", "w") == (
        f"{tmp_path / 'z.npz'}: has no array named 'w' (it holds 'x', 'y')")
    assert error(load_array_file, tmp_path / "none.npy", "x") == f"{tmp_path / 'none.npy'}: no such file"


# --- the arrays run as they are -----------------------------------------------------------------
def test_cases_feed_onnxruntime(tmp_path):
    import onnxruntime as ort

    model = make_model(("data", TensorProto.FLOAT, ["N", 3, 2, 4]), ("ids", TensorProto.INT64, [3]),
                       ("m", TensorProto.BOOL, [2]))
    save_image(tmp_path / "p.png", (4, 2), pixels={(3, 1): (10, 20, 30)})
    cases = build_cases(model_inputs(model), ["data:p.png", "ids:[1,2,3]", "data:p.png"], base_dir=tmp_path)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for case in cases:
        outs = sess.run(None, case)
        np.testing.assert_array_equal(outs[0], case["data"])
        assert outs[1].dtype == np.int64 and outs[2].dtype == np.bool_


@pytest.mark.parametrize("suffix", [".json", ".pb", ".npy", ".npz", ".png"])
def test_an_unreadable_data_file_is_one_input_error(tmp_path: Path, suffix: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests run as root, where chmod cannot deny a read: the refusal is injected where each
    reader opens the file (Path.read_bytes, or open() for numpy and Pillow)."""
    import builtins

    f = tmp_path / f"x{suffix}"
    f.write_bytes(b"")

    def denied(*args: object, **kwargs: object) -> object:
        raise PermissionError(13, "Permission denied")

    real_open = builtins.open
    monkeypatch.setattr(Path, "read_bytes", denied)
    monkeypatch.setattr(builtins, "open", lambda file, *a, **k: denied() if str(file) == str(f)
                        else real_open(file, *a, **k))
    with pytest.raises(InputError) as info:
        load_array_file(f, "x")
    assert info.value.exit_code == EXIT_USAGE
    assert str(info.value) == f"{f}: cannot read: Permission denied"
