"""A figure is drawn once: re-rendering a report takes what it drew from the user's figure cache, which
is what keeps `triage report` under a second (no matplotlib import). The cache never changes a page."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.report.test_report_render import crafted_report, inline_svgs
from tests.report.test_report_views import RENDER_WITHOUT, REPO
from triage.report import figure_cache, figures, plots, write_report
from triage.report.ahead import Ahead, _cores
from triage.report.render import render_html, write_json


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("TRIAGE_CACHE", str(folder))
    return folder


def test_a_rerender_draws_nothing_and_gives_the_same_page(cache, tmp_path):
    files = write_report(crafted_report(name="n"), tmp_path / "out")
    html = files["html"].read_text()
    assert len(inline_svgs(html)) >= 3 and len(list((cache / "figures").glob("*.svg"))) >= 3
    done = subprocess.run([sys.executable, "-c", RENDER_WITHOUT, str(REPO / "triage"), str(files["json"]), "matplotlib"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "TRIAGE_CACHE": str(cache)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == html


def test_other_figures_are_drawn_not_taken_from_the_cache(cache):
    rising = plots.loss_curves([figures.Series("run", [1.0, 2.0, 3.0, 4.0])])
    falling = plots.loss_curves([figures.Series("run", [4.0, 3.0, 2.0, 1.0])])
    assert rising != falling
    assert plots.loss_curves([figures.Series("run", [1.0, 2.0, 3.0, 4.0])]) == rising
    assert len(list((cache / "figures").glob("*.svg"))) == 2


def test_a_damaged_or_unwritable_cache_only_costs_a_redraw(cache, tmp_path, monkeypatch):
    series = [figures.Series("run", [1.0, 0.5, 0.25])]
    drawn = plots.loss_curves(series)
    (kept,) = (cache / "figures").glob("*.svg")
    kept.write_text("<svg><script>half a figure")  # truncated: not a whole <svg>
    assert plots.loss_curves(series) == drawn
    monkeypatch.setenv("TRIAGE_CACHE", str(tmp_path / "file"))
    (tmp_path / "file").write_text("a file where the cache folder would be")
    assert plots.loss_curves(series) == drawn
    page = write_report(crafted_report(name="n"), tmp_path / "out")["html"].read_text()
    assert len(inline_svgs(page)) >= 3


def test_the_key_changes_with_the_drawing_code(monkeypatch):
    series = [figures.Series("run", [1.0, 2.0])]
    before = figure_cache.key("curves", (series, "t"), {})
    monkeypatch.setattr(figure_cache, "_drawing_version", lambda: "another drawing.py")
    assert figure_cache.key("curves", (series, "t"), {}) != before
    assert figure_cache.key("curves", (object(),), {}) is None  # no stable text form: not kept


def test_the_cache_keeps_its_size_by_dropping_the_least_recently_used(cache, monkeypatch):
    folder = cache / "figures"
    folder.mkdir(parents=True)
    for i in range(10):
        (folder / f"{i}.svg").write_text("<svg>" + "x" * 1000 + "</svg>")
        os.utime(folder / f"{i}.svg", (i, i))
    monkeypatch.setattr(figure_cache, "MAX_BYTES", 8_000)
    figure_cache._trim_once.cache_clear()
    figure_cache.put("new", "<svg>" + "y" * 1000 + "</svg>")
    left = sorted(p.stem for p in folder.glob("*.svg"))
    assert "new" in left and "0" not in left and "9" in left
    assert sum(p.stat().st_size for p in folder.glob("*.svg")) <= 6_000


needs_two_cores = pytest.mark.skipif(_cores() < 2, reason="on one core nothing is drawn ahead")


@needs_two_cores
def test_figures_drawn_ahead_in_a_second_process_are_the_ones_the_page_takes(cache, tmp_path, monkeypatch):
    """The drawer starts before there is a report; the walk's journal writes report.json and says where;
    `finish()` (the final report.json written) waits for the drawer's last pass. The page drawn then
    draws no figure itself and is the page drawn without any head start."""
    report = crafted_report(name="n")
    without = render_html(report)  # drawn here, into the fixture's cache
    monkeypatch.setenv("TRIAGE_CACHE", str(tmp_path / "fresh"))
    (tmp_path / "out").mkdir()
    ahead = Ahead(finish_s=120)  # generous: a loaded test machine imports matplotlib slowly
    process = ahead._process
    ahead.follow(write_json(report, tmp_path / "out"))
    ahead.finish()
    assert process.returncode == 0 and ahead._process is None
    drawn_here = []
    monkeypatch.setattr(figure_cache, "put", lambda key, svg: drawn_here.append(key))
    assert render_html(report) == without and drawn_here == []


@needs_two_cores
def test_a_drawer_that_is_never_told_where_exits_and_one_closed_early_is_stopped():
    ahead = Ahead()
    process = ahead._process
    ahead.finish()  # no report.json was ever written: end of file, nothing to draw
    assert process.returncode == 0
    ahead = Ahead()
    process = ahead._process
    ahead.close()  # a walk that failed: the drawer is stopped, not waited for
    assert process.returncode is not None and ahead._process is None
    ahead.close()  # twice is harmless


def test_a_report_from_another_machine_rerenders_from_its_own_page_without_drawing(cache, tmp_path):
    """`triage report` on a copied folder: this machine's cache is empty, the figures come from the
    report.html beside report.json (each carries its key), matplotlib is never imported, same bytes."""
    files = write_report(crafted_report(name="n"), tmp_path / "out")
    html = files["html"].read_text()
    empty = tmp_path / "elsewhere"
    script = RENDER_WITHOUT.replace(
        "sys.stdout.write(render_html(read_report(sys.argv[2])))",
        "from pathlib import Path\nfrom triage.report import carried\n"
        "with carried.figures_from(Path(sys.argv[2]).parent / 'report.html'):\n"
        "    sys.stdout.write(render_html(read_report(sys.argv[2])))")
    done = subprocess.run([sys.executable, "-c", script, str(REPO / "triage"), str(files["json"]), "matplotlib"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "TRIAGE_CACHE": str(empty)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == html
    assert not (empty / "figures").exists()  # somebody else's figures are not kept


@pytest.mark.parametrize("change", [
    ('<g id="figure_1">', '<g id="figure_1"><script>alert(1)</script>'),
    ('<g id="figure_1">', '<g id="figure_1" onload="alert(1)">'),
    ('<g id="figure_1">', '<g id="figure_1"><foreignObject><div>x</div></foreignObject>'),
    ('<g id="figure_1">', '<g id="figure_1"><image href="http://example.com/track.png"/>'),
    ('<g id="figure_1">', '<g id="figure_1" style="fill: url(http://example.com/x)">'),
    ('<g id="figure_1">', '<g id="figure_1"><use xlink:href="http://example.com/a.svg#x"/>'),
    ("*{stroke-linejoin: round; stroke-linecap: butt}", "@import url(http://example.com/a.css);"),
    ('<g id="figure_1">', '<g id="figure_1"><![CDATA[</svg><script>alert(1)</script>]]>'),
    ('<g id="figure_1">', '<g id="figure_1" style="fill: image-set(\'https://example.com/b.png\' 1x)">'),
    ('<g id="figure_1">', '<g id="figure_1" style="fill: u\\72 l(https://example.com/x)">'),
    ('<g id="figure_1">', '<g id="figure_1"><title><style/></title>'),
    ('<g id="figure_1">', '<g id="figure_1" class="a&quot;b">'),
])
def test_a_carried_figure_that_is_not_what_triage_draws_is_drawn_again(cache, tmp_path, change):
    from triage.report import carried

    series = [figures.Series("run", [1.0, 0.5, 0.25])]
    drawn = plots.loss_curves(series)
    assert drawn.startswith('<svg data-figure="') and carried.is_plain_figure(drawn)
    tampered = drawn.replace(*change, 1)
    assert tampered != drawn and not carried.is_plain_figure(tampered)
    page = tmp_path / "report.html"
    page.write_text(f"<html><body><figure>{tampered}</figure></body></html>")
    for svg in (cache / "figures").glob("*.svg"):
        svg.unlink()
    with carried.figures_from(page):
        assert plots.loss_curves(series) == drawn  # drawn again, not taken from the page
