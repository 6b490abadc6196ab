"""report.html in a real browser: headless Chromium renders it completely and makes no network request.

Needs Debian's chromium (`apt-get install -y chromium`); skips with that reason where it is absent.
No request is proven from Chromium's own NetLog: every request the page starts carries the page's
origin as its initiator (Chromium's background services carry none), and a control page with a
remote image shows the check catches one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.report.test_report_render import crafted_report
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


# --- what a reader sees: no clipped text, no field name, the verdict's look per kind ----------------

# Run in a copy of the page (the page itself forbids scripts): measures what Chromium laid out and
# writes it into the DOM, which --dump-dom prints.
PROBE = """<script>
window.addEventListener('load', () => {
  const out = {clipped: [], text: '', kind: '', fix: ''};
  for (const svg of document.querySelectorAll('figure.plot svg')) {
    const box = svg.getBoundingClientRect();
    if (box.width === 0) continue;
    for (const t of svg.querySelectorAll('text')) {
      const r = t.getBoundingClientRect();
      if (r.width === 0) continue;
      if (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 || r.bottom > box.bottom + 1)
        out.clipped.push('figure text: ' + t.textContent);
    }
  }
  for (const el of document.querySelectorAll('main *')) {
    const style = getComputedStyle(el);
    if (el.closest('pre, .flow-wrap, svg') || style.display === 'none' || el.offsetParent === null) continue;
    if (style.overflowX !== 'visible' && el.scrollWidth > el.clientWidth + 1)
      out.clipped.push('text: ' + el.tagName + ' ' + el.textContent.slice(0, 80));
  }
  out.text = document.querySelector('main').innerText;
  // the flowchart, unfolded: each node's and label's text inside its own box
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  for (const g of document.querySelectorAll('svg.flowchart:not(.focus) g.fc-node, svg.flowchart:not(.focus) g.fc-label')) {
    const box = g.querySelector('rect').getBBox();
    for (const t of g.querySelectorAll('text:not(.fc-step-n)')) {
      const r = t.getBBox();
      if (r.x < box.x - 1 || r.x + r.width > box.x + box.width + 1 || r.y + r.height > box.y + box.height + 2)
        out.clipped.push('flowchart: ' + t.textContent);
    }
  }
  out.kind = document.getElementById('verdict').dataset.kind;
  out.fix = getComputedStyle(document.querySelector('#verdict .fix')).backgroundColor;
  const pre = document.createElement('pre'); pre.id = 'probe-result'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def laid_out(page: Path, tmp_path: Path) -> dict:
    """What Chromium shows of `page` at 1200 px: text cut off by its box, the visible text (closed
    <details> hide theirs), the verdict's kind and the fix box's colour."""
    import html as html_lib
    import re

    probe = tmp_path / f"{page.parent.name}-probe.html"
    text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page.read_text())
    probe.write_text(text.replace("</body>", PROBE + "</body>"))
    done = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
         f"--user-data-dir={tmp_path / 'profile-probe'}", "--host-resolver-rules=MAP * ~NOTFOUND",
         "--window-size=1200,2400", "--virtual-time-budget=10000", "--dump-dom", probe.resolve().as_uri()],
        check=True, capture_output=True, timeout=120, text=True)
    found = re.search(r'<pre id="probe-result">(.*?)</pre>', done.stdout, re.S)
    assert found, done.stdout[-2000:]
    return json.loads(html_lib.unescape(found.group(1)))


@pytest.fixture(scope="module")
def verified_fix(tmp_path_factory):
    """A real triage of the zoo's lr_too_high: a fix verified by a replay."""
    from typer.testing import CliRunner

    from triage.cli.commands import app
    from triage.cli.zoo import example_path, load_example

    folder = tmp_path_factory.mktemp("lr_too_high")
    checkpoint = load_example("lr_too_high").write_checkpoint(folder / "ckpt.pt")
    result = CliRunner().invoke(app, ["run", "--checkpoint", str(checkpoint), "--entry",
                                      f"{example_path('lr_too_high')}:setup", "--out", str(folder / "out"),
                                      "--output", "quiet"])
    assert result.exit_code == 0, result.output
    return folder / "out"


def test_no_text_is_clipped_and_no_field_name_is_shown(verified_fix, tmp_path):
    from triage.report import read_report
    from triage.report.labels import LABELS

    report = read_report(verified_fix / "report.json")
    seen = laid_out(verified_fix / "report.html", tmp_path)
    assert seen["clipped"] == []
    # Identifiers a person may need (node ids, experiment names, cause ids) are shown as such; figures
    # are named in words (report/labels.py).
    ids = {e.node for e in report.experiments} | {e.experiment for e in report.experiments} | \
        {n.id for n in report.flowchart.nodes} | {n.label for n in report.flowchart.nodes}
    fields = {f for f in LABELS if "_" in f} - ids
    shown = sorted(f for f in fields if re.search(rf"\b{f}\b", seen["text"]))
    assert shown == []
    # the fix in values, visible in the verdict
    assert "learning rate" in seen["text"] and "with the fix" in seen["text"]


@pytest.mark.parametrize("kind", ["verified", "likely", "unexplained", "inconclusive"])
def test_the_verdict_looks_like_its_kind(kind, tmp_path):
    report = crafted_report(name="n")
    update = {"verified": {}, "likely": {"confidence": "medium"},
              "unexplained": {"root_cause": "unexplained", "confidence": "low", "title": "Unexplained"},
              "inconclusive": {"root_cause": "inconclusive", "confidence": "low", "title": "Cut short"}}[kind]
    files = write_report(report.model_copy(update=update), tmp_path / kind)
    seen = laid_out(files["html"], tmp_path)
    assert seen["kind"] == kind
    green = "rgb(236, 253, 245)"  # --good-wash: the colour of a fix that worked
    assert (seen["fix"] == green) == (kind == "verified")
    first_line = seen["text"].split("\n", 3)[1:3]
    if kind == "unexplained":
        assert "cause not found" in " ".join(first_line).lower()
    if kind == "inconclusive":
        assert "no verdict" in " ".join(first_line).lower()


def test_a_bad_batch_is_shown_at_the_run_s_step_with_its_tensor_and_nothing_clipped(tmp_path):
    """The zoo's bad_batch: the where line and the replay plots speak the run's steps; the longer axis
    label fits its figure."""
    from tests.zoo.test_e2e_zoo import triage_example

    _, report, files = triage_example("bad_batch", tmp_path)
    place = report.location.batch_place
    seen = laid_out(files["html"], tmp_path)
    assert seen["clipped"] == []
    assert f"step {place.step} the run's training step of snapshot batch {place.batch}" in seen["text"]
    assert f"tensor {place.tensor} holds" in seen["text"]
    assert f"step of the run (the checkpoint's is {report.checkpoint.step})" in seen["text"]
