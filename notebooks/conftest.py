"""nbval glue (`make test` runs the notebooks after the tests, in one process): stored outputs are the
reference even in clean notebooks, and a report `make run` executed on this very code is checked without
running the notebook again (`oocgnn.reports.prepare_nbval_items`)."""
import os
import tempfile

import pytest

from oocgnn.reports import same_kernels_on_x86

# checking a notebook must not rewrite the committed figures/ (timings differ run to run)
os.environ.setdefault("OOCGNN_FIGURES", tempfile.mkdtemp(prefix="oocgnn-figures-"))
same_kernels_on_x86()        # a notebook nbval executes runs torch's kernels as the reports do


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    from oocgnn.reports import prepare_nbval_items
    prepare_nbval_items(items)
