"""No key of a runner-contract document (job, result, --describe, dump manifest, the serve
protocol, the trace's otherData) is spelled as a string anywhere in verify/ but its one owner,
verify/runner/contract.py: spelled twice, two ends drift (the runner's and the host's defaults
already had). Read from the code's syntax tree, so words in docs and messages are free.

What counts as spelling a key: a string literal used as one — `doc["key"]`, `doc.get("key")`
(`pop`, `setdefault`), `"key" in doc`, a dict literal's key, `dict(doc, key=...)` or
`doc.update(key=...)` — where the document is evidently a contract document:
- in every module that reads or writes one (it imports the contract module), any contract key;
- anywhere, a key on a variable named as a contract document (`job`, `dump_job`, `manifest` …);
- anywhere, a dict literal with two or more job keys, one of them a key only a job has
  (`contract`, `outputs_dir`, `control_probe` …): a job built by hand.
Keys of verify's other formats that share a contract word (a bench report's "threads") are
free outside those three."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from verify.runner import contract as C

PACKAGE = Path(__file__).resolve().parents[2] / "verify"
OWNER = PACKAGE / "runner" / "contract.py"

KEYS = {str(f) for doc in C.DOCUMENTS.values() for f in doc.fields()} | {
    v for klass in (C.Serve, C.Trace) for k, v in vars(klass).items()
    if k.isupper() and isinstance(v, str) and not v.startswith("-")}
JOB_KEYS = {str(f) for doc in (C.Job, C.DumpSpec, C.DumpFirst) for f in doc.fields()}
# job keys that verify's other formats use too (a bench report's "threads", an archive's
# "external_data", a suite's "providers"): a dict of these alone is not evidently a job
SHARED_JOB_KEYS = {"model", "cases", "providers", "opt_level", "threads", "session_config",
                   "warmup", "iterations", "result", "profile", "dump", "version",
                   "external_data", "tensors", "outputs", "dir", "save", "first"}
# variables that hold a contract document wherever they appear
DOC_NAMES = {"job", "dump_job", "session_job", "manifest", "dump_spec", "describe_info"}

# (module, key, why): the few key-shaped strings in contract modules that are not contract keys
ALLOWED = {
    ("pipeline.py", "spec"): "the host's own addition to the describe info: the device as named",
    ("cli/render_device.py", "spec"): "the same addition, printed by devices check",
    ("runner/runner.py", "name"): "onnxruntime's profiler events (measure_sizes), not a record",
}


def _imports_contract(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.module in ("verify.runner.contract",) or (
                    node.module == "verify.runner" and any(a.name == "contract"
                                                           for a in node.names)) or (
                    node.level == 1 and any(a.name == "contract" for a in node.names)):
                return True
        elif isinstance(node, ast.Import) and any(a.name in ("contract",
                                                             "verify.runner.contract")
                                                    for a in node.names):
            return True
    return False


def _receiver(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def key_uses(tree: ast.AST) -> Iterator[tuple[int, str, str, str]]:
    """(line, key, how, receiver) for each string literal used as a dict key."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str):
            yield node.lineno, node.slice.value, "subscript", _receiver(node.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get", "pop", "setdefault") and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            yield node.lineno, node.args[0].value, node.func.attr, _receiver(node.func.value)
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) \
                and isinstance(node.left.value, str) \
                and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            yield node.lineno, node.left.value, "in", _receiver(node.comparators[0])
        elif isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            job = len(set(keys) & JOB_KEYS) >= 2 and set(keys) & (JOB_KEYS - SHARED_JOB_KEYS)
            for k in keys:
                yield node.lineno, k, "job dict" if job else "dict", ""
        elif isinstance(node, ast.Call) and node.keywords and (
                (isinstance(node.func, ast.Name) and node.func.id == "dict")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "update")):
            recv = _receiver(node.args[0]) if isinstance(node.func, ast.Name) and node.args \
                else _receiver(getattr(node.func, "value", None))
            for kw in node.keywords:
                if kw.arg:
                    yield node.lineno, kw.arg, "keyword", recv


def spelled(path: Path) -> list[str]:
    rel = path.relative_to(PACKAGE).as_posix()
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    wire = _imports_contract(tree)
    found = []
    for line, key, how, recv in key_uses(tree):
        if key not in KEYS or (rel, key) in ALLOWED:
            continue
        if wire or recv in DOC_NAMES or how == "job dict":
            found.append(f"verify/{rel}:{line}: {key!r} ({how}"
                         + (f" on {recv}" if recv else "") + ")")
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p != OWNER)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_no_contract_key_is_spelled_outside_the_contract_module(path: Path) -> None:
    found = spelled(path)
    assert not found, ("spell these through verify/runner/contract.py (Job.THREADS, "
                       "Result.CASES …):\n" + "\n".join(found))


def test_the_shared_job_keys_are_job_keys() -> None:
    assert SHARED_JOB_KEYS <= JOB_KEYS
    assert "contract" not in SHARED_JOB_KEYS and "outputs_dir" not in SHARED_JOB_KEYS


def test_the_allowed_spellings_are_still_there() -> None:
    """An entry of ALLOWED whose spelling is gone must go too (no blanket waivers)."""
    for rel, key in ALLOWED:
        tree = ast.parse((PACKAGE / rel).read_text(encoding="utf-8"))
        assert any(k == key for _, k, _, _ in key_uses(tree)), (rel, key)


@pytest.mark.parametrize("source, caught", [
    ('job["threads"]', True),
    ('x = job.get("warmup", 1)', True),
    ('if "dump_first" in job: pass', True),
    ('j = {"contract": "verify-runner", "model": "m.onnx"}', True),
    ('j = {"opt_level": "all", "control_probe": True}', True),
    ('report = {"opt_level": "all", "threads": 4}', False),  # a report's options
    ('j = dict(job, opt_level="disable")', True),
    ('manifest["cases"]', True),
    ('report = {"threads": 4}', False),          # one shared word in another format's dict
    ('print("the job sets threads")', False),     # words in text
    ('rows["name"]', False),                      # a generic key on something else
])
def test_the_check_catches_a_key_spelled_by_hand(source: str, caught: bool,
                                                 tmp_path: Path) -> None:
    """The rules above on single lines, in a module that does not import the contract."""
    path = PACKAGE / "_probe_module.py"
    tree = ast.parse(source)
    found = [k for _, k, how, recv in key_uses(tree)
             if k in KEYS and (recv in DOC_NAMES or how == "job dict")]
    assert bool(found) == caught, (source, found)
    del path


def test_a_contract_module_may_spell_no_key_at_all(tmp_path: Path) -> None:
    """In a module importing the contract, even a generic key is a spelling."""
    tree = ast.parse('from verify.runner.contract import Job\nx = result["cases"]\n')
    assert _imports_contract(tree)
    assert [k for _, k, _, _ in key_uses(tree) if k in KEYS] == ["cases"]
