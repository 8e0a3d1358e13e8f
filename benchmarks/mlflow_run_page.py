"""What a user sees on the MLflow run page of a tracked BatchedGEPA compile, checked in a real browser.

Why: dspy-pxn names its metrics ``<section>/<field>`` (``best_val/``, ``cost/``, ``pool/``, ``search/``,
``time/``, ``totals/``; the model's own scores unprefixed) because MLflow 3's "Model metrics" tab
groups charts by the prefix before the last ``/``, sorts the sections by name and puts unprefixed
metrics last: the two charts a user opens the run for (``best_val/by_metric_calls``,
``best_val/by_wall_clock_ms``) should then come first. Only the MLflow UI itself can confirm that, so this script

1. starts a real ``mlflow server`` on loopback (sqlite store and artifacts in a temp dir),
2. runs a tracked 4x2 compile against it with the in-process simulated LM,
3. opens the run page in headless Chromium through Playwright,
4. saves ``docs/assets/mlflow_run_page.png`` (Model metrics tab, above the fold) and
   ``docs/assets/mlflow_run_overview.png`` (Overview tab: registered prompts and model, metrics),
5. prints the chart sections and the first chart titles in the order shown, and exits 1 if the
   first two charts are not the two ``best_val/*`` ones.

Run it from the repository root::

    python benchmarks/mlflow_run_page.py

It needs ``pip install playwright`` (the Python package only: no ``playwright install``) and a
Chromium at ``/usr/bin/chromium``, or wherever the ``CHROMIUM`` environment variable points.
It takes about 35 s. Options: ``--assets DIR`` (screenshots elsewhere), ``--keep-assistant`` (leave
MLflow's Assistant side panel open, as on a first visit; closed by default so the charts get the width),
``--task-latency``/``--reflection-latency`` (the simulated LM's; the defaults make the search last a
few seconds, so the wall-clock curve has a visible shape).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dspy_pxn.testing.mlflow_server import MlflowServer, running_mlflow_server

if TYPE_CHECKING:
    from playwright.sync_api import Page, Response

# Set before dspy/litellm/mlflow are imported: no telemetry, no cost-map download.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO / "docs" / "assets"
RUN_PAGE_PNG = ASSETS / "mlflow_run_page.png"
OVERVIEW_PNG = ASSETS / "mlflow_run_overview.png"
VIEWPORT = {"width": 1400, "height": 900}
EXPECTED_FIRST = ("best_val/by_metric_calls", "best_val/by_wall_clock_ms")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
MAX_PNG_BYTES = 400_000
TIMEOUT_MS = 60_000  # for each wait on the page
SETTLE_MS = 1_000
MAX_SCROLLS = 200
FIRST_CHARTS = 6  # how many charts "first charts" lists: two rows of three at 1400 px
SECTION_HEADER = '[data-testid="experiment-view-compare-runs-section-header"]'
CARD = '[data-testid="experiment-view-compare-runs-card"]'
ASSISTANT_CLOSE = '[data-component-id="mlflow.assistant.chat_panel.close"]'


# ----------------------------------------------------------------------------- the server
@contextmanager
def running_server() -> Iterator[MlflowServer]:
    """dspy-pxn's test server, with its log's tail printed when the check fails."""
    with running_mlflow_server() as server:
        try:
            yield server
        except BaseException:
            tail = Path(server.log_path).read_text(errors="replace")[-3000:]
            print(f"--- mlflow server log (tail) ---\n{tail}", file=sys.stderr)
            raise


# ----------------------------------------------------------------------------- the compile
@dataclass(frozen=True)
class TrackedRun:
    experiment_id: str
    run_id: str
    seconds: float


def tracked_compile(uri: str, task_latency: float, reflection_latency: float) -> TrackedRun:
    """A tracked 4x2 compile on the simulated LM; latencies make the wall-clock curve non-trivial."""
    import dspy
    from mlflow import MlflowClient

    from dspy_pxn import BatchedGEPA
    from dspy_pxn import testing as sim
    from dspy_pxn.tracking import MlflowTracker

    train, val, test = sim.make_splits(seed=0, train=24, val=8, test=12)

    def lm() -> sim.SimulatedLM:
        return sim.SimulatedLM(task_latency=task_latency, reflection_latency=reflection_latency)

    tracker = MlflowTracker(tracking_uri=uri, experiment="run-page", run_name="4x2 on the run page",
                            registered_model_name="run-page-program")
    opt = BatchedGEPA(metric=sim.metric, p=4, n=2, max_metric_calls=200, num_threads=8, reflection_lm=lm(),
                      tracker=tracker)
    start = time.monotonic()
    with dspy.context(lm=lm()):
        program = opt.compile(sim.seed_program(), trainset=train, valset=val, testset=test)
    seconds = time.monotonic() - start
    run_id = program.detailed_results.mlflow_run_id
    if not run_id:
        raise RuntimeError("the compile logged no MLflow run")
    run = MlflowClient(tracking_uri=uri).get_run(run_id)
    return TrackedRun(experiment_id=run.info.experiment_id, run_id=run_id, seconds=seconds)


def logged_metric_keys(uri: str, run_id: str) -> list[str]:
    from mlflow import MlflowClient

    return sorted(MlflowClient(tracking_uri=uri).get_run(run_id).data.metrics)


def logged_steps(uri: str, run_id: str, keys: tuple[str, ...]) -> dict[str, list[int]]:
    """The steps (the charts' x values) each metric was logged at, in order."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    return {key: [m.step for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)]
            for key in keys}


# ----------------------------------------------------------------------------- the browser
@contextmanager
def chromium_page(executable: str) -> Iterator[Page]:
    """A page of a fresh headless Chromium profile (its user-data-dir removed afterwards)."""
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="mlflow-run-page-chromium-")
    try:
        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                profile, executable_path=executable, args=CHROMIUM_ARGS, headless=True, viewport=VIEWPORT)
            try:
                page = context.pages[0] if context.pages else context.new_page()
                page.set_default_timeout(TIMEOUT_MS)
                page.on("pageerror", lambda error: print(f"page error: {error}", file=sys.stderr))
                page.on("response", _report_server_error)
                yield page
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def _report_server_error(response: Response) -> None:
    # A 404 on /users/current is MLflow's UI asking for a login the server does not have: not an error.
    if response.status >= 500:
        print(f"HTTP {response.status} {response.url}", file=sys.stderr)


def run_url(uri: str, run: TrackedRun, tab: str = "") -> str:
    return f"{uri}/#/experiments/{run.experiment_id}/runs/{run.run_id}" + (f"/{tab}" if tab else "")


def close_assistant(page: Page) -> None:
    """Close the "MLflow Assistant" side panel (open by default in 3.x): it takes a quarter of the width."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    close = page.locator(ASSISTANT_CLOSE)
    try:
        close.first.wait_for(state="visible", timeout=5_000)
    except PlaywrightTimeout:
        return  # no assistant panel in this MLflow version
    close.first.click()
    close.first.wait_for(state="hidden")


def wait_for_charts(page: Page) -> None:
    """Until every chart card mounted so far has drawn its plot (plotly's svg), and then a little longer."""
    page.locator(f"{CARD} .js-plotly-plot .main-svg").first.wait_for()
    page.wait_for_function(
        """card => [...document.querySelectorAll(card)].every(c => c.querySelector('.js-plotly-plot .main-svg'))""",
        arg=CARD)
    page.wait_for_timeout(SETTLE_MS)  # plotly's resize after the layout settles


def open_model_metrics(page: Page, uri: str, run: TrackedRun, keep_assistant: bool) -> None:
    page.goto(run_url(uri, run, "model-metrics"))
    page.locator(SECTION_HEADER).first.wait_for()
    if not keep_assistant:
        close_assistant(page)
    wait_for_charts(page)


def open_overview(page: Page, uri: str, run: TrackedRun, keep_assistant: bool) -> None:
    page.goto(run_url(uri, run))
    page.get_by_text("About this run").first.wait_for()
    page.get_by_text("Registered prompts").first.wait_for()
    if not keep_assistant:
        close_assistant(page)
    page.wait_for_timeout(SETTLE_MS)


# What the Model metrics tab shows, read from the DOM. The page mounts only the chart cards near the
# viewport, so the script scrolls the charts' container from top to bottom and keeps what it has seen,
# each card placed by its offset in the scrolled content (stable while cards mount and unmount).
_READ_CHARTS = """([header, card]) => {
    const scroller = el => { for (let e = el; e; e = e.parentElement) {
        const s = getComputedStyle(e); if (/(auto|scroll)/.test(s.overflowY) && e.scrollHeight > e.clientHeight) return e; }
        return document.scrollingElement; };
    const first = document.querySelector(header);
    const box = scroller(first), top = box.getBoundingClientRect().top - box.scrollTop;
    const at = el => { const r = el.getBoundingClientRect(); return [Math.round(r.top - top), Math.round(r.left)]; };
    const sections = [...document.querySelectorAll(header)].map(h => ({
        name: h.firstElementChild.innerText.split('\\n')[0].trim(), pos: at(h)}));
    const charts = [...document.querySelectorAll(card)].map(c => ({
        title: (c.querySelector('h4[title]') || {}).title || c.innerText.split('\\n')[0], pos: at(c)}));
    return {sections, charts, scrollTop: box.scrollTop, end: box.scrollTop + box.clientHeight >= box.scrollHeight - 2,
            step: Math.round(box.clientHeight * 0.6)};
}"""
_SCROLL = """([header, by]) => {
    for (let e = document.querySelector(header); e; e = e.parentElement) {
        const s = getComputedStyle(e);
        if (/(auto|scroll)/.test(s.overflowY) && e.scrollHeight > e.clientHeight) { e.scrollTop += by; return; } }
    document.scrollingElement.scrollTop += by;
}"""


@dataclass(frozen=True)
class ChartsTab:
    sections: list[str]  # section titles, top to bottom
    charts: list[tuple[str, str]]  # (section, metric key), in reading order: top to bottom, left to right


def read_charts_tab(page: Page) -> ChartsTab:
    """Every section and chart of the Model metrics tab in the order shown (the page is scrolled back to the top after)."""
    sections: dict[str, tuple[int, int]] = {}
    charts: dict[str, tuple[int, int]] = {}
    for _ in range(MAX_SCROLLS):
        page.wait_for_timeout(250)  # cards mount on an intersection observer's next callback
        seen = page.evaluate(_READ_CHARTS, [SECTION_HEADER, CARD])
        sections.update({s["name"]: tuple(s["pos"]) for s in seen["sections"]})
        charts.update({c["title"]: tuple(c["pos"]) for c in seen["charts"]})
        if seen["end"]:
            break
        page.evaluate(_SCROLL, [SECTION_HEADER, seen["step"]])
    page.evaluate(_SCROLL, [SECTION_HEADER, -10**7])
    order = sorted(sections, key=sections.__getitem__)

    def section_of(pos: tuple[int, int]) -> str:
        above = [name for name in order if sections[name][0] <= pos[0]]
        return above[-1] if above else "?"

    in_order = sorted(charts, key=charts.__getitem__)
    return ChartsTab(order, [(section_of(charts[key]), key) for key in in_order])


def read_overview(page: Page) -> dict[str, str]:
    """The Overview tab's rows about the logged program, as the page words them."""
    text = page.inner_text("main") if page.locator("main").count() else page.inner_text("body")
    found: dict[str, str] = {}
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.startswith(("Logged models (", "Metrics (", "Parameters (")):
            found[line.split(" (")[0]] = line
        elif line in ("Registered prompts", "Registered models") and i + 1 < len(lines):
            found[line] = lines[i + 1]
    return found


def screenshot(page: Page, path: Path) -> int:
    """Save what the viewport shows as a PNG (palette-quantised if over the size budget); its size in bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=False)
    if path.stat().st_size > MAX_PNG_BYTES:
        from PIL import Image

        with Image.open(path) as image:
            image.convert("RGB").quantize(colors=256).save(path, optimize=True)
    return path.stat().st_size


# ----------------------------------------------------------------------------- the report
def print_report(run: TrackedRun, logged: list[str], steps: dict[str, list[int]], tab: ChartsTab,
                 overview: dict[str, str]) -> bool:
    """Print what the page shows; True if its first two charts are the two best_val/* ones."""
    first = [key for _, key in tab.charts[:FIRST_CHARTS]]
    print(f"run {run.run_id} (experiment {run.experiment_id}), compile took {run.seconds:.1f} s")
    print(f"sections in order: {tab.sections}")
    print(f"first charts: {first}")
    for section in tab.sections:
        print(f"  {section}: {[key for s, key in tab.charts if s == section]}")
    shown = [key for _, key in tab.charts]
    for key in EXPECTED_FIRST:
        where = f"chart {shown.index(key) + 1} of {len(shown)}" if key in shown else "not shown"
        print(f"{key}: {where}; logged at steps {steps.get(key, [])}")
    missing = sorted(set(logged) - set(shown))
    if missing:
        print(f"logged but not charted: {missing}")
    for row, value in overview.items():
        print(f"overview: {row}: {value}")
    ok = tuple(first[:2]) == EXPECTED_FIRST
    print("OK: the two best_val/* charts come first" if ok
          else f"FAIL: the first two charts are {first[:2]}, not {list(EXPECTED_FIRST)}")
    return ok


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task-latency", type=float, default=0.1, help="simulated task LM latency, s")
    parser.add_argument("--reflection-latency", type=float, default=0.5, help="simulated reflection LM latency, s")
    parser.add_argument("--assets", type=Path, default=ASSETS, help="where the screenshots go (default docs/assets)")
    parser.add_argument("--keep-assistant", action="store_true",
                        help="leave MLflow's Assistant side panel open in the screenshots, as on a first visit")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    if not os.path.exists(chromium):
        print(f"no Chromium at {chromium}; set CHROMIUM=/path/to/chromium", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the server is killed and temp dirs removed
    started = time.monotonic()
    phases: dict[str, float] = {}
    with running_server() as server:
        phases["server start"] = time.monotonic() - started
        run = tracked_compile(server.uri, args.task_latency, args.reflection_latency)
        logged = logged_metric_keys(server.uri, run.run_id)
        steps = logged_steps(server.uri, run.run_id, EXPECTED_FIRST)
        phases["imports and compile"] = time.monotonic() - started - sum(phases.values())
        with chromium_page(chromium) as page:
            open_model_metrics(page, server.uri, run, args.keep_assistant)
            sizes = {RUN_PAGE_PNG.name: screenshot(page, args.assets / RUN_PAGE_PNG.name)}
            tab = read_charts_tab(page)
            open_overview(page, server.uri, run, args.keep_assistant)
            sizes[OVERVIEW_PNG.name] = screenshot(page, args.assets / OVERVIEW_PNG.name)
            overview = read_overview(page)
        phases["browser"] = time.monotonic() - started - sum(phases.values())
    ok = print_report(run, logged, steps, tab, overview)
    for name, size in sizes.items():
        print(f"saved {args.assets / name} ({size // 1024} KB)")
    print(f"took {time.monotonic() - started:.1f} s (" + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()) + ")")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
