"""The GPU lane's record (tests/gpu_lane.json) exists, is complete and clean; and how it is hashed, read and merged."""

import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import nbformat
import pytest

from kernels import gpu_lane

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _ever_committed(rel: str) -> bool:
    """Whether ``rel`` is in this checkout's git history (False where git or the history is absent)."""
    try:
        log = subprocess.run(["git", "log", "--format=%H", "-1", "--", rel], capture_output=True, text=True, cwd=ROOT)
    except OSError:
        return False
    return log.returncode == 0 and bool(log.stdout.strip())


def test_the_gpu_lane_record_is_fresh_and_clean():
    """Fails when the record lists a failure, is unreadable, or lacks a part or is missing once a record
    has been committed; only says so when it is stale (so that a change can land before its GPU run),
    and, until the first record is committed, when it is missing or incomplete."""
    code, line = gpu_lane.check(ROOT)
    print(line)
    incomplete = line.startswith(("gpu lane: no record", "gpu lane: the record lacks part"))
    if code == 2 and incomplete and not _ever_committed(gpu_lane.RECORD):
        print("no complete GPU lane record has been committed yet: run python -m kernels.gpu_lane on a CUDA GPU")
        return
    assert code != 2, line


def test_the_lane_leaves_out_only_the_test_of_its_own_record():
    assert gpu_lane.DESELECT == (f"tests/test_gpu_lane.py::{test_the_gpu_lane_record_is_fresh_and_clean.__name__}",)


def _notebook(path: pathlib.Path, *sources, outputs=(), count=None) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# a chapter")]
    for source in sources:
        cell = nbformat.v4.new_code_cell(source)
        cell.outputs = [nbformat.v4.new_output("stream", text=t) for t in outputs]
        cell.execution_count = count
        nb.cells.append(cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


@pytest.fixture
def tree(tmp_path):
    for rel, text in {
        "kernels/__init__.py": "",
        "kernels/fp8.py": "def quantize(x):\n    return x\n",
        "kernels/__pycache__/fp8.cpython-312.pyc": "\x00",
        "tests/test_fp8.py": "def test_quantize():\n    pass\n",
        "tests/data/table.bin": "\x01\x02",
        "tests/.pytest_cache/v": "x",
        "book/figure.png": "not covered",
        "README.md": "not covered",
        "solutions/hidden_tests/01/q1.py": "name = 'q1'\n",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    _notebook(tmp_path / "book/01.ipynb", "x = 1", "print(x)")
    _notebook(tmp_path / "labs/01.ipynb", "x = ...")
    _notebook(tmp_path / "labs/.ipynb_checkpoints/01-checkpoint.ipynb", "y = 2")
    return tmp_path


def test_what_the_hash_covers(tree):
    (tree / gpu_lane.RECORD).write_text("{}")
    assert gpu_lane.covered(tree) == [
        "book/01.ipynb",
        "kernels/__init__.py",
        "kernels/fp8.py",
        "labs/01.ipynb",
        "solutions/hidden_tests/01/q1.py",
        "tests/data/table.bin",
        "tests/test_fp8.py",
    ]


@pytest.mark.parametrize(
    "rel, text",
    [
        ("kernels/fp8.py", "def quantize(x):\n    return x * 2\n"),
        ("tests/test_fp8.py", "# a new test\n"),
        ("solutions/hidden_tests/01/q1.py", "name = 'q1'\n# a new hidden test\n"),
    ],
    ids=["kernel", "test", "hidden test"],
)
def test_the_hash_follows_kernels_and_tests(tree, rel, text):
    before = gpu_lane.tree_sha256(tree)
    (tree / rel).write_text(text)
    assert gpu_lane.tree_sha256(tree) != before
    (tree / "kernels/new.py").write_text("")
    assert gpu_lane.covered(tree).count("kernels/new.py") == 1


def test_the_hash_follows_notebook_code_not_outputs(tree):
    before = gpu_lane.tree_sha256(tree)
    _notebook(tree / "book/01.ipynb", "x = 1", "print(x)", outputs=["1\n"], count=7)
    assert gpu_lane.tree_sha256(tree) == before, "outputs and execution counts are not code"
    (tree / gpu_lane.RECORD).write_text('{"sha256": "anything"}\n')
    (tree / "kernels/__pycache__/other.pyc").write_text("\x01")
    assert gpu_lane.tree_sha256(tree) == before, "the record and byte code are not covered"
    _notebook(tree / "book/01.ipynb", "x = 2", "print(x)")
    assert gpu_lane.tree_sha256(tree) != before


def test_what_tools_leave_behind_is_not_covered(tree):
    """A ruff cache (tests/submissions has its own ruff.toml), an egg-info, a checkpoint folder: a copy of
    the tree on the device may hold them and a clean clone does not, so they must not change the hash."""
    before = gpu_lane.tree_sha256(tree)
    for rel in (
        "tests/submissions/.ruff_cache/0.9/123",
        "tests/.ruff_cache/CACHEDIR.TAG",
        "kernels/x.egg-info/PKG-INFO",
        "book/.ipynb_checkpoints/01-checkpoint.ipynb",
        "tests/.hidden.py",
    ):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text("left behind\n")
    assert gpu_lane.tree_sha256(tree) == before
    (tree / "tests/submissions/new.py").write_text("seen\n")
    assert gpu_lane.tree_sha256(tree) != before


def _record(root, sha=None, failed=(), parts=("tests", "notebooks")):
    env = {"device": "NVIDIA H200", "capability": "9.0", "torch": "2.11.0", "triton": "3.6.0", "python": "3.12.3"}
    env |= {"date": "2026-01-02T03:04:05+00:00", "commit": None, "sha256": sha or gpu_lane.tree_sha256(root)}
    rec = None
    for name in parts:
        bad = list(failed) if name == "tests" else []
        counts = {"passed": 10, "failed": len(bad), "skipped": 1}
        part = {"counts": counts, "failed": bad, "skipped": {f"{name}/x.py::t": "needs sm_100"}, "returncode": 0}
        rec, _ = gpu_lane.merge(rec, name, part, env)
    (root / gpu_lane.RECORD).write_text(json.dumps(rec, indent=2, sort_keys=True) + "\n")


def test_check_fresh_and_clean(tree):
    _record(tree)
    code, line = gpu_lane.check(tree)
    assert code == 0, line
    assert line.startswith("gpu lane: fresh and clean: 20 passed, 0 failed, 2 skipped on NVIDIA H200 (9.0)")
    assert line.endswith(f"torch 2.11.0, triton 3.6.0, 2026-01-02, tree {gpu_lane.tree_sha256(tree)[:12]}")


def test_check_stale(tree):
    _record(tree)
    (tree / "kernels/fp8.py").write_text("# changed after the GPU run\n")
    code, line = gpu_lane.check(tree)
    assert code == 1 and "stale" in line and "0 failed" in line, line


@pytest.mark.parametrize("stale", [False, True])
def test_check_failure_wins(tree, stale):
    _record(tree, sha="0" * 64 if stale else None, failed=["tests/test_fp8.py::test_quantize"])
    code, line = gpu_lane.check(tree)
    assert code == 2 and "FAILED tests/test_fp8.py::test_quantize" in line and ("stale" in line) == stale, line


def test_check_missing_unreadable_or_incomplete(tree):
    assert gpu_lane.check(tree)[0] == 2 and "no record" in gpu_lane.check(tree)[1]
    (tree / gpu_lane.RECORD).write_text("{not json")
    assert gpu_lane.check(tree)[0] == 2 and "unreadable" in gpu_lane.check(tree)[1]
    _record(tree, parts=("tests",))
    code, line = gpu_lane.check(tree)
    assert code == 2 and "lacks part notebooks" in line, line


def test_check_from_the_command_line(tree):
    _record(tree)
    run = subprocess.run(
        [sys.executable, "-m", "kernels.gpu_lane", "--check", "--root", str(tree)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "KERNELS_INTERPRET": "1"},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("\n") == 1 and run.stdout.startswith("gpu lane: fresh and clean: 20 passed")


def test_check_needs_neither_torch_nor_triton(tree):
    """``--check`` reads a record and hashes files: on a machine without torch or triton it still answers."""
    _record(tree)
    hide = "import sys; sys.path = [p for p in sys.path if 'site-packages' not in p and 'dist-packages' not in p]"
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            f"{hide}; import runpy; sys.argv = ['gpu_lane', '--check', '--root', {str(tree)!r}]; "
            "runpy.run_module('kernels.gpu_lane', run_name='__main__')",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k not in ("KERNELS_INTERPRET", "TRITON_INTERPRET", "PYTHONPATH")},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("gpu lane: fresh and clean: 20 passed")
    assert "torch" not in run.stderr


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="2" tests="7">
  <testcase classname="tests.test_fp8" name="test_pass[bf16]" file="tests/test_fp8.py" line="3" time="0.1"/>
  <testcase classname="tests.test_fp8.TestGemm" name="test_fail" file="tests/test_fp8.py" line="9" time="0.1">
    <failure message="assert 1 == 2">tests/test_fp8.py:10: AssertionError</failure></testcase>
  <testcase classname="tests.test_fp8" name="test_teardown" file="tests/test_fp8.py" line="12" time="0.1">
    <error message="failed on teardown with &quot;RuntimeError&quot;">RuntimeError</error></testcase>
  <testcase classname="tests.test_fp8" name="test_mx" file="tests/test_fp8.py" line="20" time="0.0">
    <skipped type="pytest.skip" message="needs MX tensor cores (sm_100 or newer)">tests/test_fp8.py:21: needs</skipped>
  </testcase>
  <testcase classname="tests.test_old" name="test_known" time="0.0">
    <skipped type="pytest.xfail" message="a known rounding gap"/></testcase>
  <testcase classname="" name="tests.test_broken" file="tests/test_broken.py" time="0.0">
    <error message="collection failure">ImportError</error></testcase>
  <testcase classname="book.01_formats.ipynb" name="Cell 3" file="book/01_formats.ipynb" line="0" time="1.0"/>
</testsuite></testsuites>
"""


def test_junit_outcomes(tmp_path):
    (tmp_path / "junit.xml").write_text(JUNIT)
    found = gpu_lane.parse_junit(tmp_path / "junit.xml")
    assert found == {
        "passed": ["book/01_formats.ipynb::Cell 3", "tests/test_fp8.py::test_pass[bf16]"],
        "failed": [
            "tests/test_broken.py",
            "tests/test_fp8.py::TestGemm::test_fail",
            "tests/test_fp8.py::test_teardown",
        ],
        "skipped": {
            "tests.test_old::test_known": "xfail: a known rounding gap",
            "tests/test_fp8.py::test_mx": "needs MX tensor cores (sm_100 or newer)",
        },
    }


def test_a_part_for_another_tree_drops_the_other_part():
    env = {"device": "G", "capability": "9.0", "torch": "t", "triton": "r", "python": "p", "sha256": "a"}
    part = {"counts": {"passed": 2, "failed": 0, "skipped": 1}, "failed": [], "skipped": {"x": "why"}}
    rec, dropped = gpu_lane.merge(None, "tests", part, env)
    rec, dropped = gpu_lane.merge(rec, "notebooks", part, env)
    assert sorted(rec["parts"]) == ["notebooks", "tests"] and not dropped
    assert rec["totals"] == {"passed": 4, "failed": 0, "skipped": 2}
    rec, dropped = gpu_lane.merge(rec, "tests", part, {**env, "sha256": "b"})
    assert list(rec["parts"]) == ["tests"] and dropped == ["notebooks"] and rec["sha256"] == "b"
    rec, dropped = gpu_lane.merge(rec, "notebooks", part, {**env, "sha256": "b", "torch": "u"})
    assert list(rec["parts"]) == ["notebooks"] and dropped == ["tests"], "another stack is another record"


def test_the_lane_refuses_the_interpreter(monkeypatch, capsys):
    monkeypatch.setenv("KERNELS_INTERPRET", "1")
    assert gpu_lane.main(["--part", "tests", "--", "-k", "nothing"]) == 2
    assert "KERNELS_INTERPRET=1" in capsys.readouterr().err


def test_the_lane_writes_and_merges_its_record(tree, monkeypatch):
    ran = []

    def run_part(root, name, workers, extra, threads=1, log=None):
        ran.append((name, workers, extra))
        return {"counts": {"passed": 3, "failed": 0, "skipped": 0}, "failed": [], "skipped": {}, "workers": workers}

    _fake_lane(tree, monkeypatch, run_part)
    path = tree / gpu_lane.RECORD
    assert gpu_lane.main(["--part", "tests", "--root", str(tree), "--", "-k", "fp8"]) == 0
    assert not path.exists(), "a run restricted by extra pytest arguments writes no record"
    assert gpu_lane.main(["--part", "tests", "-n", "3", "--root", str(tree)]) == 0
    assert gpu_lane.check(tree)[0] == 2, "one part is not a record"
    assert gpu_lane.main(["--part", "notebooks", "--root", str(tree)]) == 0
    text = path.read_text()
    assert text.endswith("}\n") and text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    code, line = gpu_lane.check(tree)
    assert code == 0 and "6 passed" in line, line
    n = min(os.cpu_count(), 16)
    assert ran == [("tests", n, ["-k", "fp8"]), ("tests", 3, []), ("notebooks", n, [])]


def _fake_lane(tree, monkeypatch, run_part):
    env = {"device": "NVIDIA H200", "capability": "9.0", "torch": "2.11.0", "triton": "3.6.0", "python": "3.12.3"}
    env |= {"date": "2026-01-02T03:04:05+00:00", "commit": None, "sha256": gpu_lane.tree_sha256(tree)}
    monkeypatch.setattr(gpu_lane, "refusal", lambda: "")
    monkeypatch.setattr(gpu_lane, "environment", lambda root: env)
    monkeypatch.setattr(gpu_lane, "run_part", run_part)


def test_both_parts_run_side_by_side_and_each_is_kept_as_it_ends(tree, monkeypatch, tmp_path):
    ran, started = {}, threading.Barrier(2, timeout=10)

    def run_part(root, name, workers, extra, threads=1, log=None):
        ran[name] = (workers, threads, log)
        started.wait()  # both are running before either ends
        if name == "notebooks":
            time.sleep(0.3)
            raise KeyboardInterrupt  # cut short, as by a time limit
        return {"counts": {"passed": 3, "failed": 0, "skipped": 0}, "failed": [], "skipped": {}, "workers": workers}

    _fake_lane(tree, monkeypatch, run_part)
    monkeypatch.setattr(os, "cpu_count", lambda: 32)
    with pytest.raises(KeyboardInterrupt):
        gpu_lane.main(["-n", "16", "--root", str(tree), "--logs", str(tmp_path / "logs")])
    assert ran == {
        "tests": (10, 2, tmp_path / "logs" / "gpu_lane_tests.log"),
        "notebooks": (6, 2, tmp_path / "logs" / "gpu_lane_notebooks.log"),
    }
    rec = json.loads((tree / gpu_lane.RECORD).read_text())
    assert list(rec["parts"]) == ["tests"], "the part that ended is in the record, the one cut short is not"
    assert gpu_lane.check(tree)[0] == 2


def test_workers_split_between_the_parts():
    assert gpu_lane.split_workers(16) == {"tests": 10, "notebooks": 6}
    assert gpu_lane.split_workers(2) == {"tests": 1, "notebooks": 1}
    for n in range(2, 65):
        split = gpu_lane.split_workers(n)
        assert sum(split.values()) == n and min(split.values()) >= 1 and split["tests"] >= split["notebooks"]


def test_a_part_caps_threads_logs_its_output_and_names_its_slowest(tree, monkeypatch, tmp_path):
    seen = {}

    def fake_run(cmd, cwd, env, stdout, stderr):
        seen.update(env=env, out=stdout)
        junit = next(a for a in cmd if a.startswith("--junitxml=")).split("=", 1)[1]
        pathlib.Path(junit).write_text(JUNIT)
        print("pytest's output", file=stdout)
        return subprocess.CompletedProcess(cmd, 1)

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # the lane itself sets them for the tests it runs
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(gpu_lane.subprocess, "run", fake_run)
    part = gpu_lane.run_part(tree, "tests", 4, [], threads=3, log=tmp_path / "tests.log")
    assert seen["env"]["OMP_NUM_THREADS"] == "3" and seen["env"]["MKL_NUM_THREADS"] == "3"
    assert (tmp_path / "tests.log").read_text() == "pytest's output\n"
    assert part["counts"] == {"passed": 2, "failed": 3, "skipped": 2} and part["returncode"] == 1
    assert part["slowest"][0] == ["book/01_formats.ipynb::Cell 3", 1.0]
    assert part["slowest_files"][:2] == [["book/01_formats.ipynb", 1.0], ["tests/test_fp8.py", 0.3]]
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    gpu_lane.run_part(tree, "tests", 4, [], threads=3)
    assert seen["env"]["OMP_NUM_THREADS"] == "5" and seen["out"] is None, "a thread count the user set is kept"


def test_new_notebooks_then_the_slowest_of_the_last_run_start_first(tree, monkeypatch):
    _notebook(tree / "solutions/01.ipynb", "x = 1")
    assert gpu_lane.longest_first(tree) == ["book/01.ipynb", "labs/01.ipynb", "solutions/01.ipynb"], "no record"
    timed = [["solutions/01.ipynb", 9.5], ["labs/01.ipynb", 2.0]]
    last = {"parts": {"notebooks": {"command": "pytest labs/01.ipynb solutions/01.ipynb", "slowest_files": timed}}}
    (tree / gpu_lane.RECORD).write_text(json.dumps(last))
    order = gpu_lane.longest_first(tree)
    assert order == ["book/01.ipynb", "solutions/01.ipynb", "labs/01.ipynb"], "new first, then slowest"
    # a record that kept only the slowest files: a notebook it ran without a time is fast, not new
    last["parts"]["notebooks"].update(
        command="pytest solutions/01.ipynb book/01.ipynb labs/01.ipynb", slowest_files=timed[:1]
    )
    (tree / gpu_lane.RECORD).write_text(json.dumps(last))
    assert gpu_lane.longest_first(tree) == ["solutions/01.ipynb", "book/01.ipynb", "labs/01.ipynb"]
    last["parts"]["notebooks"].update(command="pytest solutions/01.ipynb labs/01.ipynb", slowest_files=timed)
    (tree / gpu_lane.RECORD).write_text(json.dumps(last))
    seen = []

    def fake_run(cmd, cwd, env, stdout, stderr):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(gpu_lane.subprocess, "run", fake_run)
    monkeypatch.setattr(gpu_lane.metadata, "version", lambda name: "3.8.0")
    part = gpu_lane.run_part(tree, "notebooks", 2, [])
    assert seen[0][-3:] == ["book/01.ipynb", "solutions/01.ipynb", "labs/01.ipynb"]
    assert "--no-loadscope-reorder" in seen[0], "xdist would reorder them by count of cells"
    assert part["command"].endswith("book/01.ipynb solutions/01.ipynb labs/01.ipynb")
    monkeypatch.setattr(gpu_lane.metadata, "version", lambda name: "3.6.1")
    gpu_lane.run_part(tree, "notebooks", 2, [])
    assert "--no-loadscope-reorder" not in seen[1], "an older xdist would refuse the flag"
    (tree / gpu_lane.RECORD).write_text('{"parts": {"notebooks": {"slowest_files": [["labs/01.ipynb"]]}}}')
    assert gpu_lane.longest_first(tree)[0] == "book/01.ipynb", "an unreadable record orders by path"


def _root_conftest():
    import importlib.util

    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_kernel_that_dies_while_starting_is_started_again():
    import nbval.kernel

    assert nbval.kernel.start_new_kernel.starts_again, "this session's nbval starts dying kernels again"
    starts = _root_conftest()._starting_again
    tries = []

    def dies(times, error="Kernel died before replying to kernel_info"):
        def start(**kwargs):
            tries.append(kwargs)
            if len(tries) <= times:
                raise RuntimeError(error)
            return "km", "kc"

        return start

    with pytest.warns(UserWarning, match="died while starting"):
        assert starts(dies(2))(kernel_name="python3") == ("km", "kc")
    assert tries == [{"kernel_name": "python3"}] * 3
    tries.clear()
    with pytest.raises(RuntimeError, match="died before replying"), pytest.warns(UserWarning):
        starts(dies(3))()
    assert len(tries) == 3, "three deaths are an error"
    tries.clear()
    with pytest.raises(RuntimeError, match="no such kernel"):
        starts(dies(1, "no such kernel"))()
    assert len(tries) == 1, "only a kernel that died is started again"
