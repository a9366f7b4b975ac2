"""The dashboard in a real headless Chromium (Debian's chromium + chromium-driver, selenium).

A test that cannot start Chromium fails and says why: it is installed by
``scripts/install-services`` (as root), never downloaded.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import danaus.dashboard
from danaus._actor.api.procs import owned_proc_meshes
from danaus._observe import logtail
from danaus.actor import this_host
from danaus.testing import FaultRecorder

from .conftest import REPLY_TIMEOUT, Parent, Worker, proc_names

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# The picture in docs/observing.md; rewritten only when asked (UPDATE_DOCS_SCREENSHOT=1),
# so that a test run leaves the working tree as it found it.
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "dashboard.png"
DOCS_MESH_SCREENSHOT = DOCS_SCREENSHOT.with_name("dashboard-mesh.png")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.exists(path) or shutil.which(os.path.basename(path))):
            pytest.fail(
                f"{path} is missing: the dashboard's browser test needs Debian's chromium and "
                "chromium-driver; run scripts/install-services as root (CI does)"
            )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--no-first-run", "--disable-extensions"):  # fmt: skip
        options.add_argument(arg)
    driver_path = CHROMEDRIVER if os.path.exists(CHROMEDRIVER) else shutil.which("chromedriver")
    try:
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
    except Exception as e:
        pytest.fail(f"cannot start headless Chromium ({CHROMIUM} with {driver_path}): {e}")
    try:
        yield driver
    finally:
        driver.quit()


# The page redraws itself on every update: read it in one script, never through
# element handles that the next redraw makes stale.
_READ = """
return {
  procs: [...document.querySelectorAll('.proc')].map(
    e => [e.dataset.proc, e.dataset.state, e.innerText]),
  failures: [...document.querySelectorAll('.failure')].map(e => [e.dataset.actor, e.innerText]),
  summary: document.getElementById('summary').textContent,
};
"""


def _page(driver: Any) -> dict[str, Any]:
    return dict(driver.execute_script(_READ))


def _expected_procs() -> int:
    return sum(len(pm) for pm in owned_proc_meshes())  # each spawned mesh, its procs its own


@pytest.mark.timeout(180)
def test_the_page_shows_the_mesh_and_a_killed_proc(
    browser: Any, faults: FaultRecorder, tmp_path: Path
) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    pm = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    trainers = pm.spawn("trainer", Worker)
    pids = trainers.pid.call().get(timeout=REPLY_TIMEOUT)
    for i in range(20):
        trainers.ping.call(i).get(timeout=REPLY_TIMEOUT)
    trainers.nap.call(0.01).get(timeout=REPLY_TIMEOUT)
    names = proc_names(pm)  # in rank order
    for rank, name in enumerate(names):
        logtail.append(name, f"step 20: loss 0.{rank}42 (rank {rank})")
    dash = danaus.dashboard.serve()
    try:
        browser.get(dash.url)
        want = _expected_procs()

        WebDriverWait(browser, 30).until(lambda d: len(_page(d)["procs"]) == want)
        page = _page(browser)
        states = {name: (state, text) for name, state, text in page["procs"]}
        assert [states[name][0] for name in names] == ["alive"] * 4
        assert "trainer[3]" in states[names[3]][1]
        assert "Worker" in states[names[3]][1]
        assert page["summary"].startswith(f"{want} procs ({want} alive)")
        # For the picture: traffic, so that the rates are not all zero.
        busy = threading.Event()

        def traffic() -> None:
            while not busy.is_set():
                trainers.ping.call(0).get(timeout=REPLY_TIMEOUT)

        pinger = threading.Thread(target=traffic, daemon=True)
        pinger.start()
        try:
            WebDriverWait(browser, 30).until(lambda d: " 0.0 calls/s" not in _page(d)["summary"])
            browser.save_screenshot(str(tmp_path / "dashboard.png"))
        finally:
            busy.set()
            pinger.join(REPLY_TIMEOUT)
        assert (tmp_path / "dashboard.png").stat().st_size > 10_000
        if os.environ.get("UPDATE_DOCS_SCREENSHOT") == "1":
            shutil.copyfile(tmp_path / "dashboard.png", DOCS_SCREENSHOT)

        victim = names[3]

        def victim_dead(d: Any) -> bool:
            return any(n == victim and st == "dead" for n, st, _ in _page(d)["procs"])

        os.kill(pids.item(hosts=1, gpus=1), signal.SIGKILL)
        # The page shows the proc dead (bounded wait; how fast is a benchmark matter,
        # not a threshold here: the page is pushed every dashboard_interval).
        WebDriverWait(browser, 10, poll_frequency=0.02).until(victim_dead)
        faults.crashed("trainer", {3})
        WebDriverWait(browser, 10).until(
            lambda d: any(a == "trainer[3]" for a, _ in _page(d)["failures"])
        )
        page = _page(browser)
        assert "SIGKILL" in dict(page["failures"])["trainer[3]"]
        assert page["summary"].startswith(f"{want} procs ({want - 1} alive)")
    finally:
        dash.stop()
        pm.stop().get(timeout=REPLY_TIMEOUT)


@pytest.mark.timeout(120)
def test_the_stack_dump_button_shows_the_proc_s_stacks(browser: Any, faults: FaultRecorder) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    pm = this_host().spawn_procs(per_host={"gpus": 1})
    mesh = pm.spawn("napper", Worker)
    mesh.initialized.get(timeout=REPLY_TIMEOUT)
    dash = danaus.dashboard.serve()
    try:
        browser.get(dash.url)
        button = f'button.stack[data-proc="{proc_names(pm)[0]}"]'
        WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, button))
        napping = mesh.nap.call_one(5.0)
        browser.execute_script(f"document.querySelector('{button}').click()")
        WebDriverWait(browser, 60).until(lambda d: "nap" in d.find_element(By.ID, "stack-out").text)
        assert "actor-napper" in browser.find_element(By.ID, "stack-out").text
        napping.get(timeout=REPLY_TIMEOUT)
    finally:
        dash.stop()
        pm.stop().get(timeout=REPLY_TIMEOUT)


@pytest.mark.timeout(120)
def test_the_page_shows_procs_an_actor_spawned(browser: Any, faults: FaultRecorder) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    pm = this_host().spawn_procs(per_host={"gpus": 1})
    parent = pm.spawn("browser_parent", Parent)
    children = parent.spawn_children.call_one("browser_nested", 2).get(timeout=REPLY_TIMEOUT)
    dash = danaus.dashboard.serve()
    try:
        browser.get(dash.url)

        def nested(d: Any) -> dict[str, str]:
            return dict(d.execute_script(_READ_NESTED))

        WebDriverWait(browser, 30).until(lambda d: set(children) <= set(nested(d)))
        shown = nested(browser)
        assert all(shown[c] == proc_names(pm)[0] for c in children)
        texts = {name: text for name, _, text in _page(browser)["procs"]}
        assert "spawned by" in texts[children[0]] and "browser_nested[0]" in texts[children[0]]
        parent.stop_children.call_one("browser_nested").get(timeout=REPLY_TIMEOUT)
    finally:
        dash.stop()
        pm.stop().get(timeout=REPLY_TIMEOUT)


_READ_NESTED = """
return Object.fromEntries([...document.querySelectorAll('.proc.nested')].map(
  e => [e.dataset.proc, e.dataset.parent]));
"""


# The picture: every node with its state and colour (the computed fill), every plot's samples.
_READ_PICTURE = """
const fill = e => getComputedStyle(e).fill;
return {
  procs: Object.fromEntries([...document.querySelectorAll('#mesh-svg circle.proc-node')].map(
    e => [e.dataset.proc, [e.dataset.state, e.dataset.kind, fill(e)]])),
  hosts: [...document.querySelectorAll('#mesh-svg rect.hostbox')].map(e => e.dataset.host),
  meshes: Object.fromEntries([...document.querySelectorAll('#mesh-svg g.mesh-node')].map(
    e => [e.dataset.mesh, [e.dataset.kind, [...e.querySelectorAll('rect.rank-node')].map(
      r => [Number(r.dataset.rank), r.dataset.proc, r.dataset.kind, fill(r)])]])),
  plots: Object.fromEntries([...document.querySelectorAll('svg.plot')].map(
    e => [e.dataset.mesh + '.' + e.dataset.endpoint,
          [Number(e.dataset.points), Number(e.dataset.maxRate),
           e.querySelector('path.rate').getAttribute('d')]])),
  colours: Object.fromEntries(['alive', 'failed'].map(k => [k, getComputedStyle(
    document.documentElement).getPropertyValue('--k-' + k).trim()])),
};
"""


def _rgb(hex_colour: str) -> str:
    """``#1a7f37`` as the browser writes a computed colour: ``rgb(26, 127, 55)``."""
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


@pytest.mark.timeout(180)
def test_the_mesh_picture_and_the_endpoint_plots(
    browser: Any, faults: FaultRecorder, tmp_path: Path
) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    pm = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    pictured = pm.spawn("pictured", Worker)
    pids = pictured.pid.call().get(timeout=REPLY_TIMEOUT)
    names = proc_names(pm)
    dash = danaus.dashboard.serve()
    stop_traffic = threading.Event()
    pinger: threading.Thread | None = None
    try:
        browser.get(dash.url)

        def picture(d: Any) -> dict[str, Any]:
            return dict(d.execute_script(_READ_PICTURE))

        def drawn(d: Any) -> bool:
            p = picture(d)
            return (
                set(names) <= set(p["procs"]) and len(p["meshes"].get("pictured", ("", []))[1]) == 4
            )

        WebDriverWait(browser, 30).until(drawn)
        pic = picture(browser)
        alive, failed = _rgb(pic["colours"]["alive"]), _rgb(pic["colours"]["failed"])
        assert alive != failed
        assert [pic["procs"][n][1:] for n in names] == [["alive", alive]] * 4
        assert len(pic["hosts"]) >= 1
        kind, ranks = pic["meshes"]["pictured"]
        assert kind == "alive"
        # Each rank's cell names the proc it runs on (rank order is the proc mesh's order).
        assert [(r, proc, k, colour) for r, proc, k, colour in ranks] == [
            (i, names[i], "alive", alive) for i in range(4)
        ]

        # Calls while the page watches: the plot of pictured.ping gains samples with calls/s > 0.
        def traffic() -> None:
            while not stop_traffic.is_set():
                try:
                    pictured.ping.call(0).get(timeout=REPLY_TIMEOUT)
                except (danaus.actor.ActorError, danaus.actor.SupervisionError):
                    return  # the mesh lost a rank (below)

        pinger = threading.Thread(target=traffic, daemon=True)
        pinger.start()
        # The picture in the docs shows a longer stretch of calls.
        enough = 40 if os.environ.get("UPDATE_DOCS_SCREENSHOT") == "1" else 3

        def plotted(d: Any) -> bool:
            points, max_rate, _ = picture(d)["plots"].get("pictured.ping", (0, 0, ""))
            return points >= enough and max_rate > 0

        WebDriverWait(browser, 60).until(plotted)
        path = picture(browser)["plots"]["pictured.ping"][2]
        assert path.startswith("M") and path.count("L") >= 2  # a line through the samples
        browser.execute_script("document.getElementById('mesh-box').scrollIntoView()")
        browser.save_screenshot(str(tmp_path / "mesh.png"))
        assert (tmp_path / "mesh.png").stat().st_size > 10_000

        # A killed proc: its node and its rank's cell turn the failed colour, the mesh too.
        victim = names[3]
        os.kill(pids.item(hosts=1, gpus=1), signal.SIGKILL)

        def victim_failed(d: Any) -> bool:
            p = picture(d)
            return (
                p["procs"][victim][1] == "failed" and p["meshes"]["pictured"][1][3][2] == "failed"
            )

        WebDriverWait(browser, 30).until(victim_failed)
        faults.crashed("pictured", {3})
        pic = picture(browser)
        assert pic["procs"][victim] == ["dead", "failed", failed]
        assert pic["meshes"]["pictured"][1][3][3] == failed
        assert pic["meshes"]["pictured"][0] == "failed"
        assert [pic["procs"][n][1:] for n in names[:3]] == [["alive", alive]] * 3
        browser.execute_script("document.getElementById('mesh-box').scrollIntoView()")
        browser.save_screenshot(str(tmp_path / "mesh-failed.png"))
        if os.environ.get("UPDATE_DOCS_SCREENSHOT") == "1":
            shutil.copyfile(tmp_path / "mesh-failed.png", DOCS_MESH_SCREENSHOT)
    finally:
        stop_traffic.set()
        if pinger is not None:
            pinger.join(REPLY_TIMEOUT)
        dash.stop()
        pm.stop().get(timeout=REPLY_TIMEOUT)
