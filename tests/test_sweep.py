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


def test_widget_runs_the_sweep_it_shows(tiny_store, tmp_path):
    """Pressing Run sweep trains the policy and values the form shows, and draws one line per value."""
    import matplotlib
    matplotlib.use("Agg")
    from oocgnn.widgets import sweep_widget
    box = sweep_widget(_base(tiny_store), {"hidden": [8, 16], "dropout": [0.0]}, out_root=tmp_path)
    (policy, knob, values), (epochs, run), _ = (c.children if hasattr(c, "children") else c for c in box.children)
    assert knob.value == "hidden" and values.value == "8, 16"
    knob.value = "dropout"
    assert values.value == "0.0", "choosing a knob shows its values"
    knob.value, values.value, epochs.value = "hidden", "8, 12", 1
    run.click()
    logs, summary, fig = box.result
    assert list(summary["hidden"]) == [8, 12] and (summary["policy"] == policy.value).all()
    assert len(fig.axes[0].lines) == 2 and sorted(logs["epoch"].unique()) == [0]
