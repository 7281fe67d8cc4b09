"""Notebook reports: executed by papermill, stamped, and checked by nbval without a second execution."""
import subprocess
import sys

import nbformat
import pytest

from oocgnn.reports import STAMP_KEY, close, current_report, execute, stamp

CONFTEST = '''
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    from oocgnn.reports import prepare_nbval_items
    prepare_nbval_items(items, {executed!r})
'''


def _notebook(path, source, outputs=()):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(source)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=t) for t in outputs]
    nb.cells = [nbformat.v4.new_markdown_cell("# a report"), cell]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def _report(source_path, executed_dir, outputs):
    """A report of `source_path` as `execute` writes it, with `outputs` as its cell's outputs."""
    nb = nbformat.read(source_path, as_version=4)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text=t) for t in outputs]
    nb.metadata[STAMP_KEY] = stamp(source_path)
    executed_dir.mkdir(exist_ok=True)
    nbformat.write(nb, executed_dir / source_path.name)


def test_the_stamp_follows_the_notebook(tmp_path):
    a = _notebook(tmp_path / "a.ipynb", "print(2)")
    b = tmp_path / "b.ipynb"
    b.write_bytes(a.read_bytes())
    assert stamp(a) == stamp(b)                    # content, not the path
    _notebook(b, "print(3)")
    assert stamp(a) != stamp(b)


def test_only_a_current_report_of_the_same_cells_is_taken(tmp_path):
    src = _notebook(tmp_path / "n.ipynb", "print(1 + 1)", ["2\n"])
    executed = tmp_path / "executed"
    assert current_report(src, executed) is None   # none yet
    _report(src, executed, ["2\n"])
    assert current_report(src, executed) is not None
    _notebook(src, "print(1 + 2)", ["3\n"])        # the source changed since: execute again
    assert current_report(src, executed) is None
    (executed / "n.ipynb").write_text("{ half a file")
    assert current_report(src, executed) is None


def test_execute_writes_a_stamped_report(tmp_path):
    src = _notebook(tmp_path / "n.ipynb", "print(6 * 7)")
    out = execute(src, tmp_path / "executed", log=lambda *a: None)
    nb = current_report(src, tmp_path / "executed")
    assert out.is_file() and nb is not None and nb.cells[1].outputs[0]["text"] == "42\n"
    assert not list((tmp_path / "executed").glob(".*tmp*"))


def _nbval(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval",
                           str(tmp_path / "n.ipynb"), *args], cwd=tmp_path, capture_output=True, text=True)


def test_nbval_checks_a_current_report_without_executing_it(tmp_path):
    # executed, this cell would fail (there is no such file): a pass means its report was checked instead
    src = _notebook(tmp_path / "n.ipynb", "print(open('no-such-file').read())", ["hello\n"])
    (tmp_path / "conftest.py").write_text(CONFTEST.format(executed=str(tmp_path / "executed")))
    _report(src, tmp_path / "executed", ["hello\n"])
    r = _nbval(tmp_path)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-2000:]
    _report(src, tmp_path / "executed", ["goodbye\n"])   # a report whose outputs differ fails the check
    r = _nbval(tmp_path)
    assert r.returncode == 1 and "Cell outputs differ" in r.stdout, r.stdout[-2000:]
    (tmp_path / "executed" / "n.ipynb").unlink()       # no report: nbval executes the cell (and it fails)
    r = _nbval(tmp_path)
    assert r.returncode == 1 and "FileNotFoundError" in r.stdout, r.stdout[-2000:]


@pytest.mark.parametrize("a, b, ok", [
    ("0.868", "0.869", True), ("0.851", "0.853", True), ("0.868", "0.872", False), ("0.868", "0.880", False),
    ("-1.6", "-1.8", True), ("-1.6", "-1.9", True), ("-1.6", "-2.0", False), ("-2.178", "-2.189", True),
    ("295.402", "295.402", True),
    ("295.402", "301.0", False), ("0.0", "0.005", False), ("0.871", "0.868", True),
])
def test_floats_are_close_within_another_cpus_rounding(a, b, ok):
    assert close(a, b) is ok and close(b, a) is ok


@pytest.mark.parametrize("report, ok", [
    ("acc 0.868 after 480 steps\n", True),      # the third decimal moved: another processor's rounding
    ("acc 0.900 after 480 steps\n", False),     # a real change
    ("acc 0.869 after 481 steps\n", False),     # integers stay exact
    ("acc 0.869 after 480 epochs\n", False),    # so do words
])
def test_nbval_tolerates_rounding_in_printed_floats_only(tmp_path, report, ok):
    src = _notebook(tmp_path / "n.ipynb", "print(open('no-such-file').read())", ["acc 0.869 after 480 steps\n"])
    (tmp_path / "conftest.py").write_text(CONFTEST.format(executed=str(tmp_path / "executed")))
    _report(src, tmp_path / "executed", [report])
    r = _nbval(tmp_path)
    assert (r.returncode == 0) is ok, r.stdout[-2000:]


def test_the_command_refuses_a_missing_notebook(tmp_path):
    r = subprocess.run([sys.executable, "-m", "oocgnn.reports", str(tmp_path / "nope.ipynb"), "--out", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "no such notebook" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("flag", ["--help"])
def test_the_command_has_help(flag):
    r = subprocess.run([sys.executable, "-m", "oocgnn.reports", flag], capture_output=True, text=True)
    assert r.returncode == 0 and "--jobs" in r.stdout and "default" in r.stdout


def test_two_at_a_time_from_another_directory_with_a_failing_notebook(tmp_path, monkeypatch):
    """Relative notebook paths, two processes (papermill changes its process's working directory), and a
    failing notebook: the other's report is still written, the command exits 1 naming the failure."""
    good = _notebook(tmp_path / "good.ipynb", "print(6 * 7)")
    _notebook(tmp_path / "bad.ipynb", "raise ValueError('broken on purpose')")
    r = subprocess.run([sys.executable, "-m", "oocgnn.reports", "good.ipynb", "bad.ipynb", "--jobs", "2",
                        "--out", "executed"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 1 and "bad.ipynb failed" in r.stderr and "broken on purpose" in r.stderr, r.stderr
    assert "executed 1 of 2" in r.stdout
    assert current_report(good, tmp_path / "executed") is not None
    assert not (tmp_path / "executed" / "bad.ipynb").exists()


def test_the_stamp_follows_the_library_in_its_subpackages(tmp_path, monkeypatch):
    """A report made before a policy module (in `oocgnn/policies/`) changed is not current: the stamp hashes
    every module of the package, subpackages included, by its path."""
    import oocgnn.reports as reports
    repo = tmp_path / "repo"
    (repo / "oocgnn" / "policies").mkdir(parents=True)
    (repo / "oocgnn" / "train.py").write_text("x = 1\n")
    module = repo / "oocgnn" / "policies" / "outre.py"
    module.write_text("y = 1\n")
    monkeypatch.setattr(reports, "REPO", repo)
    nb = _notebook(tmp_path / "a.ipynb", "print(2)")
    before = stamp(nb)
    module.write_text("y = 2\n")
    assert stamp(nb) != before
    module.write_text("y = 1\n")
    assert stamp(nb) == before
    module.rename(repo / "oocgnn" / "policies" / "outre2.py")
    assert stamp(nb) != before
