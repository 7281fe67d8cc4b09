"""Notebook figures: written to figures/ by default, elsewhere when checking notebooks; link runs' curves averaged over seeds."""
import matplotlib
import pytest

matplotlib.use("Agg")

from oocgnn import plots  # noqa: E402


def test_savefig_honours_oocgnn_figures(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt
    monkeypatch.setenv("OOCGNN_FIGURES", str(tmp_path / "figs"))
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    plots.savefig(fig, "00_check")
    plt.close(fig)
    assert (tmp_path / "figs" / "00_check.png").stat().st_size > 0
    assert plots.setup_notebook().figures == tmp_path / "figs"
    monkeypatch.delenv("OOCGNN_FIGURES")
    assert plots.figures_dir() == plots.REPO / "figures"


def test_link_curves_average_seeds_evaluation_by_evaluation():
    """Two seeds of one label and one of another: the mean and std at each evaluation, epochs from the log."""
    import pandas as pd
    import matplotlib.pyplot as plt

    def log(label, seed, mrr):
        return pd.DataFrame({"label": label, "seed": seed, "epoch": [0, 0, 1], "step": [0, 5, 10],
                             "wall_s": [0.0, 1.0 + seed, 2.0 + seed], "val_mrr": mrr, "test_mrr": mrr})
    logs = pd.concat([log("comet", 0, [0.1, 0.2, 0.3]), log("comet", 1, [0.1, 0.4, 0.5]),
                      log("inmemory", 0, [0.1, 0.3, 0.6])])
    c = plots.link_curves(logs)
    comet = c[c.label == "comet"]
    assert comet["epochs"].tolist() == [0, 1, 2] and comet["seeds"].tolist() == [2, 2, 2]
    assert comet["val_mrr_mean"].tolist() == pytest.approx([0.1, 0.3, 0.4])
    assert comet["wall_s_mean"].tolist() == pytest.approx([0.0, 1.5, 2.5])
    assert comet["test_mrr_std"].iloc[1] == pytest.approx(0.1414, abs=1e-4)
    assert c[c.label == "inmemory"]["val_mrr_std"].tolist() == [0.0, 0.0, 0.0]
    fig = plots.plot_link_curves(logs)
    assert len(fig.axes) == 4 and len(fig.axes[0].lines) == 2
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["comet (mean ± std of 2 seeds)", "inmemory"]
    plt.close(fig)
