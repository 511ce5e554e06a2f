"""The distribution as a user gets it: `python -m build` makes a wheel and an sdist of a copy of
this tree; each installs into a fresh virtual environment (no system site-packages, no
PYTHONPATH) and passes a smoke test there: `verify --version` names the distribution and its
installed version, and the README's demo command (pack the sample CNN, run it) succeeds.

Slow (two environments with numpy, onnx and onnxruntime; pip's cache makes the second and
later runs quicker) and needs the package index or a warm pip cache for the build backend and
the dependencies.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from verify import DISTRIBUTION, __version__, scan_native

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
SKIP = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                              ".pytest_cache", ".venv", "*.vtc")


def _env() -> dict[str, str]:
    """This environment without anything that would import this tree instead of the install."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 900) -> str:
    proc = subprocess.run(argv, cwd=cwd, env=env or _env(), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def _demo_command() -> str:
    """The README's demo command, without its first step (installing from the clone)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- demo-command -->\s*```\s*\n(.*?)\n```", text, re.S)
    assert block, "README.md has no demo-command block"
    install, sep, rest = block.group(1).strip().partition(" && ")
    assert sep and "pip install" in install, block.group(1)
    return rest


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if importlib.util.find_spec("build") is None:
        pytest.fail("the `build` package is missing: pip install -e '.[test]'")
    root = tmp_path_factory.mktemp("packaging")
    src = root / "src"
    shutil.copytree(REPO, src, ignore=SKIP)
    out = root / "dist"
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(src)], cwd=root)
    wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0]}


def test_the_artifacts_are_named_for_the_distribution_and_hold_what_the_build_needs(
        dists: dict[str, Path]) -> None:
    stem = f"{DISTRIBUTION.replace('-', '_')}-{__version__}"
    assert dists["wheel"].name == f"{stem}-py3-none-any.whl"
    assert dists["sdist"].name == f"{stem}.tar.gz"
    with zipfile.ZipFile(dists["wheel"]) as whl:
        names = set(whl.namelist())
        metadata = whl.read(f"{stem}.dist-info/METADATA").decode()
        entry_points = whl.read(f"{stem}.dist-info/entry_points.txt").decode()
    assert {"verify/__init__.py", "verify/cli/__init__.py", "verify/drivers/ssh.py",
            "verify/runner/runner.py", "verify/runner/contract.schema.json",
            "verify/scan_native.c"} <= names
    assert any(n.startswith(f"{stem}.dist-info/") and n.endswith("LICENSE") for n in names)
    assert f"Name: {DISTRIBUTION}\n" in metadata and f"Version: {__version__}\n" in metadata
    assert 'Requires-Dist: paramiko>=3.4; extra == "ssh"' in metadata
    # The self-referential extras name this distribution, never the unrelated `verify`.
    assert "Requires-Dist: verify" not in metadata
    assert re.search(rf"Requires-Dist: {DISTRIBUTION}\[[a-z,]+\]; extra == \"all\"", metadata)
    assert re.search(r"^verify = verify\.cli:main$", entry_points, re.M)
    with tarfile.open(dists["sdist"]) as sdist:
        members = {m.split("/", 1)[1] for m in sdist.getnames() if "/" in m}
    assert {"README.md", "LICENSE", "pyproject.toml", "verify/runner/runner.py",
            "verify/runner/contract.schema.json", "verify/drivers/ssh.py",
            "verify/scan_native.c"} <= members


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_installs_into_a_fresh_venv_and_runs_the_demo(kind: str, dists: dict[str, Path],
                                                      tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    bin_dir = venv / "bin"
    _run([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(dists[kind])],
         cwd=tmp_path)

    env = _env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    demo = tmp_path / "demo"  # a folder with the demo's inputs and no source tree
    for rel in ("goldens/models/cnn.onnx", "goldens/images/sample.png"):
        (demo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, demo / rel)
    where = _run([str(bin_dir / "python"), "-c",
                  "import verify, importlib.metadata as m; "
                  f"print(verify.__file__); print(m.version({DISTRIBUTION!r}))"], demo, env)
    module_file, installed_version = where.split()[:2]
    assert Path(module_file).is_relative_to(venv), module_file  # the install, not this tree

    version = _run(["verify", "--version"], demo, env)
    assert version.strip() == f"verify {installed_version} (distribution {DISTRIBUTION})"
    assert installed_version == __version__

    out = _run(["bash", "-c", _demo_command()], demo, env)
    assert (demo / "cnn.vtc").is_file()
    assert re.search(r"\bPASS", out), out
    # the compiled comparison kernel builds from the source the artifact ships (where this
    # machine has a C compiler, as the test set-up installs one)
    if scan_native._compiler() is None:
        return
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    built = _run([str(bin_dir / "python"), "-c",
                  "from verify import scan_native as n; print(n.native_available(), "
                  "n.native_problem())"], demo, env)
    assert built.strip() == "True", built
    assert len(list((tmp_path / "cache" / "verify" / "kernels").glob("scan-*.so"))) == 1
