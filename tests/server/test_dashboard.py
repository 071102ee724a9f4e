"""The dashboard in a real browser (Debian's headless Chromium, driven by Playwright) against a real server.

A run preempted once and resumed is opened: its curve is drawn across both attempts with the restart
marker, a point is hovered, the explain view is read, and screenshots are kept in test-artifacts/.
Every request the page makes is watched: none may leave this server (no CDN, works offline).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from api_server import CHATTY, TEST_TOKEN, Api, serving
from waiting import wait_for

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("TRACKWAY_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-default-apps"]


@pytest.fixture(scope="module")
def browser():
    """One Chromium for the module's tests (a launch costs seconds); each test opens its own pages."""
    if not Path(CHROMIUM).exists() or shutil.which("chromium") is None:
        pytest.skip("chromium is not installed (bash scripts/ensure-chromium.sh installs Debian's)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def new_page(browser):
    """`new_page(**options)`: a page at 1280x900 in a context of its own, closed when the test ends."""
    contexts = []

    def make(**options):
        contexts.append(browser.new_context(viewport={"width": 1280, "height": 900}, **options))
        return contexts[-1].new_page()

    yield make
    for context in contexts:
        context.close()


def test_a_resumed_run_reads_as_one_curve_with_its_restart_marked_and_explained(home, sqlite_url, new_page):
    environ = {**os.environ, "TRACKWAY_HOME": str(home), "TRACKWAY_DB": sqlite_url}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with serving(home, sqlite_url) as (base, _):
        api = Api(base)
        job = api.post("/api/jobs", {"script": CHATTY, "name": "resumed-once"})[1]

        def completed() -> bool:
            if api.get(f"/api/jobs/{job['id']}")[1]["status"] == "completed":
                return True
            subprocess.run([sys.executable, "-m", "trackway", "supervise", "--once"], env=environ,
                           capture_output=True, timeout=120)
            return False

        wait_for(completed, "the job to complete", timeout=90)

        # Under the server's Content-Security-Policy (no inline script, no eval, no framing) the dashboard draws
        # the run's page, and the browser reports no violation.
        strict = new_page()
        said: list[str] = []
        strict.on("console", lambda message: said.append(message.text))
        strict.goto(base + f"/#/runs/{job['id']}?token={TEST_TOKEN}")
        strict.wait_for_selector("#markers:has-text('attempt 2 starts at step 8')")
        assert not [text for text in said if "Content Security Policy" in text], said
        strict.close()

        # Playwright's own waits evaluate strings, which that policy forbids: the rest bypasses it.
        page = new_page(bypass_csp=True)
        outside: list[str] = []
        page.on("request", lambda request: None if request.url.startswith(base) else outside.append(request.url))

        # The token once, in the address's fragment (never sent to the server): kept for this tab.
        page.goto(base + f"/#/runs?token={TEST_TOKEN}")
        assert "token=" not in page.url
        page.wait_for_selector(f"a[href='#/runs/{job['id']}']")
        assert "loss" in page.inner_text("table")  # the last metric beside the state
        # The list updates live: a job submitted now appears without a reload (the event stream says so).
        other = api.post("/api/jobs", {"script": CHATTY, "name": "appears-live"})[1]
        page.wait_for_selector(f"a[href='#/runs/{other['id']}']", timeout=15_000)
        page.screenshot(path=str(ARTIFACTS / "runs.png"), full_page=True)

        page.goto(f"{base}/#/runs/{job['id']}")
        page.wait_for_function("document.body.dataset.chart === 'drawn'")
        assert page.inner_text("#markers") == "attempt 2 starts at step 8 after preempted, resumed from step-00000007"
        # Both attempts' points are on the one curve, and the dashed restart line is drawn on the canvas.
        drawn = page.evaluate("""() => {
            const canvas = document.querySelector('#chart canvas');
            const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
            let marker = 0, curve = 0;
            for (let i = 0; i < pixels.length; i += 4) {
                const [r, g, b, a] = [pixels[i], pixels[i + 1], pixels[i + 2], pixels[i + 3]];
                if (a > 200 && r > 150 && g < 80 && b < 80) marker++;
                if (a > 200 && b > 150 && r < 100) curve++;
            }
            return {marker, curve};
        }""")
        assert drawn["marker"] > 50 and drawn["curve"] > 50, drawn

        over = page.locator("#chart .u-over")
        box = over.bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.75, box["y"] + box["height"] / 2)
        value = page.locator("#chart .u-legend .u-series").nth(1).locator(".u-value").inner_text()
        assert value not in ("", "--") and float(value) > 0, value
        # Wheel zooms around the cursor, shift+wheel pans, a double-click shows every step again.
        def visible() -> tuple[int, int]:
            low, high = page.get_attribute("#chart", "data-steps").split("..")
            return int(low), int(high)

        assert visible() == (0, 11)
        page.mouse.wheel(0, -300)
        zoomed = visible()
        assert zoomed[1] - zoomed[0] < 11
        page.keyboard.down("Shift")
        page.mouse.wheel(0, 300)
        page.keyboard.up("Shift")
        panned = visible()
        assert panned[0] > zoomed[0] and abs((panned[1] - panned[0]) - (zoomed[1] - zoomed[0])) <= 1  # moved, same width
        page.mouse.dblclick(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_function("document.querySelector('#chart').dataset.steps === '0..11'")
        page.screenshot(path=str(ARTIFACTS / "run-curve.png"), full_page=True)

        page.click("button[data-tab='explain']")
        page.wait_for_selector("#explain")
        assert "Ended: completed" in page.inner_text("#explain")
        page.select_option("#explain >> xpath=.. >> select", "1")
        page.wait_for_function("document.querySelector('#explain').innerText.includes('preempted')")
        assert "Resumed from: the start" in page.inner_text("#explain")
        page.screenshot(path=str(ARTIFACTS / "run-explain.png"), full_page=True)

        page.click("button[data-tab='checkpoints']")
        page.wait_for_selector("text=step-00000007")

        # Times in the viewer's zone to the second, the exact value on hover; signals by name; no markup leaking.
        page.click("button[data-tab='attempts']")
        page.wait_for_selector("time.when")
        stamps = page.eval_on_selector_all("time.when", "nodes => nodes.map(n => [n.textContent, n.title])")
        assert stamps and all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", text) and "T" in title
                              for text, title in stamps), stamps
        seen = page.inner_text("main")
        assert "signal 15" not in seen and "starts at step -" not in seen and "`" not in seen, seen
        page.click("button[data-tab='config']")
        page.wait_for_selector("#config-diff")
        assert f"Against {job['id']}/1" in page.inner_text("#config-diff")
        page.screenshot(path=str(ARTIFACTS / "run-config.png"), full_page=True)

        # The list narrows by search, and two runs picked are drawn over each other, one series each.
        page.goto(f"{base}/#/runs?search=appears")
        page.wait_for_selector(f"a[href='#/runs/{other['id']}']")
        assert page.locator(f"a[href='#/runs/{job['id']}']").count() == 0
        wait_for(lambda: api.get(f"/api/jobs/{other['id']}")[1]["status"] in ("completed", "failed")
                 or subprocess.run([sys.executable, "-m", "trackway", "supervise", "--once"], env=environ,
                                   capture_output=True, timeout=120) and False, "the second job to end", timeout=90)
        page.evaluate("delete document.body.dataset.chart")  # the flag is the compare page's, not an earlier one's
        page.goto(f"{base}/#/compare/{job['id']},{other['id']}")
        page.wait_for_function("document.body.dataset.chart === 'drawn'")
        assert page.get_attribute("#chart", "data-series") == "2"
        assert "Final metrics" in page.inner_text("main")
        page.screenshot(path=str(ARTIFACTS / "compare.png"), full_page=True)

        for route in ("#/waste", "#/resources", "#/experiments", f"#/runs/{job['id']}", "#/runs",
                      f"#/compare/{job['id']},{other['id']}"):
            page.goto(base + "/" + route)
            page.wait_for_selector("h1")
            assert not page.locator(".error").count(), page.inner_text("main")
            # Laid out for 1280 px: nothing makes the page scroll sideways.
            assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth"), route
        assert outside == [], f"the dashboard asked beyond this server: {outside}"


def test_a_run_with_two_ranks_offers_a_rank_selector_that_draws_that_ranks_values(home, sqlite_url, new_page):
    from datetime import datetime, timezone

    from trackway.ledger import open_ledger
    from trackway.ledger.records import insert_run
    from trackway.ledger.schema import metric_points, metric_series

    ledger = open_ledger(sqlite_url)
    with ledger.write() as conn:
        for run_id, ranks in (("rtwo", (0, 1)), ("rone", (0,))):
            insert_run(conn, dict(run_id=run_id, name=run_id, project="p", kind="full", state="completed",
                                  command="[]", workdir="/w", resource="local", executor="local", gpus=0,
                                  created_at=datetime.now(timezone.utc)))
            for rank in ranks:
                series = conn.execute(metric_series.insert().values(run_id=run_id, key="loss", rank=rank)
                                      ).inserted_primary_key[0]
                conn.execute(metric_points.insert(), [dict(series_id=series, step=s, value=1.0 + 4.0 * rank,
                                                           attempt_number=1, logged_at=1.0) for s in range(10)])
    ledger.dispose()
    with serving(home, sqlite_url) as (base, _):
        page = new_page(bypass_csp=True)

        def hovered() -> str:
            box = page.locator("#chart .u-over").bounding_box()
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            return page.locator("#chart .u-legend .u-series").nth(1).locator(".u-value").inner_text()

        page.goto(base + f"/#/runs/rtwo?token={TEST_TOKEN}")
        page.wait_for_function("document.body.dataset.chart === 'drawn'")
        assert page.locator("#rank option").all_inner_texts() == ["rank 0", "rank 1"]
        assert float(hovered()) == 1.0  # rank 0's, by default
        page.evaluate("delete document.body.dataset.chart")
        page.select_option("#rank", "1")
        page.wait_for_function("document.body.dataset.chart === 'drawn'")
        assert float(hovered()) == 5.0
        page.screenshot(path=str(ARTIFACTS / "run-ranks.png"), full_page=True)

        page.goto(f"{base}/#/runs/rone")
        page.wait_for_function("document.body.dataset.chart === 'drawn'")
        assert page.locator("#rank").count() == 0  # one rank: nothing to choose


# The page's own scripts, reached from the test: `listeners` (the current page's event listeners) is app.js's, and
# fetch is wrapped so that the runs list's requests can be held until the test lets them answer.
HOLD_RUNS_LIST = """() => {
  window.heldJobs = [];
  window.jobsAsked = 0;
  window.jobsAnswered = 0;
  const real = window.fetch;
  window.fetch = (url, options) => {
    if (!String(url).startsWith("/api/jobs?")) return real(url, options);
    window.jobsAsked += 1;
    if (!window.holding) return real(url, options).then((answer) => { window.jobsAnswered += 1; return answer; });
    return new Promise((resolve) => { window.heldJobs.push(() => resolve(real(url, options))); });
  };
}"""
EVENT = "() => [...listeners].forEach((heard) => heard('attempt_ended', {attempt_id: 'x/1'}))"


def test_a_refresh_the_reader_left_behind_neither_replaces_the_page_they_went_to_nor_multiplies(home, sqlite_url, new_page):
    from datetime import datetime, timezone

    from trackway.ledger import open_ledger
    from trackway.ledger.records import insert_run
    from trackway.ledger.schema import metric_points, metric_series

    ledger = open_ledger(sqlite_url)
    with ledger.write() as conn:
        for run_id in ("rfirst", "rsecond"):
            insert_run(conn, dict(run_id=run_id, name=run_id, project="p", kind="full", state="completed",
                                  command="[]", workdir="/w", resource="local", executor="local", gpus=0,
                                  created_at=datetime.now(timezone.utc)))
            series = conn.execute(metric_series.insert().values(run_id=run_id, key="loss", rank=0)).inserted_primary_key[0]
            conn.execute(metric_points.insert(), [dict(series_id=series, step=s, value=1.0 / (s + 1),
                                                       attempt_number=1, logged_at=1.0) for s in range(10)])
    ledger.dispose()
    with serving(home, sqlite_url) as (base, _):
        page = new_page(bypass_csp=True)
        page.goto(base + f"/#/runs?token={TEST_TOKEN}")
        page.wait_for_selector("a[href='#/runs/rsecond']")
        page.evaluate(HOLD_RUNS_LIST)

        # A busy runs list: every burst of events refreshes it once, however many bursts came before.
        for burst in range(1, 5):
            page.evaluate(EVENT)
            # The server's answer came (on a loaded machine it may take a while) and the page is listening again.
            page.wait_for_function(f"window.jobsAnswered === {burst} && listeners.size > 0")
            page.wait_for_timeout(100)  # a refresh that registered a second listener would have done so by now
            assert page.evaluate("listeners.size") == 1, f"after burst {burst}"
        page.evaluate(EVENT)
        page.wait_for_function("window.jobsAsked === 5")
        page.wait_for_timeout(500)  # longer than the 300 ms a burst waits: a doubled refresh would have asked again
        assert page.evaluate("window.jobsAsked") == 5

        # The reader picks the two runs to compare while a refresh of the list is still waiting on the server: when
        # its answer comes, the comparison stays.
        page.evaluate("window.holding = true")
        page.evaluate(EVENT)
        page.wait_for_function("window.heldJobs.length === 1")
        page.evaluate("delete document.body.dataset.chart")
        page.goto(f"{base}/#/compare/rfirst,rsecond")
        page.wait_for_function("document.body.dataset.chart === 'drawn'")
        page.evaluate("window.heldJobs.forEach((answer) => answer())")
        page.wait_for_timeout(500)  # the held answer arrives and is read
        assert page.inner_text("h1") == "Compare rfirst · rsecond"
        assert page.get_attribute("#chart", "data-series") == "2"
