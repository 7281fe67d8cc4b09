"""ipywidgets front ends: the sweep form (`sweep_widget`) and a figure explorer (`figure_explorer`).

Widgets only wrap library calls; headless runs (papermill, nbval) call `sweep` directly. A widget puts
what it shows straight into its `Output` (`append_display_data`: the table, each figure as a PNG), so it
appears in JupyterLab from a button or slider callback too, where the inline backend never flushes a
figure; a run's error is one line in the widget's status, never a lost traceback.
"""
from __future__ import annotations

import html
import io
import time

from .config import TrainConfig
from .errors import UserError
from .metrics import NAMES, summary_keys
from .plots import plot_sweep
from .policies import POLICIES
from .store import open_store
from .sweep import mixing_warnings, seed_table, sweep


def error_line(e: BaseException) -> str:
    """One readable line for an exception: a UserError's message, else 'Type: message'."""
    lines = str(e).strip().splitlines()
    if isinstance(e, UserError) and lines:
        return lines[0]
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def _status(kind: str, text: str) -> str:
    """The status line as HTML: an error in red (prefixed "error: "), progress in grey, done in green."""
    colour = {"error": "#b00020", "busy": "#555", "done": "#1b5e20", "warning": "#a15c00"}[kind]
    prefix = f"{kind}: " if kind in ("error", "warning") else ""
    return f'<span style="color:{colour}">{html.escape(prefix + text)}</span>'


def figure_png(fig, dpi=100):
    """The figure as an IPython PNG image (closed afterwards: a widget redraws many)."""
    import matplotlib.pyplot as plt
    from IPython.display import Image
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return Image(data=buf.getvalue(), format="png")


def parse_values(text: str, kind: type, knob: str) -> list:
    """The comma-separated values of a knob as its setting's type; a bad one is named."""
    out = []
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        try:
            if kind is bool:
                if token.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(token)
                out.append(token.lower() in ("true", "1"))
            else:
                out.append(kind(token))
        except ValueError:
            raise UserError(f"{knob} takes {kind.__name__} values; {token!r} is not one") from None
    if not out:
        raise UserError(f"give {knob} at least one value (comma-separated)")
    return out


def sweep_widget(base: TrainConfig, knobs: dict, seeds=(0,), out_root="runs/sweep"):
    """A small form: policy and knob dropdowns, values text box, epochs, the metric (accuracy, macro-F1, and
    ROC-AUC for binary labels: the runs' --target-metric and what the plots show), Run button; below it a
    progress bar (run i of n), a status line, a line per value whose groups mix poorly (shown before the
    runs: `sweep.mixing_warnings`), the summary table and the sweep's plots (time to the metric per value,
    the metric against the knob), redrawn on every run. `knobs` maps a setting (`config.SETTINGS`) to
    default values, e.g. {"static_ratio": [0, 0.01, 0.04], "passes": [1, 2, 3]}.
    The returned box keeps the last sweep as `box.result` = (logs, summary, figure)."""
    import ipywidgets as w
    from IPython.display import display
    knob = w.Dropdown(options=list(knobs), description="knob")
    values = w.Text(value=", ".join(map(str, knobs[knob.value])), description="values")
    policy = w.Dropdown(options=list(POLICIES), value=base.policy, description="policy")
    epochs = w.IntSlider(value=base.epochs, min=1, max=30, description="epochs")
    choices = ["acc", "f1"] + (["auc"] if open_store(base.store, verify=False).num_classes == 2 else [])
    metric = w.Dropdown(options=[(NAMES[m], m) for m in choices], description="metric",
                        value=base.target_metric if base.target_metric in choices else "acc")
    run = w.Button(description="Run sweep", button_style="primary")
    progress = w.IntProgress(value=0, min=0, max=1, description="runs")
    status, warnings = w.HTML(), w.HTML()
    out = w.Output()

    def on_knob(change):
        values.value = ", ".join(map(str, knobs[change["new"]]))

    def on_run(_):
        out.outputs = ()
        run.disabled, progress.value, t0 = True, 0, time.perf_counter()
        try:
            vals = parse_values(values.value, type(base.get(knob.value)), knob.value)
            n = len(vals) * len(seeds)
            progress.max = n

            def started(i, n, settings):
                progress.value = i
                shown = ", ".join(f"{k}={v}" for k, v in settings.items())
                status.value = _status("busy", f"run {i + 1} of {n}: {shown}")
            cfg = base.replace(policy=policy.value, epochs=epochs.value, progress=False, target_metric=metric.value)
            # before any run: the values whose groups mix poorly (`oocgnn.mixing`), one line each
            warnings.value = "<br>".join(_status("warning", line) for line in mixing_warnings(cfg, {knob.value: vals}))
            logs, summary = sweep(cfg, knob.value, vals, seeds, out_root=out_root, on_run=started)
            progress.value = n
            status.value = _status("done", f"run {n} of {n} finished ({time.perf_counter() - t0:.0f} s)")
            fig = plot_sweep(logs, summary, knob.value, metric.value)
            box.result = (logs, summary, fig)
            out.append_display_data(summary)
            if summary["seed"].nunique() > 1:        # mean ± std over the seeds, per setting
                out.append_display_data(seed_table(summary, (*summary_keys(metric.value), "train_s")))
            out.append_display_data(figure_png(fig))
        except Exception as e:          # noqa: BLE001 - shown in the widget, as one line
            status.value = _status("error", error_line(e))
        finally:
            run.disabled = False

    knob.observe(on_knob, names="value")
    run.on_click(on_run)
    box = w.VBox([w.HBox([policy, knob, values]), w.HBox([epochs, metric, run]), w.HBox([progress, status]),
                  warnings, out])
    box.result = None
    box.controls = {"policy": policy, "knob": knob, "values": values, "epochs": epochs, "metric": metric, "run": run,
                    "progress": progress, "status": status, "warnings": warnings, "output": out}
    display(box)
    return box


def figure_explorer(draw, **controls):
    """Controls above an output that shows `draw(**values)`'s figure, redrawn whenever a control moves.

    A control is an ipywidget (a slider, a dropdown...) or a list of options (a dropdown). An error in
    `draw` is one line in the explorer's status. The box keeps the last figure as `box.figure`."""
    import ipywidgets as w
    from IPython.display import display
    ctrls = {k: c if isinstance(c, w.Widget) else w.Dropdown(options=list(c), description=k)
             for k, c in controls.items()}
    for k, c in ctrls.items():
        if not getattr(c, "description", None):
            c.description = k
    status, out = w.HTML(), w.Output()

    def redraw(_=None):
        status.value = ""
        try:
            fig = draw(**{k: c.value for k, c in ctrls.items()})
            box.figure = fig
            image = figure_png(fig)
        except Exception as e:          # noqa: BLE001 - shown in the explorer, as one line
            status.value = _status("error", error_line(e))
            return
        out.outputs = ()
        out.append_display_data(image)

    box = w.VBox([*ctrls.values(), status, out])
    box.figure, box.controls = None, {**ctrls, "status": status, "output": out}
    for c in ctrls.values():
        c.observe(redraw, names="value")
    redraw()
    display(box)
    return box
