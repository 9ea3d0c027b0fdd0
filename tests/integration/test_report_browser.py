"""The HTML report opens in headless Chromium, offline, without console errors, and renders its plots.

Needs Debian's chromium (``apt-get install chromium``, which ``.ci/run`` does); skipped without it,
except in CI (``CI`` set), where its absence fails the module. Chromium logs every
console message of the page to stderr as ``INFO:CONSOLE...`` (uncaught exceptions as
``"Uncaught ..."``); the report's scripts log nothing, so any such line is a failure.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest
from synthetic_sweep import write_synthetic_sweep

from inactive_heads.reporting.report import write_report

CHROMIUM = Path("/usr/bin/chromium")
FIGURES = ("fig-curves", "fig-agreement", "fig-ranking", "fig-by-layer", "fig-heatmap", "fig-flag-rate", "fig-distribution",
           "fig-layer-profiles", "fig-iou")

if not CHROMIUM.exists():
    if os.environ.get("CI"):  # .ci/run installs it: its absence there is a broken CI, not a skip
        pytest.fail(f"{CHROMIUM} is missing in CI; .ci/run should have run 'apt-get install chromium'",
                    pytrace=False)
    pytestmark = pytest.mark.skip(reason=f"{CHROMIUM} not installed (apt-get install chromium)")


def chromium(profile: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """Headless Chromium with no network side traffic and a throwaway profile."""
    command = [
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def page_messages(stderr: str) -> list[str]:
    """Console output of the page and uncaught exceptions (Chromium's own dbus/GPU noise aside)."""
    return [line for line in stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("browser")
    sweep = write_synthetic_sweep(root / "sweep", n_layers=8, n_heads=6)
    return write_report(sweep)


def test_report_renders_without_console_errors(report, tmp_path):
    run = chromium(
        tmp_path / "profile", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", "--dump-dom",
        report.as_uri(),
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert page_messages(run.stderr) == []
    dom = run.stdout
    assert 'class="main-svg"' in dom
    # every figure div got its own rendered SVG
    starts = {name: dom.index(f'id="{name}"') for name in FIGURES}
    bounds = sorted(starts.values()) + [len(dom)]
    for name, start in starts.items():
        segment = dom[start : bounds[bounds.index(start) + 1]]
        assert 'class="main-svg"' in segment, f"{name} did not render"
    # the accuracy curves drew one line per score function
    curves = dom[starts["fig-curves"] : bounds[bounds.index(starts["fig-curves"]) + 1]]
    assert len(re.findall(r'class="trace scatter ', curves)) == 4


def test_page_messages_catch_console_errors(tmp_path):
    """The check above would see a broken page: a thrown error reaches stderr as 'Uncaught'."""
    page = tmp_path / "broken.html"
    page.write_text('<html><body><script>throw new Error("boom")</script></body></html>')
    run = chromium(tmp_path / "profile", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=1000",
                   "--dump-dom", page.as_uri())
    assert any("Uncaught Error: boom" in line for line in page_messages(run.stderr))


def test_report_screenshot(report, tmp_path):
    shot = tmp_path / "report.png"
    run = chromium(tmp_path / "profile", "--hide-scrollbars", "--virtual-time-budget=5000",
                   "--window-size=1400,2400", f"--screenshot={shot}", report.as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000  # a blank page is a few KB
