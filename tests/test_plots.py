"""Notebook figure output: figures/ by default, elsewhere when checking notebooks."""
import matplotlib

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
