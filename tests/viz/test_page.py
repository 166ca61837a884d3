"""The VIZ page in headless Chromium (Debian's chromium + chromium-driver, driven by selenium): it loads without
console errors, a stage's graph has the recorded UOps' node count, stepping changes it, and the timeline shows the
jitted step's kernels."""

from __future__ import annotations
import json
import shutil
import urllib.request
import pytest

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,900",
)


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def open_page(browser, url: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get("about:blank")
    browser.get(url)
    WebDriverWait(browser, 60).until(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))


def errors(browser) -> list[dict]:
    return [entry for entry in browser.get_log("browser") if entry["level"] in ("SEVERE", "ERROR")]


def api(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def graph_nodes(browser) -> int:
    return browser.execute_script("return document.querySelectorAll('#graph g.node').length")


def test_stage_graph_and_stepping(browser, server_url, recorded):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # a codegen stage whose first step changes the node count
    rw = next(
        r
        for r in recorded.data["rewrites"]
        if r["kernel"] is not None
        and len(recorded.uops[r["root"]].toposort()) != len(api(f"{server_url}/api/rewrite/{r['id']}/step/1")["nodes"])
    )
    open_page(browser, f"{server_url}/#rewrite/{rw['id']}/0")
    assert errors(browser) == []
    assert graph_nodes(browser) == len(recorded.uops[rw["root"]].toposort())
    after = len(api(f"{server_url}/api/rewrite/{rw['id']}/step/1")["nodes"])
    browser.find_element(By.ID, "step-next").click()
    label = f"step 1 of {len(rw['steps'])}"
    WebDriverWait(browser, 30).until(lambda d: label in d.find_element(By.ID, "step-label").text)
    WebDriverWait(browser, 30).until(lambda d: graph_nodes(d) == after)
    rule = recorded.data["rules"][rw["steps"][0][2]]
    assert rule["loc"] in browser.find_element(By.ID, "rule").text
    assert browser.find_elements(By.CSS_SELECTOR, "#graph g.node.added")
    node = browser.find_elements(By.CSS_SELECTOR, "#graph g.node")[0]
    browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", node)
    op = recorded.data["nodes"][int(node.get_attribute("data-id"))][0]
    info = browser.find_element(By.ID, "node-info").text
    assert op in info and "dtype:" in info
    browser.find_element(By.ID, "step-prev").click()
    WebDriverWait(browser, 30).until(lambda d: graph_nodes(d) == len(recorded.uops[rw["root"]].toposort()))
    assert errors(browser) == []


def test_kernel_source_beside_its_uops(browser, server_url, recorded):
    from selenium.webdriver.common.by import By

    kernel = recorded.recorder.kernels[-1]
    open_page(browser, f"{server_url}/#kernel/{kernel['id']}")
    source = browser.find_element(By.ID, "source")
    assert kernel["name"] in source.text and source.find_elements(By.CSS_SELECTOR, "span.kw")
    assert len(browser.find_element(By.ID, "lin").text.splitlines()) == len(kernel["lin"])
    asm = browser.find_element(By.ID, "asm")
    assert asm.is_displayed() and kernel["name"] in asm.text and "ret" in asm.text
    assert errors(browser) == []


def test_timeline_shows_the_jitted_kernels(browser, server_url, recorded):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    open_page(browser, f"{server_url}/#timeline")
    kernels = browser.find_elements(By.CSS_SELECTOR, "#timeline rect.slice[data-cat=kernel]")
    assert len(kernels) >= 3 * recorded.launches
    browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", kernels[-1])
    info = browser.find_element(By.ID, "slice-info").text
    assert "[kernel]" in info and "compiled: " in info and "cache " in info
    browser.find_element(By.ID, "open-kernel").click()  # from the slice to the kernel it launched
    name = info.split(" [kernel]")[0]
    WebDriverWait(browser, 30).until(lambda d: d.find_element(By.ID, "kernel-title").text.startswith(name + " on "))
    assert errors(browser) == []


def test_roofline_places_each_kernel_under_the_roof(browser, server_url, recorded, served_peaks):
    from selenium.webdriver.common.by import By

    open_page(browser, f"{server_url}/#roofline")
    launched = {e["name"] for e in recorded.trace["traceEvents"] if e.get("cat") == "kernel" and e["ph"] == "X"}
    points = browser.find_elements(By.CSS_SELECTOR, "#roofline circle.kernel-point")
    assert len(points) == len(launched) > 0
    titles = [p.find_element(By.TAG_NAME, "title").get_attribute("textContent") for p in points]
    assert {t.split(":")[0] for t in titles} == launched and all("% of its roof" in t for t in titles)
    assert browser.find_element(By.ID, "roof").get_attribute("d").count("L") == 2  # the bandwidth slope, then flat
    assert "400 GFLOPS, 20 GB/s" in browser.find_element(By.ID, "roofline-meta").text
    browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", points[0])
    assert browser.find_element(By.ID, "kernel-title").text.startswith(titles[0].split(":")[0] + " on ")
    assert errors(browser) == []
