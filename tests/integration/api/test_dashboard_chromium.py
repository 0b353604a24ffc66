"""The dashboard in real headless Chromium against `gpuwm api` serving a populated store.

Asserts what is drawn (tables, sort order, chart pixels) and saves screenshots under test-artifacts/.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwm.model.figures import ClusterFigures
from gpuwm.store.embedded import EmbeddedStore
from tests.unit.store.store_data import project, sample, workload

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMEDRIVER = shutil.which("chromedriver")
ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None,
        reason="chromium/chromedriver not installed (Debian: apt-get install chromium chromium-driver)",
    ),
]


def _populate(path: Path) -> None:
    store = EmbeddedStore(path)
    t0 = math.floor((time.time() - 30 * 60) / 15) * 15
    for k in range(120):
        t = float(t0 + 15 * k)
        u = 50.0 + 40.0 * math.sin(k / 10)
        train = workload(
            "train", [("gpu-0", 1.0, u), ("gpu-1", 1.0, u / 2)], energy_joules=300.0 * k, created=t0
        )
        notebook = workload(
            "notebook",
            [("gpu-7", 1.0, 0.0)],
            namespace="team-b",
            project="beta",
            node="node-b",
            idle_seconds=600.0 + 15 * k,
            created=t0 - 7200,
        )
        notebook.idle_gpu_seconds = 3 * 3600.0
        stale = workload(
            "stale-eval",
            [("gpu-8", 0.5, 0.0)],
            namespace="team-b",
            project="beta",
            node="node-b",
            idle_seconds=100.0 + 15 * k,
            created=t0 - 3600,
        )
        stale.idle_gpu_seconds = 1 * 3600.0
        train.utilization.current = u
        train.utilization.avg1h = 50.0
        train.memory_utilization.current = 31.25
        alpha = project("alpha", [train], 300.0 * k)
        alpha.utilization.current = 37.5
        beta = project("beta", [notebook, stale])
        beta.idle_gpus = 1.5
        beta.idle_gpu_seconds = 4 * 3600.0
        store.record(
            t,
            [
                sample(t, "gpu-0", sm=u, used_gib=20 + k / 10),
                sample(t, "gpu-1", sm=u / 2, used_gib=30),
                sample(t, "gpu-7", node="node-b", sm=0, used_gib=5),
                sample(t, "gpu-8", node="node-b", sm=0, used_gib=2),
            ],
            [train, notebook, stale],
            [alpha, beta],
            ClusterFigures(gpus=4, allocated_gpus=3.5, idle_gpus=1.5, workloads=3),
        )
    store.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def api_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("dashboard")
    database = workdir / "gpuwm.db"
    _populate(database)
    yield from _serve(workdir, database)


@pytest.fixture(scope="module")
def queue_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`gpuwm api` over a store whose workloads queue: the engine's figures of workload events."""
    from tests.unit.api.test_api_queue import figures_store

    workdir = tmp_path_factory.mktemp("queue")
    figures_store(workdir / "gpuwm.db").close()
    yield from _serve(workdir, workdir / "gpuwm.db")


@pytest.fixture(scope="module")
def priced_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`gpuwm api --pricing` over a priced history (a whole H100, a MIG slice, two time-sliced L4 quarters)."""
    import json

    from tests.unit.api.priced_history import PRICES, record_priced_trace

    workdir = tmp_path_factory.mktemp("priced")
    store = EmbeddedStore(workdir / "gpuwm.db")
    record_priced_trace(store, PRICES)
    store.close()
    yield from _serve(workdir, workdir / "gpuwm.db", "--pricing", json.dumps(PRICES))


def _serve(workdir: Path, database: Path, *options: str) -> Iterator[str]:
    """`gpuwm api` on `database` (with `options`) at a free 127.0.0.1 port until the generator is closed."""
    port = _free_port()
    log_path = workdir / "api.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuwm.cli",
                "api",
                "--store",
                str(database),
                "--api-listen",
                f"127.0.0.1:{port}",
                "--auth",
                "none",
                "--api-tls=false",
                *options,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"gpuwm api did not start: {log_path.read_text()[-2000:]}") from None
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert "AUTHENTICATION IS OFF" in log_path.read_text()


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory, downloads: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.add_experimental_option(
        "prefs", {"download.default_directory": str(downloads), "download.prompt_for_download": False}
    )
    assert CHROMIUM is not None and CHROMEDRIVER is not None
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1280,1400",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    driver.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    # every Content-Security-Policy violation of every page, for test_the_page_keeps_its_policy_and_token
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CSP_RECORDER})
    yield driver
    driver.quit()


CSP_RECORDER = (
    "window.cspViolations = [];"
    "document.addEventListener('securitypolicyviolation',"
    " (e) => window.cspViolations.push(e.violatedDirective + ' ' + e.blockedURI));"
)


def _wait_ready(driver: Any) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 30).until(
        lambda d: d.execute_script("return document.body.dataset.ready") == "true"
    )


def test_overview_shows_projects_and_idle_workloads(api_url: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    driver.get(api_url + "/#/")
    _wait_ready(driver)
    assert driver.find_element(By.ID, "error").get_attribute("hidden") is not None
    rows = driver.find_elements(By.CSS_SELECTOR, "#projects tbody tr")
    cells = [[td.text for td in row.find_elements(By.TAG_NAME, "td")] for row in rows]
    assert [row[0] for row in cells] == ["alpha", "beta"]
    assert cells[0][2] == "2.00" and cells[1][2] == "1.50" and cells[1][3] == "1.50"
    assert cells[1][5] == "4.00"  # wasted GPU-hours of beta
    assert (cells[0][4], cells[1][4]) == ("37.5 %", "–")  # utilisation; none known for beta
    idle_rows = driver.find_elements(By.CSS_SELECTOR, "#idle tbody tr")
    assert [row.get_attribute("data-workload") for row in idle_rows] == [
        "team-b/notebook",
        "team-b/stale-eval",
    ]
    assert [row.find_elements(By.TAG_NAME, "td")[4].text for row in idle_rows] == ["3.00", "1.00"]
    summary = driver.find_element(By.ID, "summary").text
    assert summary.startswith("3 workloads")
    assert driver.find_element(By.ID, "truth").get_attribute("hidden") is not None  # no /demo/truth: not a demo
    ARTIFACTS.mkdir(exist_ok=True)
    assert driver.save_screenshot(str(ARTIFACTS / "dashboard-overview.png"))


def test_workload_page_draws_charts(api_url: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    driver.get(api_url + "/#/workload/team-a/train")
    _wait_ready(driver)
    assert driver.find_element(By.ID, "workload-title").text == "Job team-a/train"
    for metric in ("gpu_utilization_percent", "gpu_memory_used_bytes", "gpu_power_watts"):
        canvas = driver.find_element(By.ID, f"chart-{metric}")
        assert int(canvas.get_attribute("data-points")) == 120
        # count the line's blue pixels actually painted on the canvas
        blue = driver.execute_script(
            "const c = arguments[0]; const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
            "let n = 0; for (let i = 0; i < d.length; i += 4) { if (d[i+2] > 150 && d[i] < 120) n++; } return n;",
            canvas,
        )
        assert blue > 500, f"{metric}: only {blue} line pixels drawn"
    ARTIFACTS.mkdir(exist_ok=True)
    assert driver.save_screenshot(str(ARTIFACTS / "dashboard-workload.png"))


def test_demo_dashboard_holds_the_figures_against_the_ground_truth(browser: Any, tmp_path: Path) -> None:
    """`gpuwm demo` in the browser: the overview says how far the figures are from the simulator's ground truth."""
    from selenium.webdriver.common.by import By

    port = _free_port()
    log_path = tmp_path / "demo.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpuwm.cli", "demo", "--listen", f"127.0.0.1:{port}", "--no-table",
             "--nodes", "3", "--gpus-per-node", "2", "--warmup", "10m", "--speed", "120", "--faults"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while "warm-up done" not in log_path.read_text():  # during the warm-up every moment stores an interval
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gpuwm demo did not warm up: {log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        driver = browser
        driver.get(url + "/#/")
        _wait_ready(driver)
        truth = driver.find_element(By.ID, "truth")
        assert truth.get_attribute("hidden") is None
        assert truth.text.startswith("Simulated fleet: ") and truth.text.endswith(
            "against the simulator's ground truth the largest gap in a workload's GPU-seconds is 0.000."), truth.text
        ARTIFACTS.mkdir(exist_ok=True)
        assert driver.save_screenshot(str(ARTIFACTS / "dashboard-demo.png"))
    finally:
        process.terminate()
        process.wait(timeout=30)


def _screenshots(driver: Any, name: str) -> None:
    """The page at the two window sizes the issue reviews it at, saved under test-artifacts/."""
    ARTIFACTS.mkdir(exist_ok=True)
    for width, height in ((1400, 1000), (800, 900)):
        driver.set_window_size(width, height)
        time.sleep(0.3)  # the charts redraw on resize
        assert driver.save_screenshot(str(ARTIFACTS / f"dashboard-{name}-{width}x{height}.png"))
    driver.set_window_size(1280, 1400)


def _rows(driver: Any, selector: str) -> list[list[str]]:
    """The table's cells; read again where the page re-rendered the table while it was being read."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    for _attempt in range(5):
        try:
            return [[td.text for td in row.find_elements(By.TAG_NAME, "td")]
                    for row in driver.find_elements(By.CSS_SELECTOR, selector)]
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{selector}: the table was re-rendered on every one of 5 reads")


def test_all_workloads_sort_filter_and_page(api_url: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = browser
    driver.get(api_url + "/#/")
    _wait_ready(driver)
    assert [row[0] for row in _rows(driver, "#workloads tbody tr")] == [
        "team-a/train", "team-b/notebook", "team-b/stale-eval"]
    gpus_header = driver.find_element(By.CSS_SELECTOR, "#workloads th[data-key=allocatedGpus]")
    gpus_header.click()
    assert [row[3] for row in _rows(driver, "#workloads tbody tr")] == ["0.50", "1.00", "2.00"]
    gpus_header.click()
    assert [row[3] for row in _rows(driver, "#workloads tbody tr")] == ["2.00", "1.00", "0.50"]
    assert gpus_header.get_attribute("data-sorted") == "descending"
    Select(driver.find_element(By.ID, "filter-project")).select_by_value("beta")
    assert [row[0] for row in _rows(driver, "#workloads tbody tr")] == ["team-b/notebook", "team-b/stale-eval"]
    driver.find_element(By.ID, "filter-text").send_keys("stale")
    assert [row[0] for row in _rows(driver, "#workloads tbody tr")] == ["team-b/stale-eval"]
    driver.find_element(By.ID, "filter-text").send_keys("-nothing")
    assert _rows(driver, "#workloads tbody tr") == [["no workload matches these filters"]]
    assert driver.find_element(By.ID, "page-text").text.startswith("0 workloads · page 1 of 1")
    driver.find_element(By.ID, "filter-text").clear()
    Select(driver.find_element(By.ID, "filter-project")).select_by_value("")
    driver.find_element(By.ID, "filter-idle").click()
    assert [row[0] for row in _rows(driver, "#workloads tbody tr")] == ["team-b/notebook", "team-b/stale-eval"]
    # 30 rows page at 25: the pager moves through them
    driver.execute_script(
        "allWorkloads = Array.from({length: 30}, (_, i) => ({...allWorkloads[0], name: 'w' + String(i).padStart(2, '0')}));"
        "document.querySelector('#filter-idle').checked = false; drawWorkloads();")
    assert len(_rows(driver, "#workloads tbody tr")) == 25
    driver.find_element(By.ID, "page-next").click()
    assert len(_rows(driver, "#workloads tbody tr")) == 5
    assert driver.find_element(By.ID, "page-text").text == "30 workloads · page 2 of 2"


def test_time_range_picker_zoom_and_breakdown(api_url: str, browser: Any) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = browser
    driver.get(api_url + "/#/workload/team-a/train")
    _wait_ready(driver)
    canvas = driver.find_element(By.ID, "chart-gpu_utilization_percent")
    assert int(canvas.get_attribute("data-ticks")) >= 3  # time ticks, not only the two ends
    panel = driver.find_element(By.CSS_SELECTOR, "#workload-charts figure")
    assert canvas.size["width"] >= panel.size["width"] - 40  # the chart fills its panel
    Select(driver.find_element(By.ID, "range")).select_by_value("86400")
    _wait_ready(driver)
    assert "one point per" in driver.find_element(By.ID, "range-text").text
    canvas = driver.find_element(By.ID, "chart-gpu_utilization_percent")
    assert int(canvas.get_attribute("data-points")) < 120  # 24 h at 2.5 min a point: the 30 minutes in 12 points
    Select(driver.find_element(By.ID, "range")).select_by_value("3600")
    _wait_ready(driver)
    canvas = driver.find_element(By.ID, "chart-gpu_utilization_percent")
    assert int(canvas.get_attribute("data-points")) == 120
    # hover over the data (the last half hour of the hour shown): the read-out names the time and the value
    width = canvas.size["width"]
    ActionChains(driver).move_to_element_with_offset(canvas, width // 4, 0).perform()
    tooltip = driver.find_element(By.ID, "tooltip")
    assert tooltip.is_displayed() and "UTC" in tooltip.text and "%" in tooltip.text
    # drag across a fifth of the chart: the range becomes that stretch
    ActionChains(driver).move_to_element_with_offset(canvas, width // 8, 0).click_and_hold() \
        .move_by_offset(width // 5, 0).release().perform()
    _wait_ready(driver)
    assert Select(driver.find_element(By.ID, "range")).first_selected_option.get_attribute("value") == "custom"
    zoomed = int(driver.find_element(By.ID, "chart-gpu_utilization_percent").get_attribute("data-points"))
    assert 0 < zoomed < 60
    Select(driver.find_element(By.ID, "range")).select_by_value("")
    _wait_ready(driver)
    Select(driver.find_element(By.ID, "breakdown")).select_by_value("gpu")
    _wait_ready(driver)
    canvas = driver.find_element(By.ID, "chart-gpu_utilization_percent")
    assert canvas.get_attribute("data-series") == "2"
    legend = driver.find_elements(By.CSS_SELECTOR, "#workload-charts figure:first-child .chart-legend span")
    assert len(legend) == 2 and all("node-a GPU" in item.text for item in legend)
    _screenshots(driver, "workload-by-gpu")
    Select(driver.find_element(By.ID, "breakdown")).select_by_value("")
    _wait_ready(driver)


def test_unknown_workload_shows_its_error_alone(api_url: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    driver.get(api_url + "/#/workload/team-a/nope")
    _wait_ready(driver)
    error = driver.find_element(By.ID, "error")
    assert error.is_displayed() and "no workload 'nope'" in error.text
    assert driver.find_elements(By.CSS_SELECTOR, "#workload-charts canvas") == []


def test_fleet_lists_nodes_and_a_node_its_gpus(api_url: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    driver.get(api_url + "/#/fleet")
    _wait_ready(driver)
    rows = _rows(driver, "#nodes tbody tr")
    assert [row[0] for row in rows] == ["node-a", "node-b"]
    assert rows[0][1] == "2" and rows[1][1] == "2"
    assert driver.find_element(By.ID, "summary").text.startswith("2 nodes · 4 GPUs")
    _screenshots(driver, "fleet")
    driver.find_element(By.LINK_TEXT, "node-b").click()
    _wait_ready(driver)
    assert driver.find_element(By.ID, "node-title").text == "Node node-b"
    states = {row.get_attribute("data-uuid"): row.get_attribute("data-state")
              for row in driver.find_elements(By.CSS_SELECTOR, "#node-gpus tbody tr")}
    assert set(states) == {"gpu-7", "gpu-8"}
    assert int(driver.find_element(By.ID, "chart-gpu_utilization_percent").get_attribute("data-points")) > 0
    _screenshots(driver, "node")


def test_report_downloads_as_csv(api_url: str, browser: Any, downloads: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    driver = browser
    driver.get(api_url + "/#/")
    _wait_ready(driver)
    Select(driver.find_element(By.ID, "report-by")).select_by_value("workload")
    driver.find_element(By.ID, "report-download").click()
    target = downloads / "gpuwm-report-workload.csv"
    WebDriverWait(driver, 30).until(lambda _d: target.exists() and target.stat().st_size > 0)
    lines = target.read_text().splitlines()
    assert lines[0].startswith("project,namespace,workload,workloadUid,kind,workloads,allocatedGpuHours")
    assert sorted(line.split(",")[2] for line in lines[1:-1]) == ["notebook", "stale-eval", "train"]
    assert lines[-1].startswith("total,")
    assert driver.find_element(By.ID, "report-status").text == "3 rows downloaded"
    _screenshots(driver, "overview")


def test_queue_lists_waiting_workloads_by_wait(queue_url: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = browser
    driver.get(queue_url + "/#/")
    _wait_ready(driver)
    driver.find_element(By.ID, "nav-queue").click()
    _wait_ready(driver)
    assert driver.find_element(By.ID, "queue").is_displayed()
    rows = _rows(driver, "#queue-workloads tbody tr")
    assert [(row[0], row[2], row[3], row[4], row[6]) for row in rows] == [
        ("team-a/backlog", "Queued", "4.00", "15 min", "15 min"),  # 900 s
        ("team-a/admitted", "Pending", "2.00", "10 min", "5 min"),  # waited 600 s, queued 300 s
        ("team-b/preempted", "Queued", "1.00", "8 min", "7 min"),  # 450 s, 400 s: ran 200..600
    ]
    assert rows[0][7:9] == ["team-a-q", "gpus"]
    widths = [float(bar.get_attribute("style").split("width:")[1].split("px")[0])
              for bar in driver.find_elements(By.CSS_SELECTOR, "#queue-workloads tbody .bar")]
    assert widths == sorted(widths, reverse=True) and widths[0] == 120.0
    assert driver.find_element(By.ID, "summary").text.startswith(
        "3 waiting · 2 queued · 1 pending · 7.00 GPUs requested · longest wait 15 min")
    demand = _rows(driver, "#queue-projects tbody tr")
    assert [row[:4] for row in demand] == [["alpha", "1", "6.00", "15 min"], ["beta", "1", "1.00", "7 min"]]
    _screenshots(driver, "queue")
    Select(driver.find_element(By.ID, "queue-namespace")).select_by_value("team-b")
    assert [row[0] for row in _rows(driver, "#queue-workloads tbody tr")] == ["team-b/preempted"]
    driver.find_element(By.LINK_TEXT, "team-b/preempted").click()
    _wait_ready(driver)
    facts = driver.find_element(By.ID, "workload-facts").text
    assert "requested GPUs\n1.00" in facts and "queued\n7 min" in facts and "team-b-q → gpus" in facts


def test_the_page_keeps_its_policy_and_token(api_url: str, browser: Any, downloads: Path) -> None:
    """Under the API's Content-Security-Policy the pages run as they are (nothing refused: no inline
    script or style), and a token typed in lives in the tab's sessionStorage, not in localStorage."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    driver = browser
    driver.get(api_url + "/#/")
    _wait_ready(driver)
    token = driver.find_element(By.ID, "token")
    token.send_keys("example-token")
    driver.execute_script("arguments[0].dispatchEvent(new Event('change'))", token)
    _wait_ready(driver)
    assert driver.execute_script("return sessionStorage.getItem('gpuwm-token')") == "example-token"
    assert driver.execute_script("return localStorage.getItem('gpuwm-token')") is None
    Select(driver.find_element(By.ID, "report-by")).select_by_value("project")
    driver.find_element(By.ID, "report-download").click()
    target = downloads / "gpuwm-report-project.csv"
    WebDriverWait(driver, 30).until(lambda _d: target.exists() and target.stat().st_size > 0)
    driver.get(api_url + "/#/workload/team-a/train")
    _wait_ready(driver)
    Select(driver.find_element(By.ID, "breakdown")).select_by_value("gpu")  # a chart with a legend
    _wait_ready(driver)
    assert len(driver.find_elements(By.CSS_SELECTOR, ".chart-legend i")) >= 2
    driver.get(api_url + "/#/fleet")
    _wait_ready(driver)
    assert driver.execute_script("return window.cspViolations") == []
    assert driver.execute_script("return sessionStorage.getItem('gpuwm-token')") == "example-token"


def test_the_period_cost_shows_where_priced_and_downloads_as_focus(
    api_url: str, priced_url: str, browser: Any, downloads: Path
) -> None:
    import json
    import urllib.request

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    driver = browser
    driver.get(api_url + "/#/")
    _wait_ready(driver)
    assert not driver.find_element(By.ID, "report-cost").is_displayed()  # no pricing: no cost, no FOCUS
    assert driver.find_element(By.ID, "report-format-focus").get_attribute("hidden") is not None
    driver.get(priced_url + "/#/")
    _wait_ready(driver)
    assert driver.find_element(By.ID, "report-cost").is_displayed()
    with urllib.request.urlopen(priced_url + "/api/v1/report") as answer:
        total = json.load(answer)["total"]
    rows = _rows(driver, "#report-cost tbody tr")
    assert [row[0] for row in rows] == ["vision", "total"]
    assert rows[-1][3] == f"{total['cost']:.2f}" and rows[-1][4] == f"{total['idleCost']:.2f}"
    assert "in EUR" in driver.find_element(By.ID, "report-cost-caption").text
    Select(driver.find_element(By.ID, "report-by")).select_by_value("workload")
    WebDriverWait(driver, 30).until(lambda d: len(_rows(d, "#report-cost tbody tr")) == 5)
    assert _rows(driver, "#report-cost tbody tr")[0][0] == "ml/whole"  # the costliest first
    Select(driver.find_element(By.ID, "report-format")).select_by_value("focus")
    driver.find_element(By.ID, "report-download").click()
    target = downloads / "gpuwm-focus.csv"
    WebDriverWait(driver, 30).until(lambda _d: target.exists() and target.stat().st_size > 0)
    lines = target.read_text().splitlines()
    assert lines[0].startswith("BilledCost,") and len(lines) == 1 + 5  # 4 GPU Time charges, 1 GPU Energy
    assert driver.find_element(By.ID, "report-status").text == "5 charges downloaded"
    assert driver.execute_script("return window.cspViolations") == []
    _screenshots(driver, "cost")
