"""Sweeps and the widgets that wrap them."""
import pytest

from oocgnn.config import TrainConfig
from oocgnn.errors import UserError
from oocgnn.sweep import run_grid, sweep


def _base(store):
    return TrainConfig(store=str(store.path), epochs=1, batch_size=512, max_eval_nodes=100, progress=False)


def test_grid_runs_every_combination_and_seed(tiny_store, tmp_path):
    logs, summary = run_grid(_base(tiny_store), {"hidden": [8, 16], "dropout": [0.0, 0.5]}, seeds=(0, 1),
                             out_root=tmp_path)
    assert len(summary) == 8
    assert set(map(tuple, summary[["hidden", "dropout", "seed"]].values.tolist())) == \
        {(h, d, s) for h in (8, 16) for d in (0.0, 0.5) for s in (0, 1)}
    assert set(logs["hidden"]) == {8, 16} and {"wall_s", "val_acc"} <= set(logs.columns)
    assert (summary["train_s"] > 0).all()


def test_unknown_knob_is_a_user_error(tiny_store, tmp_path):
    with pytest.raises(UserError, match="unknown setting"):
        sweep(_base(tiny_store), "warp_factor", [1, 2], out_root=tmp_path)


def test_widget_builds_headless(tiny_store):
    from oocgnn.widgets import sweep_widget
    box = sweep_widget(_base(tiny_store), {"static_ratio": [0.0, 0.01], "passes": [1, 2]})
    assert box.children and len(box.children) == 3
