"""Run a lesson in a real JupyterLab, in a real browser, and operate its explorers.

One JupyterLab server and one headless Chromium (Debian's ``/usr/bin/chromium``, driven by the
``playwright`` package; Playwright's own browser download is never used) serve the whole pytest
session. ``run(path)`` opens a *copy* of the lesson (the committed file is never written), runs all its
cells from the JupyterLab frontend, saves the copy and reads it back (the outputs, for the checks of
``tests/test_notebooks.py``), then operates each explorer's controls once (each button, each slider,
each dropdown) and records what the picture under the controls became. The run is cached per lesson,
so ``test_browser.py`` and ``test_notebooks.py`` share one execution of each lesson.

The copy lives in a temporary tree that mirrors the repository (symlinks to every top-level entry, and
a ``lessons/`` folder of symlinks to everything but the notebooks), so the kernel's working directory
is a ``lessons/`` folder whose parent looks like the repository, as when a student runs the lesson.
"""

from __future__ import annotations

import atexit
import base64
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LESSONS = REPO / "lessons"
CHROMIUM = Path(os.environ.get("MINISGL_CHROMIUM", "/usr/bin/chromium"))
EXPLORER_CELL = re.compile(r"(^|=\s*)explorer\(", re.M)  # as in test_notebooks.py
INSTALL = 'apt-get install chromium (Debian: /usr/bin/chromium) and pip install -e ".[test]" (playwright)'


def unavailable() -> str | None:
    """Why the browser run cannot happen here (``None`` when it can): what to install."""
    missing = [m for m in ("playwright", "jupyterlab", "ipywidgets") if _find(m) is None]
    if missing:
        return f"no {', '.join(missing)}: {INSTALL}"
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        return f"no browser at {CHROMIUM} (or set MINISGL_CHROMIUM): {INSTALL}"
    return None


def _find(module: str):
    import importlib.util

    return importlib.util.find_spec(module)


def explorer_lessons() -> list[Path]:
    return [p for p in sorted(LESSONS.glob("[0-9][0-9]_*.ipynb")) if has_explorer(json.loads(p.read_text()))]


def has_explorer(nb: dict) -> bool:
    return any(c["cell_type"] == "code" and EXPLORER_CELL.search(_source(c)) for c in nb["cells"])


def _source(cell: dict) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


@dataclass
class Control:
    """One control of an explorer, operated once, and the picture it left."""

    cell: int  # the notebook cell holding the explorer
    kind: str  # "button" | "slider" | "dropdown"
    label: str
    problem: str | None = None  # None: the picture changed and is not blank


@dataclass
class LessonRun:
    nb: object  # the executed copy, read back through the server (an nbformat NotebookNode)
    seconds: float  # Run All Cells, from the first cell to the last reply
    timed_out: bool
    controls: list[Control] = field(default_factory=list)
    explorer_problem: str | None = None  # an explorer cell whose controls could not be found


_RUNS: dict[str, LessonRun] = {}
_KEEP_OPEN = False
_CONTROL_S = 120  # at most this long for the kernel to answer one control (a redraw on a loaded machine)
_LAB: _Lab | None = None


def run(path: Path, timeout_s: float, presses: int = 1) -> LessonRun:
    """The lesson at ``path`` run in JupyterLab (cached: one run per lesson per session), each control
    of each explorer operated ``presses`` times in turn."""
    global _LAB
    if path.name not in _RUNS:
        if _LAB is None:
            _LAB = _Lab()
            atexit.register(_LAB.close)
        _RUNS[path.name] = _LAB.run(path, timeout_s, presses)
    return _RUNS[path.name]


def close() -> None:
    """Stop the server and the browser (the runs stay cached)."""
    global _LAB
    if _LAB is not None:
        _LAB.close()
        _LAB = None


def first_error(nb) -> str | None:
    """The first cell of an executed notebook that failed, or that never ran (Run All stops at an error)."""
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                head = cell.source.splitlines()[0][:60] if cell.source else ""
                return f"cell {i} ({head!r}): {out.get('ename')}: {out.get('evalue')}"
        if cell.cell_type == "code" and cell.source.strip() and cell.execution_count is None:
            return f"cell {i} never ran"
    return None


def blank_reason(png: bytes) -> str | None:
    """``None`` when ``png`` is a picture with something on it, else why not (transparent, one colour)."""
    from PIL import Image

    try:
        img = Image.open(io.BytesIO(png)).convert("RGBA")
    except Exception as e:
        return f"not a readable image ({len(png)} bytes: {type(e).__name__})"
    alpha = img.getchannel("A").getextrema()
    if alpha[1] == 0:
        return f"a fully transparent {img.width}x{img.height} image"
    if all(lo == hi for lo, hi in img.getextrema()):
        return f"a {img.width}x{img.height} image of one colour {img.getpixel((0, 0))}"
    return None


# the pictures and texts in a cell's outputs: every <img> (its bytes, whether it shows) and every <pre>
_SNAPSHOT = """async (node) => {
  const out = node.querySelector('.jp-Cell-outputWrapper') || node;
  const pics = [];
  for (const img of out.querySelectorAll('img')) {
    let data = '';
    if (img.src) {
      try {
        const buf = new Uint8Array(await (await fetch(img.src)).arrayBuffer());
        let s = '';
        for (let k = 0; k < buf.length; k += 0x8000) s += String.fromCharCode.apply(null, buf.subarray(k, k + 0x8000));
        data = btoa(s);
      } catch (e) { data = ''; }
    }
    const r = img.getBoundingClientRect();
    pics.push({data, shown: r.width > 0 && r.height > 0});
  }
  const texts = [...out.querySelectorAll('.jupyter-widgets pre, .jupyter-widgets code')].map(p => p.innerText);
  return {pics, texts};
}"""

_CONTROLS = {
    "button": "button.jupyter-button",
    "slider": ".widget-slider .noUi-handle",
    "dropdown": ".widget-dropdown select",
}

_KERNEL_IDLE = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return k ? k.status : 'none';
}"""


class _Lab:
    def __init__(self):
        from playwright.sync_api import sync_playwright

        self.tmp = Path(tempfile.mkdtemp(prefix="minisgl-browser-"))
        self.root = self.tmp / "repo"
        self.root.mkdir()
        for entry in REPO.iterdir():
            if entry.name not in ("lessons", ".git"):
                (self.root / entry.name).symlink_to(entry)
        (self.root / "lessons").mkdir()
        for entry in LESSONS.iterdir():
            if entry.suffix != ".ipynb":
                (self.root / "lessons" / entry.name).symlink_to(entry)
        settings = self.tmp / "settings"
        _write_settings(settings)
        self.port, self.token = _free_port(), base64.b16encode(os.urandom(12)).decode().lower()
        env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(settings)}
        env["JUPYTERLAB_WORKSPACES_DIR"] = str(self.tmp / "workspaces")
        cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={self.port}", "--ip=127.0.0.1"]
        cmd += [f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}", "--allow-root"]
        cmd += ["--LabApp.expose_app_in_browser=True", "--ServerApp.open_browser=False"]
        cmd += ["--LabServerApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        self.log = open(self.tmp / "jupyter.log", "w")
        self.server = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_for_server(60)
        self.pw = sync_playwright().start()
        self.browser = self.pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        self.page = self.browser.new_page(viewport={"width": 1400, "height": 1000})
        self.page.goto(f"http://127.0.0.1:{self.port}/lab?token={self.token}")
        self.page.wait_for_function("() => window.jupyterapp && window.jupyterapp.started", timeout=120_000)
        self.page.evaluate("() => window.jupyterapp.started")

    def _wait_for_server(self, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise RuntimeError(f"jupyter lab exited: {(self.tmp / 'jupyter.log').read_text()[-2000:]}")
            try:
                self._api("GET", "api/status")
                return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"jupyter lab did not answer within {limit_s} s")

    def _api(self, method: str, route: str) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/{route}", method=method)
        req.add_header("Authorization", f"token {self.token}")
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"{}")

    def run(self, path: Path, timeout_s: float, presses: int) -> LessonRun:
        import nbformat

        shutil.copy(path, self.root / "lessons" / path.name)
        rel = f"lessons/{path.name}"
        page = self.page
        page.evaluate(
            """async (path) => {
              const app = window.jupyterapp;
              const w = await app.commands.execute('docmanager:open', {path, factory: 'Notebook'});
              await w.context.ready;
              await w.sessionContext.ready;
              app.shell.activateById(w.id);
              // the kernel goes busy, then idle, around every message it handles (a widget's too)
              window.__idle = 0;
              w.sessionContext.statusChanged.connect((_, status) => { if (status === 'idle') window.__idle++; });
            }""",
            rel,
        )
        page.wait_for_function(f"() => ({_KERNEL_IDLE})() === 'idle'", timeout=120_000)
        start = time.monotonic()
        finished = page.evaluate(
            """async (limit) => {
              const run = window.jupyterapp.commands.execute('notebook:run-all-cells');
              const late = new Promise(ok => setTimeout(() => ok('late'), limit));
              return (await Promise.race([run.then(() => 'done'), late])) === 'done';
            }""",
            int(timeout_s * 1000),
        )
        seconds = time.monotonic() - start
        if not finished:
            page.evaluate("() => window.jupyterapp.commands.execute('kernelmenu:interrupt')")
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=60_000)
        saved = self._api("GET", f"api/contents/{rel}?content=1&type=notebook")["content"]
        nb = nbformat.reads(json.dumps(saved), as_version=4)
        result = LessonRun(nb=nb, seconds=seconds, timed_out=not finished)
        if finished:
            try:
                self._operate(nb, result, timeout_s, presses)
            except Exception as e:  # a control that never answered, a page that broke: the explorer test says so
                result.explorer_problem = f"{type(e).__name__}: {e}"
        if _KEEP_OPEN:  # debugging: leave the notebook and its kernel up
            return result
        page.evaluate(
            """async () => {
              const w = window.jupyterapp.shell.currentWidget;
              await w.sessionContext.shutdown();
              w.dispose();
            }"""
        )
        return result

    def _operate(self, nb, result: LessonRun, timeout_s: float, presses: int) -> None:
        page = self.page
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or not EXPLORER_CELL.search(cell.source):
                continue
            node = page.evaluate_handle("(i) => window.jupyterapp.shell.currentWidget.content.widgets[i].node", i)
            node.scroll_into_view_if_needed()
            # in the page's order: the knobs above, the buttons under them
            found = node.query_selector_all(", ".join(_CONTROLS.values()))
            match = "(e, s) => e.matches(s)"
            controls = [(next(k for k, sel in _CONTROLS.items() if h.evaluate(match, sel)), h) for h in found]
            if not controls:
                result.explorer_problem = f"cell {i}: an explorer cell shows no controls in JupyterLab"
                continue
            for kind, handle in [c for _ in range(presses) for c in controls]:
                label = self._label(kind, handle)
                before = page.evaluate(_SNAPSHOT, node)
                idle = page.evaluate("() => window.__idle")
                self._operate_one(kind, handle)
                # the kernel handled the control's message (busy, then idle again), then the page settles
                limit_ms = int(min(timeout_s, _CONTROL_S) * 1000)
                page.wait_for_function(f"() => window.__idle > {idle}", timeout=limit_ms)
                after = self._settled(node)
                result.controls.append(Control(i, kind, label, _judge(before, after)))

    @staticmethod
    def _label(kind: str, handle) -> str:
        if kind == "button":
            return handle.inner_text().strip()
        box = handle.evaluate_handle("(e) => e.closest('.widget-inline-hbox')")
        return box.evaluate("(e) => (e.querySelector('.widget-label') || {}).innerText || ''").strip()

    @staticmethod
    def _operate_one(kind: str, handle) -> None:
        if kind == "button":
            handle.click()
        elif kind == "dropdown":
            options = handle.evaluate("(s) => [...s.options].map(o => o.value)")
            current = handle.evaluate("(s) => s.value")
            handle.select_option(next(o for o in options if o != current))
        else:  # a noUiSlider handle: one step with the keyboard, away from the end it sits at
            at_max = handle.get_attribute("aria-valuenow") == handle.get_attribute("aria-valuemax")
            handle.focus()
            handle.press("ArrowLeft" if at_max else "ArrowRight")

    def _settled(self, node) -> dict:
        """The cell's pictures once two looks 0.3 s apart agree (the redraw's messages have landed)."""
        snap, deadline = self.page.evaluate(_SNAPSHOT, node), time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.3)
            again = self.page.evaluate(_SNAPSHOT, node)
            if again == snap:
                break
            snap = again
        return snap

    def close(self) -> None:
        atexit.unregister(self.close)
        for sig in (signal.SIGTERM, signal.SIGKILL):  # the server first: it owns the kernels and their memory
            try:
                os.killpg(self.server.pid, sig)
                self.server.wait(timeout=20)
                break
            except (OSError, subprocess.TimeoutExpired):
                continue
        for fn in (self.browser.close, self.pw.stop):
            try:
                fn()
            except Exception:
                pass
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _judge(before: dict, after: dict) -> str | None:
    """Why the picture under a control did not change into a real one (``None``: it did)."""
    # picture k of the cell's outputs is new if it was not there or showed other bytes (a redraw back to
    # the first state repeats the static picture's bytes, and is still a change)
    was = [p["data"] for p in before["pics"]]
    new = [p for k, p in enumerate(after["pics"]) if p["data"] and (k >= len(was) or p["data"] != was[k])]
    if new:
        problems = []
        for p in new:
            why = blank_reason(base64.b64decode(p["data"]))
            if why is None and not p["shown"]:
                why = "a picture that is not shown (zero size)"
            if why:
                problems.append(why)
        return f"the new picture is {problems[0]}" if problems else None
    errors = [t for t in after["texts"] if re.search(r"\w+(Error|Exception): ", t)]
    if errors:
        return f"the control reported an error: {errors[0][:300]}"
    texts = [t for t in after["texts"] if t.strip() and t not in before["texts"] and not t.startswith("after ")]
    if texts:
        return None  # a text picture (an explorer whose draw returns a str) changed
    return "the picture did not change"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_settings(folder: Path) -> None:
    """JupyterLab settings for a test: every cell stays in the page (no windowing), no news, no updates."""
    files = {
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
            "fetchNews": "false",
            "checkForUpdates": False,
        },
    }
    for name, value in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(value))
