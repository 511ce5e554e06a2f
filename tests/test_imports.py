"""Dependencies point one way (STYLE.md §1), checked by reading every module's imports.

cli -> features -> core -> errors. Only the CLI prints for humans or exits; drivers never reach
up into the CLI or the pipeline; paramiko and adbutils live in their drivers only; the device-side
runner imports nothing but the standard library, numpy and onnxruntime.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "verify"
STDLIB = sys.stdlib_module_names


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def rel(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def imported(path: Path) -> set[str]:
    """Every absolute module name the file imports, at any depth (lazy imports included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def top(name: str) -> str:
    return name.split(".")[0]


# the runner's own files, which travel with it (verify/runner_files.py) and import each other
# by plain name on the device (`import contract`)
RUNNER_SIBLINGS = {p.stem for p in (PACKAGE / "runner").glob("*.py")}


@pytest.mark.parametrize("path", [p for p in modules() if "runner" in p.parts], ids=rel)
def test_device_runner_needs_only_stdlib_numpy_onnxruntime(path: Path) -> None:
    allowed = STDLIB | {"numpy", "onnxruntime"} | RUNNER_SIBLINGS
    foreign = {n for n in imported(path) if top(n) not in allowed}
    assert not foreign, f"{rel(path)} imports {sorted(foreign)}; the runner is copied to devices as is"


def test_the_contract_module_needs_only_the_stdlib() -> None:
    """contract.py is imported by the host too, and by any device Python: no numpy either."""
    foreign = {n for n in imported(PACKAGE / "runner" / "contract.py") if top(n) not in STDLIB}
    assert not foreign, foreign


# verify/__main__.py is the command's other entry point (`python -m verify`), like the console
# script: it only calls verify.cli.main
@pytest.mark.parametrize("path", [p for p in modules() if "cli" not in p.parts
                                  and p.name != "__main__.py"], ids=rel)
def test_only_the_cli_imports_the_cli_or_click(path: Path) -> None:
    bad = {n for n in imported(path) if n.startswith("verify.cli") or top(n) == "click"}
    assert not bad, f"{rel(path)} imports {sorted(bad)}: only verify/cli/ talks to humans"


@pytest.mark.parametrize("path", [p for p in modules()
                                  if "cli" not in p.parts and "runner" not in p.parts], ids=rel)
def test_library_code_never_exits(path: Path) -> None:
    tree = ast.parse(path.read_text())
    exits = [node.lineno for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and node.attr == "exit"
             and isinstance(node.value, ast.Name) and node.value.id == "sys"]
    assert not exits, f"{rel(path)} calls sys.exit at line(s) {exits}: raise a VerifyError instead"


@pytest.mark.parametrize("path", [p for p in modules() if "drivers" in p.parts], ids=rel)
def test_drivers_do_not_reach_up(path: Path) -> None:
    allowed = ("verify.errors", "verify.drivers", "verify.devices", "verify.files")
    # The package root holds only the version and the distribution name and imports nothing.
    root = ("verify", "verify.__version__", "verify.DISTRIBUTION")
    bad = {n for n in imported(path)
           if top(n) == "verify" and n not in root and not n.startswith(allowed)}
    assert not bad, f"{rel(path)} imports {sorted(bad)}; drivers depend on errors/devices/files only"


@pytest.mark.parametrize("library, home", [("paramiko", "verify/drivers/ssh"),
                                           ("adbutils", "verify/drivers/adb")])
def test_transport_libraries_stay_in_their_driver(library: str, home: str) -> None:
    """The library is imported by its driver (`ssh.py`) and that driver's helpers (`ssh_*.py`)
    only, which nothing else imports but the driver."""
    users = [rel(p) for p in modules() if any(top(n) == library for n in imported(p))]
    assert f"{home}.py" in users
    assert all(u == f"{home}.py" or u.startswith(f"{home}_") for u in users), users
    helper = home.replace("/", ".") + "_"
    reaching = [rel(p) for p in modules() if not rel(p).startswith(home)
                and any(n.startswith(helper) for n in imported(p))]
    assert not reaching, reaching


def test_compare_knows_nothing_of_archives_or_devices() -> None:
    path = PACKAGE / "compare.py"
    internal = {n.rsplit(".", 1)[0] if n.count(".") > 1 else n
                for n in imported(path) if top(n) == "verify"}
    kernel = {"verify.scan", "verify.scan_numba", "verify.dtypes"}
    assert internal <= {"verify.errors", "verify.rules", "verify.tolerance_specs", *kernel}, (
        sorted(internal))
    for part in ("rules.py", "tolerance_specs.py"):  # what compare re-exports: no archives either
        inside = {n.rsplit(".", 1)[0] if n.count(".") > 1 else n
                  for n in imported(PACKAGE / part) if top(n) == "verify"}
        assert inside <= {"verify.errors", "verify.rules", *kernel}, (part, sorted(inside))
    # the kernel imports nothing else of verify, one way inside: scan uses the fused engines,
    # numba's and the compiled C kernel's, which knows only where verify's cache is
    for part, allowed in (("scan.py", {"verify.scan_numba"}),
                          ("scan_numba.py", {"verify.scan_native"}),
                          ("scan_native.py", {"verify.cache"}), ("cache.py", set()),
                          ("dtypes.py", set())):
        inside = {n.rsplit(".", 1)[0] if n.count(".") > 1 else n
                  for n in imported(PACKAGE / part) if top(n) == "verify"}
        assert inside <= allowed, (part, sorted(inside))


def test_help_works_without_the_optional_transport_libraries() -> None:
    code = ("import sys\n"
            "sys.modules['paramiko'] = None; sys.modules['adbutils'] = None\n"
            "from verify.cli import main\n"
            "sys.exit(main(['--help']) or main(['run', '--help']) or main(['devices', 'list']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Usage: verify" in proc.stdout


_HEAVY = ("onnxruntime", "onnx", "matplotlib")


def _loaded_after(args: list[str], heavy: tuple[str, ...] = _HEAVY) -> tuple[list[str], str]:
    code = ("import sys\n"
            "from verify.cli import main\n"
            "try:\n"
            f"    main({args!r})\n"
            "except SystemExit:\n"
            "    pass\n"
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return eval(proc.stdout.strip().splitlines()[-1]), proc.stdout  # noqa: S307 - our own list


@pytest.mark.parametrize("args", [["--help"], ["diff", "--help"], ["run", "--help"]])
def test_help_imports_no_onnx_onnxruntime_or_matplotlib(args: list[str]) -> None:
    loaded, _ = _loaded_after(args)
    assert loaded == []


def test_diff_of_two_dumps_imports_no_onnx_onnxruntime_matplotlib_or_h5py(tmp_path: Path) -> None:
    """Two dumps need neither the model nor the archive format (h5py: ~25 ms of start)."""
    from verify.cli import main

    model = Path(__file__).resolve().parent.parent / "goldens" / "models" / "cnn.onnx"
    archive = tmp_path / "cnn.vtc"
    assert main(["pack", str(model), "-o", str(archive)]) == 0
    for name in ("a", "b"):
        assert main(["run", str(archive), "--iter", "1", "--warmup", "0", "--opt-level",
                     "disable", "--bin-io-dump", str(tmp_path / name)]) == 0
    loaded, out = _loaded_after(["diff", str(tmp_path / "a"), str(tmp_path / "b")],
                                (*_HEAVY, "h5py"))
    assert "PASS" in out and loaded == []


def test_help_does_not_import_torch() -> None:
    """PyTorch is optional and heavy: only --reference torch: and profile --torch import it."""
    code = ("import sys\n"
            "from verify.cli import main\n"
            "rc = main(['--help']) or main(['pack', '--help']) or main(['profile', '--help'])\n"
            "sys.exit(rc or (5 if 'torch' in sys.modules else 0))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("argv, option", [
    (["pack", "goldens/models/cnn.onnx", "--reference", "torch:model.pt2", "-o", "{tmp}/x.vtc"],
     "--reference torch:PROGRAM"),
    (["profile", "--torch", "model.pt2"], "--torch"),
])
def test_without_torch_the_option_says_what_to_install(argv: list[str], option: str,
                                                        tmp_path: Path) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code = ("import sys\n"
            "sys.modules['torch'] = None\n"
            "from verify.cli import main\n"
            f"sys.exit(main({argv!r}))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=PACKAGE.parent)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (f"error: {option} needs PyTorch, which is not installed: "
                                   "pip install 'onnx-verify[torch]' (PyTorch, CPU build: "
                                   "torch==2.13.0+cpu)")
    assert not (tmp_path / "x.vtc").exists()


def test_top_level_help_imports_no_numpy_rich_or_command_module() -> None:
    """`verify --help` lists the commands without importing them (LAZY_COMMANDS), nor numpy or
    rich: its start stays under a bare `import numpy, onnxruntime` (benchmarks/bench_diff.py)."""
    code = ("import sys\n"
            "from verify.cli import main\n"
            "try:\n"
            "    main(['--help'])\n"
            "except SystemExit:\n"
            "    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'rich')\n"
            "             or m.endswith('_cmd') or m == 'verify.cli.render'))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Commands:" in proc.stdout and "localize" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_lazy_commands_short_help_is_each_commands_own() -> None:
    import click

    from verify.cli import LAZY_COMMANDS, cli

    ctx = click.Context(cli)
    assert sorted(LAZY_COMMANDS) == cli.list_commands(ctx)
    for name, (module, short) in LAZY_COMMANDS.items():
        command = cli.get_command(ctx, name)
        assert command is not None and f"verify.cli.{module}" in sys.modules
        assert command.get_short_help_str(10_000) == short, name


_CNN = PACKAGE.parent / "goldens" / "models" / "cnn.onnx"
_ENTRIES = {  # each imports numpy inside verify's entry point
    "cli": f"from verify.cli import main\nmain(['inspect', {str(_CNN)!r}])\n",
    "runner": "from verify.runner import runner\nrunner.main(['runner.py', '--describe'])\n",
}


def _blas_threads(entry: str, asked: str | None) -> tuple[str, int]:
    """OPENBLAS_NUM_THREADS as the process sees it once `entry` ran, and its thread count
    after importing numpy; `asked`: the variable in its environment (None: unset)."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if asked:
        env["OPENBLAS_NUM_THREADS"] = asked
    code = (_ENTRIES[entry] + "import os, numpy\n"
            "print('threads', os.environ.get('OPENBLAS_NUM_THREADS'), "
            "len(os.listdir('/proc/self/task')))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    _, value, threads = proc.stdout.strip().splitlines()[-1].split()
    return value, int(threads)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
@pytest.mark.parametrize("entry", sorted(_ENTRIES))
def test_verify_processes_start_no_spinning_blas_threads(entry: str) -> None:
    """numpy's OpenBLAS starts a thread per core at import, each spinning ~0.1 s of CPU: the
    CLI and the runner (before numpy is imported) ask for none, unless the user set a number.
    (onnxruntime starts a thread of its own: counted against a process told to start none.)
    The CLI's main() hands its caller the environment back as it was."""
    value, threads = _blas_threads(entry, None)
    assert threads == _blas_threads(entry, "1")[1]
    assert value == ("None" if entry == "cli" else "1")
    assert _blas_threads(entry, "2")[0] == "2"
