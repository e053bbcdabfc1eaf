"""One tab of headless Chromium kept open through a real live run: a real ``ranksight dashboard`` server started
on an empty folder, then a real 2-rank job writing a run into it. Without a reload, the tab picks the run up,
its clock, verdict and Runs table advance, and at the end every part of the page says the run finished.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from tests.test_dashboard_browser import CHROMIUM, CHROMIUM_ARGS, _free_port, wait_healthy

pytestmark = pytest.mark.slow

STEPS = 1200  # ~50 s on a quiet 2-core machine: the run outlasts the pages it is watched from (400 ended first)
CLOCK = re.compile(r"(● live|finished) · step (\d+) of the run, as of (\d\d:\d\d:\d\d) \((\d+) s ago\)")


def _clock(page) -> tuple[str, int]:
    """(status, step) from the page's clock line in the main area."""
    text = page.locator("[data-testid='stMain']").first.inner_text()
    found = CLOCK.search(text)
    assert found, text[:500]
    return found.group(1), int(found.group(2))


def _wait_clock(page, ok, timeout_s: float = 90.0) -> tuple[str, int]:
    deadline = time.time() + timeout_s
    while True:
        text = page.locator("[data-testid='stMain']").first.inner_text()
        found = CLOCK.search(text)
        if found and ok(found.group(1), int(found.group(2))):
            return found.group(1), int(found.group(2))
        assert time.time() < deadline, text[:800]
        time.sleep(0.25)


def test_one_tab_follows_a_live_run_from_before_its_first_step_to_its_end(tmp_path):
    pytest.importorskip("torch")
    from playwright.sync_api import sync_playwright

    from ranksight.commands.dashboard import start, stop

    root = str(tmp_path / "runs")
    os.makedirs(root)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = start(root, port=port, refresh_s=1.0, quiet=True)
    job = None
    try:
        wait_healthy(server, base)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS))
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(base)
            page.get_by_text("no runs yet").first.wait_for(timeout=60000)
            page.evaluate("window.__sameDocument = true")  # a reload would drop it
            job = subprocess.Popen(
                [sys.executable, "-m", "ranksight", "demo", "--no-dashboard", "--fault", "none"]
                + ["--steps", str(STEPS), "--run-dir", root, "--run-id", "watched"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            # The tab opened before the run shows it once it has steps, the clock in the page and the sidebar.
            _, first = _wait_clock(page, lambda status, step: status == "● live" and step > 0)
            sidebar = page.locator("[data-testid='stSidebar']").first
            assert "watched" in sidebar.inner_text()
            # The verdict advances: provisional while it rests on few steps, then settled, with no reload.
            main = page.locator("[data-testid='stMain']").first
            seen_provisional = None
            deadline = time.time() + 120
            while True:
                status, step = _clock(page)
                text = main.inner_text()
                note = re.search(r"provisional: rests on (\d+) steps? after warm-up", text)
                if note:
                    seen_provisional = int(note.group(1))
                elif "Where step time goes" in text and step >= 60:
                    break
                assert time.time() < deadline and status == "● live", text[:800]
                time.sleep(0.25)
            # The clock moved on without a reload (at the refresh the server's CPU budget allows under load).
            _, later = _wait_clock(page, lambda status, step: step > first)
            if seen_provisional is not None:  # a job slower than one flush per 50 steps shows it; say what it said
                assert 0 <= seen_provisional < 50
            # The Runs page, reached in the same tab: its table follows the clock as the run goes on.
            page.get_by_role("link", name="Runs").first.click()
            page.get_by_role("heading", name="Runs").wait_for(timeout=30000)
            deadline = time.time() + 60
            while True:  # the table's steps are the clock's (both from one refresh), and they move on
                status, step = _clock(page)
                row = page.get_by_role("row").filter(has_text="watched").first
                row.wait_for(timeout=30000)
                if status == "● live" and step > later and row.get_by_role("cell").nth(4).inner_text() == str(step):
                    break
                assert time.time() < deadline and status == "● live", (status, step, row.inner_text())
                time.sleep(0.25)
            # The end of the run: the clock, the table, the picker and the sidebar all say it finished.
            assert job.wait(timeout=300) == 0, job.stderr.read().decode()[-2000:]
            _wait_clock(page, lambda status, step: status == "finished" and step == STEPS, timeout_s=60)
            row = page.get_by_role("row").filter(has_text="watched").first
            assert row.get_by_role("cell").nth(0).inner_text() == "finished"
            assert row.get_by_role("cell").nth(4).inner_text() == str(STEPS)
            picker = sidebar.get_by_role("combobox", name="Run").input_value()
            assert "finished ·" in picker and "● live" not in sidebar.inner_text(), sidebar.inner_text()
            assert page.evaluate("window.__sameDocument === true")  # all of it without a reload
            browser.close()
    finally:
        if job is not None and job.poll() is None:
            job.kill()
            job.wait()
        stop(server)
