"""Casts of user data into a model's input dtype, at the edges the mutation run of
verify/inputs.py found untested (docs/mutation.md): 4-bit integers (ml_dtypes' ranges), uint64
values float32 cannot hold, no numpy warning on an overflowing cast, images into float and
integer inputs whose range is broken on one side only. Then, against the survivors of the
mutation run of verify/input_casts.py: integer 0/1 data for a bool input, a signaling NaN,
4-bit data read from a .pb, complex data and complex inputs, the value an inexactness message
names, an image past a float16 input's range."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from PIL import Image

from helpers_cli import only_line, verify

from verify.archive_reader import read_archive
from verify.errors import InputError
from verify.inputs import Preprocess, build_cases, model_inputs


def _model(elem: int, shape: list[int], op: str = "Identity") -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", elem, shape)],
                              [helper.make_tensor_value_info("y", elem, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _infos(elem: int, shape: list[int]):  # type: ignore[no-untyped-def]
    return model_inputs(_model(elem, shape))


def _save_model(path: Path, elem: int, shape: list[int], op: str = "Identity") -> Path:
    onnx.save(_model(elem, shape, op), path)
    return path


@pytest.mark.parametrize("elem, lo, hi", [(TensorProto.INT4, -8, 7), (TensorProto.UINT4, 0, 15)])
def test_four_bit_inputs_take_their_range_and_refuse_one_past(tmp_path: Path, elem: int, lo: int,
                                                              hi: int) -> None:
    infos = _infos(elem, [2])
    np.save(tmp_path / "ok.npy", np.array([lo, hi], np.int64))
    [case] = build_cases(infos, ["ok.npy"], base_dir=tmp_path)
    assert case["x"].dtype == onnx.helper.tensor_dtype_to_np_dtype(elem)
    assert [int(v) for v in case["x"].astype(np.int64)] == [lo, hi]
    for past in (lo - 1, hi + 1):
        np.save(tmp_path / "past.npy", np.array([0, past], np.int64))
        with pytest.raises(InputError, match=rf"do not fit \[{lo}, {hi}\]$"):
            build_cases(infos, ["past.npy"], base_dir=tmp_path)


def test_unsigned_values_float32_cannot_hold_are_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "u.npy", np.array([2**24 + 1, 1], np.uint64))
    with pytest.raises(InputError, match="uint64 values like 16777217 are not exact in it$"):
        build_cases(_infos(TensorProto.FLOAT, [2]), ["u.npy"], base_dir=tmp_path)
    np.save(tmp_path / "ok.npy", np.array([2**24, 1], np.uint64))
    [case] = build_cases(_infos(TensorProto.FLOAT, [2]), ["ok.npy"], base_dir=tmp_path)
    assert case["x"].dtype == np.float32 and case["x"][0] == 2**24


def test_an_overflowing_cast_is_one_error_and_no_numpy_warning(tmp_path: Path) -> None:
    np.save(tmp_path / "big.npy", np.array([1e300, np.nan, 1.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning from numpy would raise here
        with pytest.raises(InputError, match="float64 values up to 1e\\+300 overflow it$"):
            build_cases(_infos(TensorProto.FLOAT16, [3]), ["big.npy"], base_dir=tmp_path)


def test_images_into_float_inputs_keep_the_inputs_dtype(tmp_path: Path) -> None:
    Image.new("RGB", (4, 2), (10, 20, 30)).save(tmp_path / "p.png")
    for elem, dt in ((TensorProto.FLOAT, np.float32), (TensorProto.FLOAT16, np.float16)):
        [case] = build_cases(_infos(elem, [1, 3, 2, 4]), ["p.png"], base_dir=tmp_path)
        assert case["x"].dtype == dt and float(case["x"][0, 2, 1, 3]) == 30


@pytest.mark.parametrize("pre, span", [(Preprocess(mean=(11.0,)), "[-1, 19]"),  # below only
                                       (Preprocess(scale=10.0), "[100, 300]")])  # above only
def test_an_image_out_of_an_integer_range_on_one_side_is_refused(tmp_path: Path, pre: Preprocess,
                                                                 span: str) -> None:
    Image.new("RGB", (4, 2), (10, 20, 30)).save(tmp_path / "p.png")
    with pytest.raises(InputError, match=rf"spans \{span[:-1]}\] with fractions or out of range"):
        build_cases(_infos(TensorProto.UINT8, [1, 3, 2, 4]), ["p.png"], pre=pre,
                    base_dir=tmp_path)


@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_integers_past_two_to_the_53_are_checked_exactly(tmp_path: Path, elem: int) -> None:
    # 2**53 + 1 becomes 2**53 in float64: it was taken, silently changed (a mutant moving the
    # one-by-one check's boundary survived; the boundary itself was the bug)
    for value in (2**53 + 1, -(2**53) - 1, 2**60 + 1):
        np.save(tmp_path / "a.npy", np.array([value, 0], np.int64))
        with pytest.raises(InputError, match=f"int64 values like {value} are not exact in it$"):
            build_cases(_infos(elem, [2]), ["a.npy"], base_dir=tmp_path)
    for value in (2**53, 2**60, -(2**53)):  # powers of two are exact in both
        np.save(tmp_path / "a.npy", np.array([value, 0], np.int64))
        [case] = build_cases(_infos(elem, [2]), ["a.npy"], base_dir=tmp_path)
        assert int(case["x"][0]) == value


@pytest.mark.parametrize("elem, largest, past", [
    (TensorProto.BFLOAT16, 3.0e38, 1e39),      # past it: inf
    (TensorProto.FLOAT8E4M3FN, 448.0, 1000.0),  # no inf in this format: past it is NaN
    (TensorProto.FLOAT8E5M2, 57344.0, 1e6),
])
def test_low_precision_float_inputs_take_floats_and_refuse_overflow(tmp_path: Path, elem: int,
                                                                    largest: float,
                                                                    past: float) -> None:
    """bfloat16 and float8 inputs (ml_dtypes' types, numpy kind 'V' for most) are float inputs:
    float data is cast into them, and a value they cannot hold is an error, never an inf or a
    NaN fed to the model (a float8e4m3fn cast turned 1000.0 into NaN silently)."""
    dt = onnx.helper.tensor_dtype_to_np_dtype(elem)
    infos = _infos(elem, [2])
    np.save(tmp_path / "ok.npy", np.array([largest, -1.5], np.float32))
    [case] = build_cases(infos, ["ok.npy"], base_dir=tmp_path)
    assert case["x"].dtype == dt
    assert [float(v) for v in case["x"].astype(np.float64)] == pytest.approx([largest, -1.5],
                                                                            rel=2**-7)
    np.save(tmp_path / "past.npy", np.array([past, 1.0], np.float64))
    with pytest.raises(InputError, match=re.escape(f"takes {dt.name}, but float64 values up to "
                                                   f"{past:g} overflow it") + "$"):
        build_cases(infos, ["past.npy"], base_dir=tmp_path)
    # integers go in where exact (bfloat16 holds 8 significant bits: 256 yes, 257 no)
    if elem == TensorProto.BFLOAT16:
        np.save(tmp_path / "i.npy", np.array([256, -3], np.int32))
        [case] = build_cases(infos, ["i.npy"], base_dir=tmp_path)
        assert [float(v) for v in case["x"].astype(np.float64)] == [256.0, -3.0]
        np.save(tmp_path / "i.npy", np.array([257, -3], np.int32))
        with pytest.raises(InputError, match="int32 values like 257 are not exact in it$"):
            build_cases(infos, ["i.npy"], base_dir=tmp_path)


# --- against the survivors of the input_casts.py mutation run (docs/mutation.md) --------------
def test_zeros_and_ones_feed_a_bool_input_as_bools(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    """A mask saved as integers (np.save of a 0/1 int array, the usual way) goes into a bool
    input as bools, the model runs on it; a 2 in it is named in the one-line error."""
    model = _save_model(tmp_path / "not.onnx", TensorProto.BOOL, [4], op="Not")
    mask = tmp_path / "mask.npy"
    np.save(mask, np.array([0, 1, 1, 0], np.int64))
    code, _, err = verify(capsys, "pack", model, "-d", f"x:{mask}", "-o", tmp_path / "m.vtc")
    assert code == 0, err
    [case] = read_archive(tmp_path / "m.vtc").cases
    assert case.inputs["x"].dtype == np.bool_ and case.inputs["x"].tolist() == [0, 1, 1, 0]
    assert case.outputs["y"].tolist() == [True, False, False, True]
    np.save(mask, np.array([0, 1, 2, 0], np.int64))  # 0 first: the message names the 2
    code, _, err = verify(capsys, "pack", model, "-d", f"x:{mask}", "-o", tmp_path / "n.vtc")
    assert (code, only_line(err)) == (2, f"error: {mask}: input 'x' takes bool, but int64 values "
                                         "include 2; give 0/1 or true/false")


def test_a_signaling_nan_is_cast_without_a_numpy_warning(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    """float64 data holding a signaling NaN (a sentinel bit pattern some C code writes, or an
    uninitialised buffer dumped as is) sets the FPU's invalid flag when cast to float32; verify
    packs it as NaN and prints no numpy "invalid value encountered in cast" warning."""
    data = np.array([0x7FF0000000000001, 0x3FF8000000000000], np.uint64).view(np.float64)
    np.save(tmp_path / "s.npy", data)
    model = _save_model(tmp_path / "id.onnx", TensorProto.FLOAT, [2])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = verify(capsys, "pack", model, "-d", f"x:{tmp_path / 's.npy'}", "-o",
                              tmp_path / "s.vtc")
    assert code == 0, err
    assert [str(w.message) for w in caught] == [] and "warning" not in err
    x = read_archive(tmp_path / "s.vtc").cases[0].inputs["x"]
    assert x.dtype == np.float32 and np.isnan(x[0]) and x[1] == 1.5


@pytest.mark.parametrize("elem, src, dst", [
    (TensorProto.INT8, TensorProto.INT4, np.int8),
    (TensorProto.UINT8, TensorProto.UINT4, np.uint8),
])
def test_four_bit_data_from_a_pb_file_feeds_a_wider_integer_input(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, elem: int, src: int, dst: type) -> None:
    """A 4-bit tensor saved as an ONNX TensorProto (reads back as ml_dtypes' int4/uint4, numpy
    kind 'V') is integer data: it goes into an int8/uint8 input with its values."""
    values = [-8, 7, 0, -1, 3, 5] if src == TensorProto.INT4 else [0, 15, 1, 8, 3, 5]
    tensor = onnx.numpy_helper.from_array(
        np.array(values).astype(onnx.helper.tensor_dtype_to_np_dtype(src)), "x")
    (tmp_path / "x.pb").write_bytes(tensor.SerializeToString())
    model = _save_model(tmp_path / "id.onnx", elem, [6])
    code, _, err = verify(capsys, "pack", model, "-d", tmp_path / "x.pb", "-o", tmp_path / "q.vtc")
    assert code == 0, err
    [case] = read_archive(tmp_path / "q.vtc").cases
    assert case.inputs["x"].dtype == dst and case.inputs["x"].tolist() == values
    assert case.outputs["y"].tolist() == values


def test_complex_data_and_complex_inputs_are_refused_in_one_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Complex numbers are no input verify feeds: complex data for a float input is refused
    (never its imaginary part dropped), and so is any data for a complex input (onnxruntime
    loads no such model, so `pack` stops there first; `build_cases` says it in one line, never a
    traceback from the integer range check)."""
    np.save(tmp_path / "c.npy", np.array([1 + 2j, 3.0]))
    model = _save_model(tmp_path / "id.onnx", TensorProto.FLOAT, [2])
    code, _, err = verify(capsys, "pack", model, "-d", tmp_path / "c.npy", "-o", tmp_path / "c.vtc")
    assert (code, only_line(err)) == (2, f"error: {tmp_path / 'c.npy'}: input 'x' takes float32, "
                                         "got complex128 values; give numbers")
    assert not (tmp_path / "c.vtc").exists()
    infos = _infos(TensorProto.COMPLEX64, [2])
    for literal, got in (("[1,2]", "int64"), ("[1.5,2]", "float64"), ("[true,false]", "bool")):
        with pytest.raises(InputError) as e:
            build_cases(infos, [f"x:{literal}"])
        assert str(e.value) == (f"literal {literal!r}: input 'x' takes complex64, got {got} "
                                "values; give numbers")


def test_the_first_value_a_float8_input_cannot_hold_is_named(tmp_path: Path) -> None:
    """Integers into a float8 input: 16 is exact, 300 and 17 are not (steps of 32 and 2 there);
    the message names the first that is not, as the file holds them."""
    np.save(tmp_path / "i.npy", np.array([16, 300, 17, 2], np.int64))
    with pytest.raises(InputError, match="takes float8_e4m3fn, but int64 values like 300 are not "
                                         "exact in it$"):
        build_cases(_infos(TensorProto.FLOAT8E4M3FN, [4]), ["i.npy"], base_dir=tmp_path)


def test_an_image_past_a_float16_inputs_range_is_refused(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    """A --scale (or --std) that takes pixels past float16's 65504 is an error naming the
    peak, as for a .npy: it was packed as inf, silently but for numpy's overflow warning."""
    Image.new("RGB", (4, 2), (200, 20, 30)).save(tmp_path / "p.png")
    model = _save_model(tmp_path / "h.onnx", TensorProto.FLOAT16, [1, 3, 2, 4])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = verify(capsys, "pack", model, "-d", tmp_path / "p.png", "--scale", "1000",
                              "-o", tmp_path / "h.vtc")
    assert (code, only_line(err)) == (2, f"error: {tmp_path / 'p.png'}: input 'x' takes float16, "
                                         "but float64 values up to 200000 overflow it")
    assert [str(w.message) for w in caught] == [] and not (tmp_path / "h.vtc").exists()
    code, _, err = verify(capsys, "pack", model, "-d", tmp_path / "p.png", "--scale", "100",
                          "-o", tmp_path / "h.vtc")
    assert code == 0, err
    x = read_archive(tmp_path / "h.vtc").cases[0].inputs["x"]
    assert x.dtype == np.float16 and x[0, :, 0, 0].tolist() == [20000.0, 2000.0, 3000.0]
