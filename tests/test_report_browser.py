"""The report as a person meets it: a real CPU sweep (the reference variant) stored beside the GPU
fixture (tests/fixtures/gpu-results, synthetic), built into Snakemake's HTML report by plain
`snakemake --report-after-run` and `snakemake --report`, opened in headless Chromium, every figure
checked to render as a non-empty image; then `convsweep browse`'s Datasette, every canned query checked
to answer with rows. Screenshots go to results/screenshots (or $CONVSWEEP_SCREENSHOTS) for a person."""
from __future__ import annotations

import base64
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from convsweep.app import browse
from convsweep.base.paths import ROOT

SNAKEMAKE = shutil.which("snakemake")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
FIXTURE = ROOT / "tests" / "fixtures" / "gpu-results"
EXPERIMENT = "lenet86-ci"  # the fixture's experiment: the CPU sweep stores its runs beside them
SCREENSHOTS = Path(os.environ.get("CONVSWEEP_SCREENSHOTS") or ROOT / "results" / "screenshots")
# As root in a container: no sandbox; nothing reaching out (without these, Chromium's own background
# connections are refused many at a time and slow every page).
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1600,1000")
WAIT_S = 30


def missing() -> str | None:
    """Why the browser check cannot run here, or None."""
    if SNAKEMAKE is None:
        return "snakemake is not installed"
    if CHROMIUM is None:
        return "no chromium on PATH (apt-get install chromium)"
    if CHROMEDRIVER is None:
        return "no chromedriver on PATH (apt-get install chromium-driver)"
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install -e '.[test]')"
    return None


pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")


@dataclass(frozen=True)
class Built:
    work: Path
    db: Path
    results: Path  # results/<experiment>
    report: Path  # snakemake --report
    after_run: Path  # snakemake --report-after-run


def run(cmd: list[str], env: dict, what: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, f"{what} failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Built:
    """The fixture ingested, then the sweep with its report after the run, then the report again."""
    work = tmp_path_factory.mktemp("report")
    db = work / "db.sqlite"
    env = {**os.environ, "CONVSWEEP_DB": f"sqlite:///{db}"}
    (work / "experiments.yaml").write_text(yaml.safe_dump({"experiments": {EXPERIMENT: {
        "network": "networks/lenet86.yaml", "variants": ["reference"], "batches": [8, 16], "repeats": 2,
        "warmup": 0, "profiler": "events"}}}))
    run([sys.executable, "-m", "convsweep.app.cli", "ingest", *map(str, sorted(FIXTURE.glob("*.json")))], env, "ingest")
    snakemake = [SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"), "--directory", str(work), "--cores", "1",
                 "--config", f"results_dir={work / 'results'}"]
    after_run, report = work / "after-run.html", work / "report.html"
    run([*snakemake, "--report-after-run", "--report", str(after_run)], env, "the sweep with --report-after-run")
    assert (work / "results" / EXPERIMENT / "report.md").is_file(), \
        "the sweep wrote no report.md: the Snakefile's rule all must ask for results/<experiment>/report.md"
    run([*snakemake, "--report", str(report)], env, "snakemake --report")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(report, SCREENSHOTS / "report.html")  # beside the screenshots, for a person to open
    return Built(work, db, work / "results" / EXPERIMENT, report, after_run)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver, script: str, what: str, *args):
    """Poll a JavaScript expression until it is truthy; its value, or a failure naming `what`."""
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(lambda d: d.execute_script(script, *args))
    except Exception as e:
        pytest.fail(f"{what}: not seen within {WAIT_S} s ({type(e).__name__})")


def screenshot(driver, name: str, full_page: bool = False) -> Path:
    path = SCREENSHOTS / f"{name}.png"
    if full_page:  # the whole document, not only the window
        shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path.write_bytes(base64.b64decode(shot["data"]))
    else:
        driver.save_screenshot(str(path))
    return path


def click_text(driver, text: str) -> None:
    """Click the report menu's link that reads `text`, as a person would."""
    from selenium.webdriver.common.by import By

    menu = driver.find_elements(By.CSS_SELECTOR, "nav a")
    links = [a for a in menu if a.text.strip() == text]
    assert links, f"no link {text!r} in the report's menu: {[a.text for a in menu]}"
    links[0].click()


def open_report(driver, path: Path) -> dict:
    """Load the report and wait for its app to draw the menu; the report's results by path."""
    driver.get(path.as_uri())
    wait_for(driver, "return [...document.querySelectorAll('nav a')].some(a => a.textContent.trim() == 'Workflow')",
             "the report's menu")
    return driver.execute_script("return {results: results, categories: categories}")


def open_subcategory(driver, path: Path, category: str, subcategory: str) -> list:
    """From a fresh page: the category in the menu, then the subcategory; the rows it lists."""
    from selenium.webdriver.common.by import By

    data = open_report(driver, path)
    click_text(driver, "Results" if len(data["categories"]) == 1 else category)
    if len(data["categories"][category]) > 1:
        click_text(driver, subcategory)
    wait_for(driver, "return document.querySelectorAll('nav table tbody tr').length", f"{subcategory}'s rows")
    return driver.find_elements(By.CSS_SELECTOR, "nav table tbody tr")


def row_for(driver, path: Path, category: str, subcategory: str, label: str):
    from selenium.webdriver.common.by import By

    rows = open_subcategory(driver, path, category, subcategory)
    found = [row for row in rows if row.find_elements(By.CSS_SELECTOR, "td")[0].text.strip() == label]
    assert found, f"no row {label!r} under {category} / {subcategory}: {[r.text for r in rows]}"
    return found[0]


def test_the_sweep_writes_the_seeds_format_report_and_its_tables(built):
    text = (built.results / "report.md").read_text()
    for variant in ("naive", "fp16_sliding_window", "register_tiled_gemm", "reference"):
        assert f"## `{variant}`" in text
    assert "× over naive (baseline)" in text and "**compute-bound: SM 67% of peak, tensor pipe 58%**" in text
    assert "None: `reference` runs on the CPU" in text
    for kind in ("op-time", "speedup", "roofline", "streams", "phases", "tuning", "pareto"):
        assert f"![{kind}](figures/{kind}.png)" in text and (built.results / "figures" / f"{kind}.png").is_file()
    seeds = (built.results / "tables" / "seeds.csv").read_text().splitlines()
    assert seeds[0].startswith("variant,tunables,batch") and any(line.startswith("reference,") for line in seeds)
    assert len((built.results / "tables" / "why.csv").read_text().splitlines()) == 1 + 4
    assert built.after_run.stat().st_size > 100_000 and built.report.stat().st_size > 100_000


def test_every_figure_of_the_html_report_renders(built, browser):
    """Each image the report holds, opened from its row as a person would, shows with a width; the
    report page (report.md as HTML) shows its tables and every figure inside the report's frame."""
    from selenium.webdriver.common.by import By

    data = open_report(browser, built.report)
    screenshot(browser, "report-start")
    assert EXPERIMENT in data["categories"], f"no category {EXPERIMENT}: {list(data['categories'])}"
    figures = {path: r for path, r in data["results"].items() if r["mime_type"].startswith("image/")}
    drawn = sorted(p.name for p in (built.results / "figures").glob("*.png"))
    assert sorted(r["filename"] for r in figures.values()) == drawn and len(drawn) == 7  # pareto too: it has energy
    for _, result in sorted(figures.items()):
        label = result["labels"]["figure"]
        row = row_for(browser, built.report, EXPERIMENT, "figures", label)
        row.find_elements(By.CSS_SELECTOR, "td")[-1].find_elements(By.CSS_SELECTOR, "a")[0].click()
        size = wait_for(browser, "const img = [...document.images].find(i => i.src == arguments[0]);"
                                 "return img && img.complete && img.naturalWidth > 0"
                                 " && [img.naturalWidth, img.naturalHeight];", f"figure {label} as an image",
                        result["data_uri"])
        assert size[0] > 300 and size[1] > 200, f"figure {label} is {size}"
        screenshot(browser, f"report-figure-{label}")

    page = next(r for r in data["results"].values() if r["filename"] == "report.html")
    row = row_for(browser, built.report, EXPERIMENT, "tables", page["labels"]["table"])
    row.find_elements(By.CSS_SELECTOR, "td")[-1].find_elements(By.CSS_SELECTOR, "a")[0].click()
    wait_for(browser, "return [...document.querySelectorAll('iframe')].some(f => f.src == arguments[0])",
             "the report page's frame", page["data_uri"])
    screenshot(browser, "report-page-in-report")
    frame = next(f for f in browser.find_elements(By.TAG_NAME, "iframe") if f.get_attribute("src") == page["data_uri"])
    browser.switch_to.frame(frame)
    try:
        widths = wait_for(browser, "const imgs = [...document.images]; return imgs.length"
                                   " && imgs.every(i => i.complete) && imgs.map(i => i.naturalWidth);",
                          "the report page's figures")
        assert len(widths) == len(drawn) and min(widths) > 300
        assert len(browser.find_elements(By.TAG_NAME, "table")) >= 8
    finally:
        browser.switch_to.default_content()

    for name in ("seeds.csv", "why.csv"):  # offered as downloads: the button holds the file
        table = next(r for r in data["results"].values() if r["filename"] == name)
        text = base64.b64decode(table["data_uri"].split("base64,", 1)[1]).decode()
        assert text.splitlines()[0].startswith(("variant,", "experiment,")), name

    # The page on its own, whole, for a person to read.
    browser.get((built.results / "report.html").as_uri())
    wait_for(browser, "return [...document.images].every(i => i.complete && i.naturalWidth > 0)", "the page's figures")
    screenshot(browser, "report-page", full_page=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def datasette(built, browser):
    """`convsweep browse`'s Datasette on the sweep's database, on a free localhost port, the browser let in by the
    run's token URL as a person would be."""
    if importlib.util.find_spec("datasette") is None:
        pytest.skip(f"Datasette is not installed ({browse.INSTALL_HINT})")
    token = browse.new_token()
    port = free_port()
    with browse.server_files(built.db) as files:
        process = subprocess.Popen(browse.browse_command(built.db, files, port=port),
                                   env=browse.server_environment(token), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + WAIT_S
            while True:
                try:
                    urllib.request.urlopen(f"{base}/-/versions.json", timeout=5).close()
                    pytest.fail("Datasette answered a request without the token")
                except urllib.error.HTTPError:  # the gate's 403: up
                    break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        pytest.fail(f"datasette did not start: {process.stderr.read().decode()[-2000:]}")
                    time.sleep(0.2)
            browser.get(f"{base}/?token={token}")  # sets the cookie every later page needs
            yield base
        finally:
            process.terminate()
            process.wait(timeout=30)


def test_every_canned_query_of_the_datasette_page_answers_with_rows(built, browser, datasette):
    from selenium.webdriver.common.by import By

    database = built.db.stem
    browser.get(f"{datasette}/{database}")
    wait_for(browser, "return document.querySelector('h1')", "Datasette's database page")
    screenshot(browser, "datasette-database", full_page=True)
    listed = {a.get_attribute("href").rsplit("/", 1)[-1] for a in browser.find_elements(By.CSS_SELECTOR, "a")
              if a.get_attribute("href") and f"/{database}/" in a.get_attribute("href")}
    queries = browse.canned_queries()
    assert set(queries) <= listed, f"canned queries not on the page: {sorted(set(queries) - listed)}"
    empty = []
    for name in queries:
        browser.get(f"{datasette}/{database}/{name}")
        rows = wait_for(browser, "const t = document.querySelector('table.rows-and-columns');"
                                 "return t ? t.querySelectorAll('tbody tr').length : "
                                 "(document.querySelector('.zero-results, p.zero-results') ? -1 : 0);",
                        f"query {name}'s table")
        screenshot(browser, f"datasette-{name}", full_page=True)  # the SQL comes first, the rows below it
        if rows < 1:
            empty.append(name)
    assert not empty, f"canned queries without rows: {empty}"
