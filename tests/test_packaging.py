"""One source of truth for the pinned stack: environment.yml repeats requirements.txt exactly."""
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _pins(lines):
    return sorted(l.strip() for l in lines if l.strip() and not l.strip().startswith("#"))


def test_environment_yml_lists_the_requirements_pins():
    req = _pins((REPO / "requirements.txt").read_text().splitlines())
    env = (REPO / "environment.yml").read_text().splitlines()
    start = next(i for i, l in enumerate(env) if l.strip() == "- pip:")
    pip = [l.strip()[2:] for l in env[start + 1:] if l.strip().startswith("- ")]
    assert _pins(p for p in pip if p != "-e .") == req
    assert "torch==2.13.0" in req, "torch must stay pinned (unpinned pulls CUDA wheels)"


def _project():
    import tomllib
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _third_party_imports(path: Path) -> set:
    """Top-level modules imported anywhere in a file (at module level or inside functions)."""
    import ast
    import sys
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "oocgnn"}


# imported only where an extra is needed: dgl (METIS, adapters, oracle tests), the lab's widgets, io_uring
OPTIONAL = {"dgl": "dgl", "IPython": "lab", "ipywidgets": "lab", "liburing": "uring", "papermill": "lab",
            "nbformat": "lab", "nbval": "lab", "pytest": "test"}


def test_pyproject_declares_every_runtime_import():
    """`pip install .` must give an oocgnn that imports: every third-party module the package imports
    is a dependency, or an extra's (and then imported lazily, where it is needed)."""
    project = _project()
    declared = {d.split(">")[0].split("=")[0].split("<")[0].strip().lower() for d in project["dependencies"]}
    extras = project["optional-dependencies"]
    for path in sorted((REPO / "oocgnn").rglob("*.py")):          # subpackages too (oocgnn/policies/)
        for name in _third_party_imports(path):
            if name in OPTIONAL:
                assert any(name.lower() in d.lower() for d in extras[OPTIONAL[name]]), (path.name, name)
            else:
                assert name.lower() in declared, f"{path.name} imports {name}, which pyproject.toml does not declare"
    assert "dgl" not in " ".join(project["dependencies"]), "dgl is an extra, not a dependency"
    from packaging.specifiers import SpecifierSet
    pythons = SpecifierSet(project["requires-python"])
    assert "3.11" in pythons and "3.12" in pythons, "the dgl-free path runs here (3.11) and on the GPU box (3.12)"


def test_pip_install_into_a_fresh_venv_gives_a_working_oocgnn(tmp_path):
    """The package and its declared dependencies only (no requirements.txt) in a fresh venv: `oocgnn
    --help` works and the training path imports, without dgl. torch is pinned on the install line
    as everywhere here (unpinned, pip would pull GBs of CUDA wheels)."""
    import shutil
    import subprocess
    import sys
    src = tmp_path / "src"                       # a copy: building in the checkout would leave build/ there
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "oocgnn", src / "oocgnn", ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "torch==2.13.0", str(src)],
                       capture_output=True, text=True, timeout=1800)
    if r.returncode and any(s in r.stderr for s in ("Failed to establish", "No matching distribution",
                                                     "Temporary failure in name resolution")):
        pytest.skip(f"no package index reachable: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([str(venv / "bin" / "oocgnn"), "--help"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "train" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([str(venv / "bin" / "python"), "-c",
                        "import importlib.util, oocgnn.train, oocgnn.models, oocgnn.cli; "
                        "print(importlib.util.find_spec('dgl') is None)"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stdout + r.stderr


def test_what_make_run_writes_is_ignored_by_git():
    """`make run` leaves `git status` clean (.ci/run checks it after the run): every place it writes
    is ignored, and the Makefile writes where this test looks."""
    import shutil
    import subprocess
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    make = (REPO / "Makefile").read_text()
    assert "--figure figures/00_time_to_accuracy" in make and "--out runs/compare-small" in make
    assert "-m oocgnn.reports" in make
    from oocgnn.reports import NOTEBOOKS
    written = ["figures/00_time_to_accuracy.png", "figures/00_time_to_accuracy.csv",
               "runs/compare-small/inmemory/log.csv",
               "data/small-metis-256/meta.json", "data/partitions/x.npz",
               str((NOTEBOOKS / "executed" / "04_out_of_core_training.ipynb").relative_to(REPO)),
               str((NOTEBOOKS / "executed" / "figures" / "04_policies.png").relative_to(REPO)),
               "oocgnn/__pycache__/sampler.cpython-311.nbi"]       # numba's cache
    r = subprocess.run(["git", "check-ignore", "--no-index", *written], cwd=REPO, capture_output=True, text=True)
    assert sorted(r.stdout.split()) == sorted(written), f"not ignored: {set(written) - set(r.stdout.split())}"
