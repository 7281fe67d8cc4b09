"""ipywidgets front ends of `sweep`: pick a knob and its values, run, redraw the plots.

Widgets only wrap library calls; headless runs (papermill, nbval) call `sweep` directly.
"""
from __future__ import annotations

from .config import TrainConfig
from .plots import plot_sweep
from .policies import POLICIES
from .sweep import sweep


def sweep_widget(base: TrainConfig, knobs: dict, seeds=(0,), out_root="runs/sweep"):
    """A small form: knob dropdown, values text box, Run button; plots time-to-accuracy and
    final accuracy of the sweep below it. `knobs` maps a setting (`config.SETTINGS`) to default values,
    e.g. {"static_ratio": [0, 0.01, 0.04], "passes": [1, 2, 3], "staleness": [1, 10, 100]}.
    The returned box keeps the last sweep as `box.result` = (logs, summary, figure)."""
    import ipywidgets as w
    from IPython.display import display
    knob = w.Dropdown(options=list(knobs), description="knob")
    values = w.Text(value=", ".join(map(str, knobs[knob.value])), description="values")
    policy = w.Dropdown(options=list(POLICIES), value=base.policy, description="policy")
    epochs = w.IntSlider(value=base.epochs, min=1, max=30, description="epochs")
    run = w.Button(description="Run sweep", button_style="primary")
    out = w.Output()

    def on_knob(change):
        values.value = ", ".join(map(str, knobs[change["new"]]))

    def on_run(_):
        with out:
            out.clear_output()
            kind = type(base.get(knob.value))
            vals = [kind(v.strip()) for v in values.value.split(",") if v.strip()]
            cfg = base.replace(policy=policy.value, epochs=epochs.value, progress=False)
            logs, summary = sweep(cfg, knob.value, vals, seeds, out_root=out_root)
            fig = plot_sweep(logs, summary, knob.value)
            display(summary)
            box.result = (logs, summary, fig)

    knob.observe(on_knob, names="value")
    run.on_click(on_run)
    box = w.VBox([w.HBox([policy, knob, values]), w.HBox([epochs, run]), out])
    box.result = None
    display(box)
    return box
