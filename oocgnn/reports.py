"""Notebooks executed as reports (papermill), stamped so that `make test` can check them without running them again.

`python -m oocgnn.reports [NOTEBOOK ...] [--out notebooks/executed] [--jobs 2]` executes each notebook
top to bottom into `--out` with papermill (the source is never edited: STYLE 16), figures going to
`<out>/figures` so the committed `figures/` stay as `make notebooks` left them. Each executed copy
carries a stamp: a hash of its source notebook, of the library's code (every module of oocgnn/, subpackages included), of the pinned
stack and of the real datasets present. `notebooks/conftest.py` lets nbval check the outputs of an
executed copy whose stamp is current instead of executing the notebook a second time; any other
notebook nbval executes as usual.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import math
import multiprocessing
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
STAMP_KEY = "oocgnn_report_stamp"
# nbval's kernels run under pytest, where ipykernel does not forward what subprocesses write to fd 1/2
# (train_fresh's notes); executed the same way, a report holds the outputs nbval would see
KERNEL_ARGS = ["--IPKernelApp.capture_fd_output=False"]


def same_kernels_on_x86():
    """Have torch run its AVX2 kernels on an x86 processor with AVX-512 too (ATEN_CPU_CAPABILITY, unless set):
    a matmul's float rounding follows the vector width, and a model trained for hundreds of steps carries it
    past `close`'s tolerance (notebook 08's BETA moved 1.2 points of MRR on one seed). The kernels, and runs
    they start, inherit it; the stored outputs were made so."""
    os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")


def stamp(notebook) -> str:
    """What a report's outputs depend on: the source notebook, the library's code, the pinned stack and
    the real datasets beside the project (their names and sizes)."""
    h = hashlib.sha256()
    h.update(Path(notebook).read_bytes())
    for path in sorted((REPO / "oocgnn").rglob("*.py")) + [REPO / "requirements.txt"]:   # subpackages too
        if path.is_file():
            h.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes())
    datasets = REPO.parent / "shared" / "datasets"
    for path in sorted(datasets.glob("*.npz")) if datasets.is_dir() else []:
        h.update(f"{path.name}:{path.stat().st_size}".encode())
    h.update(sys.version.encode())
    return h.hexdigest()


def current_report(notebook, executed_dir=None):
    """The executed copy of `notebook` (an nbformat notebook) if its stamp is current and its code cells
    are the source's, else None."""
    import nbformat
    executed = Path(executed_dir or NOTEBOOKS / "executed") / Path(notebook).name
    if not executed.is_file():
        return None
    try:
        nb = nbformat.read(executed, as_version=4)
    except Exception:                     # a half-written or foreign file: execute instead
        return None
    if nb.metadata.get(STAMP_KEY) != stamp(notebook):
        return None
    source = nbformat.read(notebook, as_version=4)
    code = [c.source for c in source.cells if c.cell_type == "code"]
    if [c.source for c in nb.cells if c.cell_type == "code"] != code:   # e.g. parameters injected
        return None
    return nb


FLOAT = re.compile(r"-?\d+\.\d+")
ULPS = 3          # a checked float may move by 3 units of its last printed digit or of its third significant one


def close(a: str, b: str) -> bool:
    """Whether two printed floats agree within what another CPU or thread count moves them: `ULPS` units of
    the last digit printed or of the third significant digit, whichever is larger (numba's fastmath
    reductions and torch's kernels follow the processor's vector width and threads; a model trained for
    hundreds of steps carries such differences to the third decimal of an accuracy: 0.868 on one machine,
    0.869 on another, and a difference of two such means, in points, by 0.2)."""
    x, y = float(a), float(b)
    digits = max(len(a.partition(".")[2]), len(b.partition(".")[2]))
    size = max(abs(x), abs(y))
    third = 10.0 ** (math.floor(math.log10(size)) - 2) if size > 0 else 0.0
    return abs(x - y) <= ULPS * max(10.0 ** -digits, third) + 1e-12


def _masked(outputs) -> tuple:
    """(outputs with every printed float replaced by a mark, the floats in order)."""
    found = []

    def mask(v):
        if isinstance(v, str):
            found.extend(FLOAT.findall(v))
            return FLOAT.sub("<float>", v)
        if isinstance(v, list):
            return [mask(x) for x in v]
        if isinstance(v, dict):
            return type(v)({k: mask(x) for k, x in v.items()})
        return v
    return [mask(copy.deepcopy(o)) for o in outputs], found


def tolerate_float_rounding(item):
    """nbval's comparison of `item`, but where it fails, equal again once every float is masked and each
    pair of floats `close`: integers, words and layout stay exact."""
    strict = item.compare_outputs

    def compare_outputs(test, ref, skip_compare=None):
        if strict(test, ref, skip_compare):
            return True
        why = item.comparison_traceback
        (mt, ft), (mr, fr) = _masked(test), _masked(ref)
        if len(ft) == len(fr) and all(map(close, ft, fr)) and strict(mt, mr, skip_compare):
            return True
        item.comparison_traceback = why
        return False
    item.compare_outputs = compare_outputs


def _replay(item, outputs):
    """nbval's `IPyNbCell.runtest`, with the outputs a report holds in place of a kernel's."""
    import pytest
    from nbval.plugin import coalesce_streams

    def runtest():
        if item.options["skip"]:
            pytest.skip()
        errors = [o for o in outputs if o.get("output_type") == "error"]
        if errors and not item.options["check_exception"]:
            item.raise_cell_error("Cell execution caused an exception (in the report)",
                                  "\n" + "\n".join(errors[0].get("traceback", [])))
        if item.options["check"] and item.cell.execution_count is not None:
            if not item.compare_outputs(coalesce_streams(list(outputs)), coalesce_streams(item.cell.outputs)):
                item.raise_cell_error("Cell outputs differ (from the report `make run` executed)",
                                      "\n".join(item.comparison_traceback))
    item.runtest = runtest


def prepare_nbval_items(items, executed_dir=None):
    """What `notebooks/conftest.py` does to nbval's cells before they run:
    - a clean committed notebook has no execution counts, yet its stored outputs are the reference:
      mark every code cell with outputs as run;
    - printed floats are compared within another CPU's rounding (`close`), the rest exactly;
    - a notebook with a current report (`current_report`) is checked from it: each cell's outputs
      compared by nbval's own rules, no kernel started, nothing executed a second time."""
    reports = {}
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is None:
            continue
        path = str(item.parent.path)
        tolerate_float_rounding(item)
        if cell.get("outputs") and cell.get("execution_count") is None:
            cell["execution_count"] = 0
        if path not in reports:
            reports[path] = current_report(path, executed_dir)
            if reports[path] is not None:
                item.parent.setup = lambda: None
        if reports[path] is not None:
            code = [c for c in reports[path].cells if c.cell_type == "code"]
            _replay(item, code[item.cell_num].outputs)


SECONDS_KEY = "oocgnn_seconds"     # a notebook's run time where `make notebooks` last executed it


def expected_seconds(notebook) -> float:
    """How long `notebook` took when `notebooks/refresh.py` last executed it (0 when not recorded)."""
    import nbformat
    return float(nbformat.read(notebook, as_version=4).metadata.get(SECONDS_KEY, 0))


def execute(notebook, out_dir, log=print) -> Path:
    """Execute `notebook` with papermill into `out_dir` and stamp the copy; returns its path."""
    import nbformat
    import papermill
    notebook, out_dir = Path(notebook).resolve(), Path(out_dir).resolve()
    out = out_dir / notebook.name
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.stem}.tmp-{os.getpid()}.ipynb")
    key = stamp(notebook)                  # of the code that runs, not of edits made meanwhile
    t = time.perf_counter()
    papermill.execute_notebook(str(notebook), str(tmp), cwd=str(notebook.parent), kernel_name="python3",
                               progress_bar=False, extra_arguments=KERNEL_ARGS)
    nb = nbformat.read(tmp, as_version=4)
    nb.metadata[STAMP_KEY] = key
    nbformat.write(nb, tmp)
    tmp.replace(out)                       # a killed run never leaves a stamped half report
    log(f"executed {notebook.name} -> {out} in {time.perf_counter() - t:.0f} s")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m oocgnn.reports", description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="*", help="notebooks to execute (default: every notebooks/NN_*.ipynb)")
    ap.add_argument("--out", default=str(NOTEBOOKS / "executed"),
                    help="directory for the executed copies (default notebooks/executed)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="notebooks executed at once, the longest first by the run time `make notebooks` "
                         "recorded, each with its share of the cores (OMP_NUM_THREADS and NUMBA_NUM_THREADS "
                         "unless set; default 1: one at a time, in the order given, every core each)")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("--jobs must be >= 1")
    notebooks = [Path(p).resolve() for p in args.notebooks] or sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    missing = [str(p) for p in notebooks if not p.is_file()]
    if missing:
        print(f"oocgnn.reports: error: no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    (out / "figures").mkdir(parents=True, exist_ok=True)
    os.environ["OOCGNN_FIGURES"] = str((out / "figures").resolve())   # the kernels inherit it
    same_kernels_on_x86()
    bin_dir = str(Path(sys.executable).parent)                           # the kernel is this environment's
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    t = time.perf_counter()
    if args.jobs > 1:                      # the longest first: the last to start is then a short one
        notebooks = sorted(notebooks, key=expected_seconds, reverse=True)
        # each kernel and the runs it starts get their share of the cores: two notebooks each using every
        # core (torch's and numba's pools) took 530 s on 2 cores from a fresh clone, one thread each 355 s
        share = str(max(1, (os.cpu_count() or 1) // args.jobs))
        for var in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS"):
            os.environ.setdefault(var, share)
    # a process each: papermill changes the working directory of the process that runs it
    failed = []
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for nb, future in [(nb, pool.submit(execute, nb, out)) for nb in notebooks]:
            try:
                future.result()
            except Exception as e:         # papermill names the cell; the other notebooks still run
                failed.append(nb.name)
                print(f"oocgnn.reports: error: {nb.name} failed: {str(e).strip()[-2000:]}", file=sys.stderr)
    print(f"executed {len(notebooks) - len(failed)} of {len(notebooks)} notebooks in {time.perf_counter() - t:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
