"""PyTorch as the reference: a program's outputs, and every FX node's value, on this host's CPU.

PROGRAM is a saved `torch.export` program (`model.pt2`) or `file.py:factory`, a function that
returns the module, or `(module, example_inputs)`. The program is run as torch.onnx's dynamo
exporter sees it (`torch.export`, then the same decompositions the exporter applies), node by
node through a `torch.fx.Interpreter` (the FX profiler tutorial's building block): that
exporter names each ONNX tensor after the FX node computing it, so a value maps onto the ONNX
tensor of the same name. A model from the TorchScript exporter (`/layer1/layer1.0/conv1/Conv`
names) is mapped at module boundaries instead: the last node of a module ↔ the last ONNX node
of that module's scope. Anything else is listed as unmapped, never guessed.

torch is optional (`pip install 'onnx-verify[torch]'`) and imported only here, only when used.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from verify import DISTRIBUTION
from verify.errors import InputError, MissingDependency, UsageError
from verify.origin import source_line, tensor_origins
from verify.torchcost import NodeShape, flatten, node_shape

PIN = "torch==2.13.0+cpu"
INSTALL = f"pip install '{DISTRIBUTION}[torch]' (PyTorch, CPU build: {PIN})"


def import_torch(option: str) -> Any:
    """torch, or a MissingDependency (exit 2) naming `option` and what to install."""
    try:
        import torch
    except ImportError:
        raise MissingDependency(f"{option} needs PyTorch, which is not installed: "
                                f"{INSTALL}") from None
    return torch


@dataclass(frozen=True)
class FxNode:
    """One computing node of the interpreted graph."""

    name: str
    op: str          # the aten overload, e.g. 'aten.convolution.default'
    module: str      # innermost nn.Module path ('' for the top level)
    source: str      # 'resnet.py:92', innermost frame outside torch itself ('' unknown)
    call: str = ""   # which call of that module (torch.export keys each call apart)


@dataclass(frozen=True)
class Unmapped:
    fx: str
    module: str
    why: str

    def to_dict(self) -> dict[str, str]:
        return {"fx": self.fx, "module": self.module, "why": self.why}


@dataclass(frozen=True)
class TorchMap:
    """FX node name → ONNX tensor name, and the computing FX nodes without a tensor."""

    pairs: Mapping[str, str]
    unmapped: tuple[Unmapped, ...]
    how: str         # 'names' (dynamo exporter) or 'module boundaries' (TorchScript exporter)


class TorchProgram:
    """A PyTorch program loaded once, run for any number of cases."""

    def __init__(self, spec: str, example: Sequence[np.ndarray] | None = None, *,
                 option: str = "--reference torch:PROGRAM") -> None:
        """`example`: inputs to export a module with when the factory gives none; `option`:
        how the user asked for it, for the message when torch is missing."""
        self.torch = torch = import_torch(option)
        self.spec = spec
        torch.manual_seed(0)
        with warnings.catch_warnings():  # torch's deprecation notices are not the user's
            warnings.simplefilter("ignore")
            self.program, self._example = _load(torch, spec, example)
            self.graph_module = _decomposed(torch, self.program).module()
        training = _training_ops(self.graph_module.graph)
        if training:
            raise InputError(f"{spec}: exported in training mode ({', '.join(training)}); "
                             "export it from module.eval()")
        self.nodes = [_fx_node(n) for n in self.graph_module.graph.nodes
                      if n.op == "call_function"]
        self.version = str(torch.__version__)

    # --- running -------------------------------------------------------------------------
    def example_inputs(self) -> list[np.ndarray]:
        """The inputs the program was exported with (saved in the .pt2, or the factory's)."""
        if not self._example:
            raise UsageError(f"{self.spec}: holds no example inputs; give the inputs another "
                             "way (--model ARCHIVE.vtc: its first case)")
        return [_numpy(t) for t in self._example]

    def costs(self, inputs: Sequence[np.ndarray]) -> dict[str, NodeShape]:
        """Each FX node's tensor arguments and results (flops.TensorSpec) and the FLOPs and
        bytes of one execution (verify.torchcost), from one interpreted run."""
        torch = self.torch
        got: dict[str, NodeShape] = {}

        def record(n: Any, args: Any, kwargs: Any, value: Any) -> None:
            got[n.name] = node_shape(torch, n.target, args, kwargs, value,
                                     lambda: _counted(torch, n.target, args, kwargs))

        self._interpret(inputs, None, costs=record)
        return got

    def outputs(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The program's outputs (flattened, in order) on the CPU, as numpy arrays."""
        torch = self.torch
        with torch.no_grad(), users_code(f"{self.spec}: running the program on the inputs"):
            result = self.program.module()(*self._tensors(inputs))
        return [_numpy(t) for t in flatten(result)]

    def values(self, inputs: Sequence[np.ndarray], keep: set[str]) -> dict[str, np.ndarray]:
        """The value of every FX node in `keep` for one case (copies; the rest is dropped)."""
        got: dict[str, np.ndarray] = {}

        def record(name: str, value: Any) -> None:
            if name in keep and isinstance(value, self.torch.Tensor):
                got[name] = _numpy(value)

        self._interpret(inputs, record)
        return got

    def timed(self, inputs: Sequence[np.ndarray], warmup: int, iterations: int
              ) -> tuple[dict[str, list[float]], list[float]]:
        """Per-node wall times (seconds, one per iteration) from the timing interpreter, and
        the whole graph's time per iteration measured around the same interpreted runs."""
        per_node: dict[str, list[float]] = {n.name: [] for n in self.nodes}
        totals: list[float] = []
        for i in range(warmup + iterations):
            times: dict[str, float] = {}
            start = time.perf_counter()
            self._interpret(inputs, None, times)
            total = time.perf_counter() - start
            if i >= warmup:
                totals.append(total)
                for name, seconds in times.items():
                    per_node.setdefault(name, []).append(seconds)
        return per_node, totals

    def _interpret(self, inputs: Sequence[np.ndarray], record: Callable[[str, Any], None] | None,
                   times: dict[str, float] | None = None,
                   costs: Callable[[Any, Any, Any, Any], None] | None = None) -> None:
        torch = self.torch

        class Recorder(torch.fx.Interpreter):  # type: ignore[misc, name-defined]
            def run_node(self, n: Any) -> Any:
                if costs is not None and n.op == "call_function":
                    args, kwargs = self.fetch_args_kwargs_from_env(n)
                    value = super().run_node(n)
                    costs(n, args, kwargs, value)
                elif times is None or n.op != "call_function":
                    value = super().run_node(n)
                else:
                    start = time.perf_counter()
                    value = super().run_node(n)
                    times[n.name] = time.perf_counter() - start
                if record is not None:
                    record(n.name, value)
                return value

        with torch.no_grad(), users_code(f"{self.spec}: running the program on the inputs"):
            Recorder(self.graph_module).run(*self._tensors(inputs))

    def _tensors(self, inputs: Sequence[np.ndarray]) -> list[Any]:
        return [self.torch.from_numpy(np.ascontiguousarray(a)) for a in inputs]

    # --- mapping onto an ONNX model ------------------------------------------------------
    def map_onto(self, model: onnx.ModelProto) -> TorchMap:
        produced = [out for node in model.graph.node for out in node.output if out]
        names = set(produced)
        pairs = {n.name: n.name for n in self.nodes if n.name in names}
        how = "names"
        if not pairs:
            pairs, how = _by_module(self.nodes, model), "module boundaries"
        fused = {n.name for n in self.nodes} - set(pairs)
        unmapped = tuple(Unmapped(n.name, n.module, "no ONNX tensor of that name (fused or "
                                  "folded by the exporter)" if how == "names" else
                                  "not mapped at module boundaries (not a module's last "
                                  "node, a module called twice, or folded by the exporter)")
                         for n in self.nodes if n.name in fused)
        return TorchMap(pairs, unmapped, how)


def _training_ops(graph: Any) -> list[str]:
    """What makes a program a training one (its batch norm takes each batch's statistics and
    updates its running ones, its dropout is random), in graph order, each named once."""
    found: list[str] = []
    for n in graph.nodes:
        name = getattr(getattr(n.target, "overloadpacket", None), "__name__", "")
        # (input, weight, bias, running_mean, running_var, training, ...): batch statistics
        # with running ones to update (an instance norm's, without running ones, is no sign)
        if name in ("_native_batch_norm_legit_functional", "_native_batch_norm_legit",
                    "batch_norm") and len(n.args) > 5 and n.args[5] is True:
            what = "batch norm"
        elif name == "native_dropout" or (
                name.endswith("dropout") and len(n.args) > 2 and n.args[2] is True):
            what = "dropout"
        else:
            continue
        if what not in found:
            found.append(what)
    return found


def _counted(torch: Any, target: Any, args: Any, kwargs: Any) -> int | None:
    """FLOPs of `target(*args, **kwargs)` by PyTorch's FLOP counter; None when no op it ran
    has a formula there."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as mode:
        target(*args, **kwargs)
    return mode.get_total_flops() if any(mode.get_flop_counts().values()) else None


def _by_module(nodes: Sequence[FxNode], model: onnx.ModelProto) -> dict[str, str]:
    """The last FX node of each module ↔ the last ONNX tensor of that module's scope; not for
    a module called more than once (the exporter names the second call `relu_1`), nor for a
    scope whose node computes on constants the exporter folded (`onnx::Conv_193`: a
    BatchNorm folded into the Conv, so its output is no longer the Conv module's)."""
    last_fx = {n.module: n.name for n in nodes if n.module}
    calls: dict[str, set[str]] = {}
    for n in nodes:
        calls.setdefault(n.module, set()).add(n.call)
    constants = {t.name for t in model.graph.initializer}
    folded = {out for node in model.graph.node
              if any(i.startswith("onnx::") and i in constants for i in node.input)
              for out in node.output}
    last_onnx: dict[str, str] = {}
    for tensor, origin in tensor_origins(model).items():
        last_onnx[origin.module] = tensor  # node order is topological in exported models
    return {fx: last_onnx[module] for module, fx in last_fx.items()
            if module in last_onnx and len(calls[module]) == 1
            and last_onnx[module] not in folded}


def _load(torch: Any, spec: str, example: Sequence[np.ndarray] | None
          ) -> tuple[Any, tuple[Any, ...]]:
    """The exported program and the example inputs it comes with (maybe none)."""
    if spec.endswith(".pt2"):
        path = Path(spec)
        if not path.is_file():
            raise UsageError(f"{spec}: no such file (a torch.export program saved with "
                             "torch.export.save)")
        try:
            program = torch.export.load(str(path))
        except Exception as exc:  # noqa: BLE001 - torch raises many kinds on a bad file
            raise InputError(f"{spec}: not a loadable torch.export program "
                             f"({type(exc).__name__}: {_first(exc)})") from None
        saved = getattr(program, "example_inputs", None)
        args = tuple(saved[0]) if saved else ()
        if example is not None:
            args = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in example)
        return program, args
    file, sep, factory = spec.rpartition(":")
    if not sep or not file.endswith(".py") or not factory.isidentifier():
        raise UsageError(f"torch program {spec!r}: give a saved torch.export program (.pt2) "
                         "or FILE.py:FACTORY")
    made = _call_factory(Path(file), factory)
    module, given = (made if isinstance(made, tuple) and len(made) == 2 else (made, None))
    if not isinstance(module, torch.nn.Module):
        raise InputError(f"{spec}: the factory returned {type(module).__name__}, not a "
                         "torch.nn.Module (or (module, example_inputs))")
    inputs = tuple(given) if given is not None else tuple(
        torch.from_numpy(np.ascontiguousarray(a)) for a in (example or ()))
    try:
        return torch.export.export(module.eval(), inputs), inputs
    except Exception as exc:  # noqa: BLE001 - torch.export's failures are many and untyped
        raise InputError(f"{spec}: torch.export could not export the module "
                         f"({type(exc).__name__}: {_first(exc)})") from None


def _call_factory(file: Path, factory: str) -> Any:
    if not file.is_file():
        raise UsageError(f"{file}: no such file")
    name = f"verify_torch_program_{abs(hash(str(file.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise UsageError(f"{file}: cannot be imported as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # its folder first on the import path while it runs, as `python FILE.py` has it: a factory
    # importing its own model module ("from net import Net") failed
    folder = str(file.resolve().parent)
    sys.path.insert(0, folder)
    try:
        with users_code(f"{file}: importing it"):
            spec.loader.exec_module(module)
        fn = getattr(module, factory, None)
        if not callable(fn):
            raise UsageError(f"{file}: defines no function {factory!r}")
        with users_code(f"{file}:{factory}()"):
            return fn()
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)


@contextlib.contextmanager
def users_code(what: str) -> Iterator[None]:
    """Run the user's Python (their factory, their module's forward) inside verify: what it
    prints goes to stderr (stdout is verify's, a --json document), and whatever it raises or
    exits with is one InputError line (exit 2), not verify's traceback and exit 4, nor a
    sys.exit() that ended verify with the program's status and no archive."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    except (UsageError, InputError, KeyboardInterrupt):
        raise
    except SystemExit as exc:
        raise InputError(f"{what} called sys.exit({exc.code!r})") from None
    except Exception as exc:  # noqa: BLE001 - the user's code may raise anything
        hint = (" (a torch.export program runs inputs of the shapes it was exported with only, "
                "unless exported with dynamic_shapes)" if "Guard failed" in str(exc) else "")
        raise InputError(f"{what} failed: {type(exc).__name__}: {_first(exc)}{hint}") from None


def _decomposed(torch: Any, program: Any) -> Any:
    """The program decomposed as torch.onnx's dynamo exporter decomposes it, so FX node names
    are the names that exporter gives ONNX tensors; the plain program if that part of the
    exporter (private, pinned with torch) or onnxscript is not there."""
    try:
        from torch.onnx._internal.exporter import _core, _registration
        registry = _registration.ONNXRegistry.from_torchlib()
        return _core._prepare_exported_program_for_export(program, registry=registry)
    except ImportError:
        return program


def _fx_node(n: Any) -> FxNode:
    stack = n.meta.get("nn_module_stack") or {}
    module, call = "", ""
    if stack:
        call, entry = list(stack.items())[-1]
        module = str(entry[0] if isinstance(entry, tuple) else entry)
    return FxNode(n.name, str(n.target), module,
                  source_line(str(n.meta.get("stack_trace") or "")), str(call))




def _numpy(t: Any) -> np.ndarray:
    return t.detach().cpu().contiguous().numpy().copy()


def _first(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else ""
