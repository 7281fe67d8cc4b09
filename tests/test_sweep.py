"""Sweeps and the widgets that wrap them."""
import html

import pytest

from oocgnn.config import TrainConfig
from oocgnn.errors import UserError
from oocgnn.sweep import run_grid, sweep


def _base(store):
    return TrainConfig(store=str(store.path), epochs=1, batch_size=512, max_eval_nodes=100, progress=False)


def test_grid_runs_every_combination_and_seed(tiny_store, tmp_path):
    """Every combination and seed is trained once; `on_run` hears of each before it starts."""
    started = []
    logs, summary = run_grid(_base(tiny_store), {"hidden": [8, 16], "dropout": [0.0, 0.5]}, seeds=(0, 1),
                             out_root=tmp_path, on_run=lambda i, n, settings: started.append((i, n, settings)))
    assert len(summary) == 8
    assert [(i, n) for i, n, _ in started] == [(i, 8) for i in range(8)]
    assert started[-1][2] == {"hidden": 16, "dropout": 0.5, "seed": 1}
    assert set(map(tuple, summary[["hidden", "dropout", "seed"]].values.tolist())) == \
        {(h, d, s) for h in (8, 16) for d in (0.0, 0.5) for s in (0, 1)}
    assert set(logs["hidden"]) == {8, 16} and {"wall_s", "val_acc"} <= set(logs.columns)
    assert (summary["train_s"] > 0).all()


def test_unknown_knob_is_a_user_error(tiny_store, tmp_path):
    with pytest.raises(UserError, match="unknown setting"):
        sweep(_base(tiny_store), "warp_factor", [1, 2], out_root=tmp_path)


def _images(out) -> int:
    return sum("image/png" in o.get("data", {}) for o in out.outputs)


def test_widget_runs_the_sweep_it_shows(tiny_store, tmp_path):
    """Pressing Run sweep trains the policy and values the form shows, counts its runs in the progress bar,
    and puts the table and the plots (a PNG) into its own output, where JupyterLab shows them."""
    import matplotlib
    matplotlib.use("Agg")
    from oocgnn.widgets import sweep_widget
    box = sweep_widget(_base(tiny_store), {"hidden": [8, 16], "dropout": [0.0]}, out_root=tmp_path)
    c = box.controls
    assert c["knob"].value == "hidden" and c["values"].value == "8, 16"
    c["knob"].value = "dropout"
    assert c["values"].value == "0.0", "choosing a knob shows its values"
    seen = []
    c["progress"].observe(lambda ch: seen.append(ch["new"]), names="value")
    c["knob"].value, c["values"].value, c["epochs"].value = "hidden", "8, 12", 1
    assert [m for _, m in c["metric"].options] == ["acc", "f1"], "8 classes: no ROC-AUC"
    c["metric"].value = "f1"
    c["run"].click()
    logs, summary, fig = box.result
    assert list(summary["hidden"]) == [8, 12] and (summary["policy"] == c["policy"].value).all()
    assert fig.axes[0].get_ylabel() == "validation macro-F1" and summary["test_f1_at_best_val"].notna().all()
    assert len(fig.axes[0].lines) == 2 and sorted(logs["epoch"].unique()) == [0]
    assert seen[-1] == c["progress"].max == 2 and 1 in seen, seen
    assert "run 2 of 2 finished" in c["status"].value
    assert _images(c["output"]) == 1
    assert any("text/html" in o["data"] and "<table" in o["data"]["text/html"] for o in c["output"].outputs)
    c["values"].value = "8"
    c["run"].click()                                    # redrawn, not appended
    assert _images(c["output"]) == 1 and list(box.result[1]["hidden"]) == [8]


@pytest.mark.parametrize("knob, text, words", [("hidden", "8, lots", "'lots' is not one"),
                                                ("hidden", " , ", "at least one value"),
                                                ("hidden", "0", "hidden")])
def test_widget_shows_an_error_as_one_line(tiny_store, tmp_path, knob, text, words):
    """A bad value, or a run that fails, is one line in the widget's status; the last result stays."""
    from oocgnn.widgets import sweep_widget
    box = sweep_widget(_base(tiny_store), {"hidden": [8]}, out_root=tmp_path)
    c = box.controls
    c["knob"].value, c["values"].value = knob, text
    c["run"].click()
    status = html.unescape(c["status"].value)
    print(status)
    assert "error: " in status and words in status and "Traceback" not in status, status
    assert status.count("<br") == 0 and box.result is None and not c["run"].disabled


def test_widget_shows_a_failed_run_as_its_type_and_message(tiny_store, tmp_path, monkeypatch):
    import oocgnn.widgets as widgets

    def crash(*args, **kwargs):
        raise RuntimeError("worker died\nTraceback (most recent call last): ...")
    monkeypatch.setattr(widgets, "sweep", crash)
    box = widgets.sweep_widget(_base(tiny_store), {"hidden": [8]}, out_root=tmp_path)
    box.controls["run"].click()
    assert "error: RuntimeError: worker died<" in html.unescape(box.controls["status"].value)
    assert box.controls["output"].outputs == () and not box.controls["run"].disabled


def test_error_line_is_one_readable_line():
    from oocgnn.widgets import error_line
    assert error_line(UserError("hidden must be positive\nsee --help")) == "hidden must be positive"
    assert error_line(ValueError("bad shape\n  more")) == "ValueError: bad shape"
    assert error_line(KeyError()) == "KeyError"


def test_figure_explorer_redraws_and_reports_errors():
    """The explorer shows draw()'s figure as a PNG in its output, replaces it when a control moves, and
    shows draw()'s error as one status line, clearing it on the next good draw."""
    import ipywidgets as w
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from oocgnn.widgets import figure_explorer

    def draw(kind, n):
        if n > 5:
            raise UserError(f"n must be at most 5, got {n}")
        fig, ax = plt.subplots()
        ax.plot(range(n)) if kind == "line" else ax.bar(range(n), range(n))
        return fig
    box = figure_explorer(draw, kind=["line", "bar"], n=w.IntSlider(3, min=1, max=9))
    c = box.controls
    first = c["output"].outputs[0]["data"]["image/png"]
    assert len(box.figure.axes[0].lines) == 1
    c["n"].value = 4
    assert len(c["output"].outputs) == 1 and c["output"].outputs[0]["data"]["image/png"] != first
    c["kind"].value = "bar"
    assert len(box.figure.axes[0].lines) == 0 and len(box.figure.axes[0].patches) == 4
    c["n"].value = 7
    assert "error: n must be at most 5, got 7" in c["status"].value
    c["n"].value = 2
    assert c["status"].value == "" and len(c["output"].outputs) == 1


def test_widget_warns_before_a_sweep_of_values_that_mix_poorly(by_label, tmp_path):
    """Mega-batches of 2 of 16 parts of a store ordered by label, a step per mini-batch, warn (one line, before
    the runs); the table carries the mixing."""
    import matplotlib
    matplotlib.use("Agg")
    from oocgnn.widgets import sweep_widget
    base = TrainConfig(store=str(by_label.path), policy="hierbatching", epochs=1, max_steps=2, batch_size=64,
                       max_eval_nodes=50, progress=False, accumulate="off")
    box = sweep_widget(base, {"parts_per_megabatch": [2, 16]}, out_root=tmp_path)
    box.controls["run"].click()
    warned = box.controls["warnings"].value
    assert warned.count("warning: ") == 1 and "parts_per_megabatch=2:" in warned and "=16" not in warned
    summary = box.result[1]
    assert summary["mixing_warns"].tolist() == [True, False]
    assert summary["mixing_parts_mean"].tolist() == [2, 16] and summary["mixing_tv_mean"].iloc[1] == 0
