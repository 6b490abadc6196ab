"""report.html in a real browser: headless Chromium renders it completely and makes no network request.

Needs Debian's chromium (`apt-get install -y chromium`); skips with that reason where it is absent.
No request is proven from Chromium's own NetLog: every request the page starts carries the page's
origin as its initiator (Chromium's background services carry none), and a control page with a
remote image shows the check catches one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.test_report_render import crafted_report
from triage.report import write_report

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason="headless Chromium not installed (apt-get install -y chromium)")


def render(page: Path, tmp_path: Path, height: int = 2400) -> tuple[Path, list[str]]:
    """Screenshot `page`; return the PNG and the URLs of requests the page itself started."""
    png, netlog = tmp_path / f"{page.stem}.png", tmp_path / f"{page.stem}.netlog.json"
    subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
         f"--user-data-dir={tmp_path / 'profile'}", f"--log-net-log={netlog}",
         "--host-resolver-rules=MAP * ~NOTFOUND",  # even a request that slipped out resolves nowhere
         f"--screenshot={png}", f"--window-size=1200,{height}", page.resolve().as_uri()],
        check=True, capture_output=True, timeout=120)
    return png, page_requests(netlog)


def page_requests(netlog: Path) -> list[str]:
    log = json.loads(netlog.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [e["params"]["url"] for e in log["events"]
            if e["type"] == start and "url" in e.get("params", {})
            and e["params"].get("initiator") != "not an origin"]


def test_netlog_check_catches_a_page_request(tmp_path):
    control = tmp_path / "control.html"
    control.write_text('<!doctype html><p>hi</p><img src="https://example.com/pixel.png">')
    _, requests = render(control, tmp_path, height=300)
    assert requests == ["https://example.com/pixel.png"]


def test_report_renders_in_chromium_without_network(tmp_path):
    from PIL import Image

    files = write_report(crafted_report(name="n", text="<script>alert(1)</script>"), tmp_path / "report")
    png, requests = render(files["html"], tmp_path)
    assert requests == []
    image = Image.open(png).convert("L")
    assert image.size == (1200, 2400)
    # Rendered, not blank: the page's top holds dark text (the verdict) on light ground.
    top = image.crop((0, 0, 1200, 400))
    low, high = top.getextrema()
    assert low < 60 and high > 230
    if os.environ.get("TRIAGE_SCREENSHOTS"):  # CI keeps the picture as an artifact
        Path(os.environ["TRIAGE_SCREENSHOTS"]).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(os.environ["TRIAGE_SCREENSHOTS"]) / "report.png")
