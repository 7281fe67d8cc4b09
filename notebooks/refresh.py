"""Re-execute the source notebooks in place, as `make test` will check them, and clean them.

Usage: python notebooks/refresh.py [NOTEBOOK ...]   (default: every notebooks/NN_*.ipynb)

Runs each notebook top to bottom (samples are the same at any thread count; nbval compares the
stored outputs), then drops execution counts and volatile metadata so the committed notebooks
stay clean, and records how long it ran (`oocgnn_seconds`: `oocgnn.reports --jobs` starts the
longest first).
"""
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from oocgnn.reports import KERNEL_ARGS, SECONDS_KEY, same_kernels_on_x86

HERE = Path(__file__).resolve().parent


def refresh(path: Path):
    same_kernels_on_x86()                  # as the reports run: the outputs repeat on another x86 processor
    nb = nbformat.read(path, as_version=4)
    t = time.perf_counter()
    # executed as the reports are (`oocgnn.reports.KERNEL_ARGS`): the outputs nbval will see
    NotebookClient(nb, timeout=1800, kernel_name="python3", extra_arguments=KERNEL_ARGS,
                   resources={"metadata": {"path": str(HERE)}}).execute()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.execution_count = None
            for out in cell.outputs:
                if "execution_count" in out:
                    out["execution_count"] = None
    nb.metadata.pop("widgets", None)
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata[SECONDS_KEY] = round(time.perf_counter() - t)   # `oocgnn.reports --jobs` runs the longest first
    nbformat.write(nb, path)
    print(f"refreshed {path.name}")


if __name__ == "__main__":
    targets = [Path(p) for p in sys.argv[1:]] or sorted(HERE.glob("[0-9][0-9]_*.ipynb"))
    for p in targets:
        refresh(p.resolve())
