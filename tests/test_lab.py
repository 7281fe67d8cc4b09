"""The notebooks as their users meet them: JupyterLab from the project's venv, in a real headless Chromium.

The test starts JupyterLab on a free localhost port with a token, opens notebook 04 (parameterised for
`tiny`, as papermill would), runs it down to the sweep widget, presses **Run sweep** and asserts that the
widget shows its progress, its table and its plots (images) and no traceback; notebook 03's cache explorer
is moved the same way; and every notebook must render in JupyterLab without an error. A screenshot of each
widget is written under the test's temporary directory (its path is printed).

Needs Debian's `chromium` and `chromium-driver` (`make browser` installs them; `make test` calls it) and
selenium; skipped with the reason where they cannot be had.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (requirements.txt has it)")
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
if not (CHROMIUM and CHROMEDRIVER):
    pytest.skip("no chromium / chromedriver on PATH: `make browser` installs Debian's (needs apt and root)",
                allow_module_level=True)

# notebook 04 on `tiny`: every section runs in seconds, the widget's sweep is two one-epoch runs
NB04_TINY = {"dataset": "tiny", "seeds": [0], "parts": 16, "epochs": 1, "max_eval_nodes": 500, "parts_per_megabatch": 4,
             "parts_per_macro": 4, "sweep_epochs": 1, "staleness_epochs": 1, "fixed_budget_parts": 6,
             "fixed_budget_n_d": [6, 4], "static_ratio_sweep": [0.0, 0.01], "passes_sweep": [1.0, 2.0],
             "staleness_sweep": [1, 10]}
# notebook 03 on `tiny` (500 training nodes): B = 50 gives T = 10 random iterations per epoch, so the S = T / 2
# and k = 5 its comparison table quotes exist, and the macrobatch sizes stay distinct
NB03_TINY = {"dataset": "tiny", "parts": 16, "n_per_macro": 4, "batch_size": 50, "macro_ks": [1, 2, 4, 5, 0],
             "show_widgets": True}
WAIT_S = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab serving a temporary directory with copies of the notebooks (the originals stay as they are)."""
    root = tmp_path_factory.mktemp("lab")
    for nb in NOTEBOOKS:
        shutil.copy(nb, root / nb.name)
    # own settings (no news prompt over the widgets), workspaces and config: nothing of the user's is read or written
    settings = root / ".lab-settings"
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false"}))
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "OOCGNN_FIGURES": str(root / "figures"), "JUPYTER_CONFIG_DIR": str(root / ".jupyter"),
           "JUPYTER_RUNTIME_DIR": str(root / ".runtime"), "JUPYTERLAB_SETTINGS_DIR": str(settings),
           "JUPYTERLAB_WORKSPACES_DIR": str(root / ".lab-workspaces"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    log = open(root / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--allow-root",
         "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=", "--LabApp.check_for_updates_class="
         "jupyterlab.NeverCheckForUpdate"], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail(f"JupyterLab did not start: {(root / 'lab.log').read_text()[-2000:]}")
            time.sleep(0.5)
    yield type("Lab", (), {"url": url, "token": token, "root": root})
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1500,1100"):
        opts.add_argument(arg)
    try:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    except WebDriverException as e:
        pytest.skip(f"chromium does not start here: {e.msg.splitlines()[0] if e.msg else e}")
    driver.set_script_timeout(WAIT_S)
    yield driver
    driver.quit()


def _wait(what, check, timeout=WAIT_S, every=0.5):
    """check() until it is truthy; an element JupyterLab replaced while we looked means "not yet"."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            value = check()
        except StaleElementReferenceException:
            value = None
        if value:
            return value
        time.sleep(every)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def _open(browser, lab, name):
    """Open notebook `name` in JupyterLab and wait until it is shown with its kernel ready."""
    browser.get(f"{lab.url}/lab/tree/{name}?token={lab.token}&reset")
    _wait("JupyterLab's app", lambda: browser.execute_script("return !!(window.jupyterapp && "
                                                             "window.jupyterapp.shell.currentWidget)"), 120)
    _wait(f"{name} to open", lambda: browser.execute_script(
        "const w = window.jupyterapp.shell.currentWidget;"
        "return !!(w && w.context && w.context.path.endsWith(arguments[0]) && w.content.widgets.length)", name), 120)


def _command(browser, command, **args):
    """Run a JupyterLab command (what the menus do) and wait for its promise."""
    return browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "window.jupyterapp.commands.execute(arguments[0], arguments[1])"
        ".then(r => done({ok: true, value: typeof r === 'boolean' ? r : null}),"
        "      e => done({ok: false, error: String(e)}));",
        command, args)


def _kernel_ready(browser):
    return browser.execute_script(
        "const s = window.jupyterapp.shell.currentWidget.sessionContext;"
        "return !!(s && s.session && s.session.kernel && s.session.kernel.status === 'idle')")


def _run_through(browser, index):
    """Select cell `index` and run every cell above it and it (Run > Run Selected Cell and All Above)."""
    _wait("the kernel", lambda: _kernel_ready(browser), 120)
    browser.execute_script("window.jupyterapp.shell.currentWidget.content.activeCellIndex = arguments[0]", index)
    r = _command(browser, "notebook:run-all-above")
    assert r["ok"], r
    r = _command(browser, "notebook:run-cell")
    assert r["ok"], r

    def finished():
        errors = _tracebacks(browser)           # a failed cell stops the run: say so now, not at the timeout
        assert not errors, f"a cell failed in JupyterLab: {errors[0][-3000:]}"
        return _kernel_ready(browser) and browser.execute_script(
            "return window.jupyterapp.shell.currentWidget.content.widgets.slice(0, arguments[0] + 1).every(c =>"
            " c.model.type !== 'code' || c.model.executionCount !== null || !c.model.sharedModel.source.trim())",
            index)
    _wait("the cells to finish", finished)


def _tracebacks(browser) -> list[str]:
    """Error outputs shown in the open notebook (exceptions, and anything printed with a traceback)."""
    return browser.execute_script(
        "return [...document.querySelectorAll('.jp-OutputArea-output')]"
        ".map(e => e.innerText).filter(t => /Traceback|Error:|Exception/.test(t))")


def _parameterised(lab, name, params) -> str:
    """A copy of notebook `name` with papermill's injected-parameters cell; returns the copy's name."""
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook
    nb = parameterize_notebook(load_notebook_node(str(lab.root / name)), params)
    out = f"tiny_{name}"
    nbformat.write(nb, lab.root / out)
    return out


def _cell_index(lab, name, text) -> int:
    nb = json.loads((lab.root / name).read_text())
    return next(i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and text in "".join(c["source"]))


def _screenshot(browser, widget, path: Path) -> Path:
    """The browser window, scrolled to show `widget` from its top, as a PNG at `path`."""
    browser.execute_script("arguments[0].scrollIntoView({block: 'start'})", widget)
    time.sleep(0.5)
    browser.save_screenshot(str(path))
    return path


def _widget_images(widget) -> int:
    return len(widget.find_elements(By.CSS_SELECTOR, ".widget-output img, .jp-OutputArea-output img"))


def test_the_sweep_widget_draws_its_plots(lab, browser):
    """Notebook 04: run down to the widget, press Run sweep: progress, the table and the plots appear."""
    name = _parameterised(lab, "04_out_of_core_training.ipynb", NB04_TINY)
    _open(browser, lab, name)
    t0 = time.time()
    _run_through(browser, _cell_index(lab, name, "sweep_widget("))
    button = _wait("the Run sweep button",
                   lambda: browser.find_elements(By.XPATH, "//button[contains(., 'Run sweep')]"))[0]
    widget = button.find_element(By.XPATH, "ancestor::div[contains(@class, 'widget-vbox')][1]")
    assert _widget_images(widget) == 0
    button.click()
    _wait("the sweep's table", lambda: widget.find_elements(By.CSS_SELECTOR, "table"))
    _wait("the sweep's plots", lambda: _widget_images(widget) >= 1, 30)
    bar = widget.find_elements(By.CSS_SELECTOR, ".widget-hprogress .progress-bar")
    assert bar, "no progress bar in the widget"
    assert bar[0].value_of_css_property("width") == bar[0].find_element(By.XPATH, "..").value_of_css_property("width")
    print(f"\nscreenshot: {_screenshot(browser, widget, lab.root / '04_sweep_widget.png')} "
          f"({time.time() - t0:.0f} s from opening)")
    assert "run 2 of 2" in widget.text and _tracebacks(browser) == []

    # a bad value: one readable line in the widget naming it, no traceback anywhere
    values = widget.find_element(By.CSS_SELECTOR, ".widget-text input")
    values.clear()
    values.send_keys("0.0, lots")
    button.click()
    line = "error: static_ratio takes float values; 'lots' is not one"
    _wait("the widget's error line", lambda: line in widget.text, 60)
    assert "Traceback" not in widget.text and _tracebacks(browser) == []


def test_the_cache_explorer_redraws(lab, browser):
    """Notebook 03's explorer: moving the budget slider redraws its plot, with no traceback."""
    name = _parameterised(lab, "03_cache_policies.ipynb", NB03_TINY)
    _open(browser, lab, name)
    _run_through(browser, _cell_index(lab, name, "figure_explorer("))
    slider = _wait("the budget slider", lambda: browser.find_elements(
        By.XPATH, "//div[contains(@class, 'widget-slider')][.//*[contains(., 'budget')]]"))[0]
    widget = slider.find_element(By.XPATH, "ancestor::div[contains(@class, 'widget-vbox')][1]")
    _wait("the explorer's first plot", lambda: _widget_images(widget) >= 1, 60)
    first = widget.find_element(By.CSS_SELECTOR, "img").get_attribute("src")
    handle = slider.find_element(By.CSS_SELECTOR, ".noUi-handle, .ui-slider-handle")
    handle.click()
    for _ in range(10):
        handle.send_keys("\ue014")                  # arrow right: budget +1 % each
    _wait("a redrawn plot", lambda: _widget_images(widget) >= 1 and
          widget.find_element(By.CSS_SELECTOR, "img").get_attribute("src") != first, 60)
    _wait("the kernel", lambda: _kernel_ready(browser), 60)   # the last slider step drawn too
    print(f"\nscreenshot: {_screenshot(browser, widget, lab.root / '03_explorer.png')}")
    assert _tracebacks(browser) == []


def _shown_outputs(outputs) -> int:
    """How many outputs JupyterLab's model holds for a stored cell's: it merges consecutive streams of one name."""
    streams = [o.get("name") if o["output_type"] == "stream" else None for o in outputs]
    return sum(1 for i, s in enumerate(streams) if s is None or i == 0 or streams[i - 1] != s)


@pytest.mark.parametrize("notebook", [nb.name for nb in NOTEBOOKS])
def test_every_notebook_renders(lab, browser, notebook):
    """Each stored notebook opens in JupyterLab with all its cells and outputs rendered, no error shown."""
    _open(browser, lab, notebook)
    stored = json.loads((lab.root / notebook).read_text())["cells"]
    outputs = sum(_shown_outputs(c.get("outputs", [])) for c in stored)
    _wait("every cell", lambda: browser.execute_script(
        "return window.jupyterapp.shell.currentWidget.content.widgets.length") == len(stored), 60)
    _wait(f"the model's {outputs} stored outputs", lambda: browser.execute_script(
        "return window.jupyterapp.shell.currentWidget.content.widgets"
        ".map(w => w.model.outputs ? w.model.outputs.length : 0).reduce((a, b) => a + b, 0)") == outputs, 60)
    # the model can be complete a moment before its outputs are drawn (CI once looked too early)
    _wait("a rendered output", lambda: browser.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output"), 60)
    assert not browser.find_elements(By.CSS_SELECTOR, ".jp-Dialog"), "JupyterLab shows a dialog"
    assert _tracebacks(browser) == []
