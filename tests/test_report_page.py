"""The experiment page of a real local sweep, opened in a real headless browser (Debian's chromium over the
DevTools protocol): the trial table sorted and filtered by clicks, every trial's row and link, a trial cancelled
with jobs cancel --point; the page of one job; the tensorboard command of a sweep."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdl.lifecycle.job import Job
from hpcdl.store.files import SUMMARY_CSV
from tests.browser import CHROMIUM, Browser
from tests.conftest import keep_screenshot

pytestmark = pytest.mark.skipif(CHROMIUM is None and not os.environ.get("HPCDL_REQUIRE_SLURM"),
                                reason="chromium is not installed (tests/run-all.sh installs it, and fails here "
                                       "without it)")


def _jobs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcdl.jobs", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def sweep(store: Path) -> str:
    """3 points of 2 epochs of the digits example, 2 at a time; the third cancelled before it runs."""
    done = subprocess.run([sys.executable, "-m", "hpcdl.submit", "-m", "training.max_epochs=2",
                           "training.initial_learn_rate=0.01,0.003,0.001", "hydra.launcher.parallelism=2"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    sweep_id = re.search(r"Submitted sweep (\S+):", done.stdout).group(1)
    missing = _jobs("cancel", sweep_id, "--point", "3")
    assert missing.returncode == 1 and "has 3 point(s), numbered 0 to 2: there is no point 3" in missing.stderr
    cancelled = _jobs("cancel", sweep_id, "--point", "2")
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"cancelled point 2 ({sweep_id}_2) of sweep {sweep_id}; state now CANCELLED" in cancelled.stdout
    Job.attach(sweep_id).wait(timeout=280)
    assert [Job.attach(f"{sweep_id}_{n}").state for n in range(3)] == ["COMPLETED", "COMPLETED", "CANCELLED"]
    return sweep_id


def _column(browser: Browser, index: int) -> list[str]:
    return browser.evaluate(f"Array.prototype.map.call(document.querySelectorAll('#trials tbody tr'),"
                            f"function(r){{return r.cells[{index}].textContent}})")


def _visible_rows(browser: Browser) -> list[str]:
    return browser.evaluate("Array.prototype.map.call(document.querySelectorAll('#trials tbody tr:not(.hidden)'),"
                            "function(r){return r.cells[0].textContent})")


def test_the_sweep_page_sorts_and_filters_by_clicks_and_links_every_trial(sweep: str, tmp_path: Path) -> None:
    page = tmp_path / "sweep.html"
    made = _jobs("report", sweep, "--to", str(page))
    assert made.returncode == 0, made.stderr
    text = page.read_text()
    assert len(text.encode()) < 3_000_000
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)  # nothing fetched from anywhere
    browser = Browser(tmp_path / "profile")
    try:
        browser.open(page)
        nums = _column(browser, 0)
        assert nums == ["0", "1", "2"]
        assert _column(browser, 2) == ["COMPLETED", "COMPLETED", "CANCELLED"]
        assert _column(browser, 1) == [f"training.initial_learn_rate={r}" for r in ("0.01", "0.003", "0.001")]
        for num in nums:  # every row links to its trial, which has its curves and confusion matrix
            target = browser.evaluate(f"document.querySelector('#row-{num} a').getAttribute('href')")
            assert target == f"#trial-{num}"
            assert browser.evaluate(f"document.querySelector('{target}') !== null")
        for num in ("0", "1"):
            assert browser.evaluate(f"document.querySelectorAll('#trial-{num} svg polyline').length") == 4
            assert browser.evaluate(f"document.querySelectorAll('#trial-{num} table.confusion tr').length") == 11
        assert "no curves recorded" in browser.evaluate("document.querySelector('#trial-2').textContent")
        losses = [float(v) for v in _column(browser, 6)[:2]]
        headers = browser.evaluate("Array.prototype.map.call(document.querySelectorAll('#trials th'),"
                                   "function(h){return h.textContent})")
        loss_column = headers.index("final loss")
        browser.click("#trials th", loss_column)
        ascending = _column(browser, 0)
        assert ascending[:2] == (["0", "1"] if losses[0] < losses[1] else ["1", "0"]) and ascending[2] == "2"
        browser.click("#trials th", loss_column)
        assert _column(browser, 0)[:2] == ascending[:2][::-1]  # the second click turns the order round
        browser.click("#trials th", 0)
        assert _column(browser, 0) == ["0", "1", "2"]
        browser.click("#filters button.CANCELLED")
        assert _visible_rows(browser) == ["2"]
        browser.screenshot(tmp_path / "sweep-filtered.png")
        browser.click("#filters button.CANCELLED")
        assert _visible_rows(browser) == ["0", "1", "2"]
        best = browser.evaluate("document.querySelector('tr.best').cells[0].textContent")
        accuracies = [float(v.rstrip("%")) for v in _column(browser, 9)[:2]]
        assert best == str(accuracies.index(max(accuracies)))
        assert "training.initial_learn_rate=0.01,0.003,0.001" in browser.evaluate("document.querySelector('pre')"
                                                                                   ".textContent")
        shot = browser.screenshot(tmp_path / "sweep.png")
    finally:
        browser.close()
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    keep_screenshot(shot, "sweep-page.png")

    command = _jobs("tensorboard", sweep)
    assert command.returncode == 0, command.stderr
    assert re.search(rf"^tensorboard --logdir_spec '?0_training.initial_learn_rate=0.01:\S+/{sweep}_0/tensorboard,"
                     rf"1_\S+,2_\S+'? --port 6006$", command.stdout, re.M), command.stdout
    assert re.search(r"^ssh -N -L 6006:localhost:6006 \S+@\S+$", command.stdout, re.M)


def test_a_jobs_page_shows_its_progress_plot_logs_and_confusion(sweep: str, tmp_path: Path) -> None:
    page = tmp_path / "job.html"
    made = _jobs("report", f"{sweep}_0", "--to", str(page))
    assert made.returncode == 0, made.stderr
    browser = Browser(tmp_path / "profile")
    try:
        browser.open(page)
        size = browser.evaluate("(function(){var i=document.querySelector('img');"
                                "return [i.naturalWidth, i.naturalHeight]})()")
        assert size[0] > 600 and size[1] > 300  # the inline PNG decoded
        assert browser.evaluate("document.querySelector('#error')") is None
        assert "rank 0: last lines" in browser.evaluate("document.body.textContent")
        assert "Training finished: max-epochs" in browser.evaluate("document.querySelector('pre').textContent")
        assert browser.evaluate("document.querySelectorAll('table.confusion tr').length") == 11
        browser.screenshot(tmp_path / "job.png")
    finally:
        browser.close()


def test_a_failed_jobs_page_shows_its_first_error_and_its_reports(store: Path, tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("import hpcdl\nfor step in range(1, 4):\n"
                                     "    hpcdl.report(step=step, total=10, loss=1.0 / step, reward=step * 2.0)\n"
                                     "raise ValueError('the reward ran out')\n")
    done = subprocess.run([sys.executable, "-m", "hpcdl.submit", "script=bad.py", "wait=true"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode != 0
    page = tmp_path / "failed.html"
    assert _jobs("report", "last", "--to", str(page)).returncode == 0
    browser = Browser(tmp_path / "profile")
    try:
        browser.open(page)
        assert "ValueError: the reward ran out" in browser.evaluate("document.querySelector('#error').textContent")
        assert browser.evaluate("document.querySelector('img').naturalHeight") > 300  # loss and reward panels
        assert "FAILED" in browser.evaluate("document.querySelector('table').textContent")
    finally:
        browser.close()


def test_a_sweep_of_your_own_code_shows_the_metrics_it_reported_by_name_and_picks_the_best_by_one(
        store: Path, tmp_path: Path) -> None:
    (tmp_path / "reward.py").write_text("import os, hpcdl\nscale = float(os.environ['SCALE'])\n"
                                        "for step in range(1, 4):\n"
                                        "    hpcdl.report(step=step, total=3, loss=1.0 / step, reward=step * scale)\n")
    done = subprocess.run([sys.executable, "-m", "hpcdl.submit", "-m", "script=reward.py", "+cluster.env.SCALE=1,3,2",
                           "wait=true"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^1\s+\+cluster.env.SCALE=3\s+COMPLETED\s.*\s9$", done.stdout, re.M), done.stdout  # REWARD
    sweep_id = re.search(r"Submitted sweep (\S+):", done.stdout).group(1)
    page = tmp_path / "sweep.html"
    assert _jobs("report", sweep_id, "--to", str(page), "--metric", "reward").returncode == 0
    browser = Browser(tmp_path / "profile")
    try:
        browser.open(page)
        headers = browser.evaluate("Array.prototype.map.call(document.querySelectorAll('#trials th'),"
                                   "function(h){return h.textContent})")
        assert "reward" in headers, headers
        assert _column(browser, headers.index("reward")) == ["3", "9", "6"]
        assert browser.evaluate("document.querySelector('tr.best').cells[0].textContent") == "1"
        assert "best by reward" in browser.evaluate("document.body.textContent")
    finally:
        browser.close()
    csv_dir = tmp_path / "fetched"
    assert _jobs("fetch", sweep_id, "--to", str(csv_dir)).returncode == 0
    assert (csv_dir / SUMMARY_CSV).read_text().splitlines()[0].endswith(",reason,metric:reward")
