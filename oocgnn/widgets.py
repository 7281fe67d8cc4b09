"""ipywidgets front ends of `sweep`: pick a knob and its values, run, redraw the plots.

Widgets only wrap library calls; headless runs (papermill, nbval) call `sweep` directly.
"""
from __future__ import annotations

from dataclasses import replace

from .config import TrainConfig
from .plots import plot_sweep
from .sweep import sweep


def sweep_widget(base: TrainConfig, knobs: dict, seeds=(0,)):
    """A small form: knob dropdown, values text box, Run button; plots time-to-accuracy and
    final accuracy of the sweep below it. `knobs` maps a TrainConfig field to default values,
    e.g. {"static_ratio": [0, 0.01, 0.04], "passes": [1, 2, 3], "staleness": [1, 10, 100]}."""
    import ipywidgets as w
    from IPython.display import display
    knob = w.Dropdown(options=list(knobs), description="knob")
    values = w.Text(value=", ".join(map(str, knobs[knob.value])), description="values")
    policy = w.Dropdown(options=["hierbatching", "outre", "inmemory", "mmap"], value=base.policy,
                        description="policy")
    epochs = w.IntSlider(value=base.epochs, min=1, max=30, description="epochs")
    run = w.Button(description="Run sweep", button_style="primary")
    out = w.Output()

    def on_knob(change):
        values.value = ", ".join(map(str, knobs[change["new"]]))

    def on_run(_):
        with out:
            out.clear_output()
            vals = [type(getattr(base, knob.value))(v.strip()) for v in values.value.split(",") if v.strip()]
            cfg = replace(base, policy=policy.value, epochs=epochs.value, progress=False)
            logs, summary = sweep(cfg, knob.value, vals, seeds)
            plot_sweep(logs, summary, knob.value)
            display(summary)

    knob.observe(on_knob, names="value")
    run.on_click(on_run)
    box = w.VBox([w.HBox([policy, knob, values]), w.HBox([epochs, run]), out])
    display(box)
    return box
