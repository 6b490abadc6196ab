"""Regenerate the committed sample reports: `triage demo NAME` for each zoo example named, then a
screenshot of the top of each report.html in headless Chromium.

    python benchmarks/make_samples.py lr_too_high dead_relu          # into reports/samples/NAME/
    python benchmarks/make_samples.py --all --out /tmp/samples        # every zoo example

Checkpoints are cached under $TRIAGE_CACHE (default ~/.cache/triage). Screenshots need
/usr/bin/chromium (Debian: apt-get install -y chromium); without it only the reports are written.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
log = logging.getLogger("make_samples")


def triage_command() -> list[str]:
    """The `triage` script of the running interpreter's environment (so a venv's is used)."""
    script = Path(sys.executable).parent / "triage"
    if script.exists():
        return [str(script)]
    found = shutil.which("triage")
    if found:
        return [found]
    return [sys.executable, "-c", "from triage.cli.commands import main; main()"]


def make_sample(name: str, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([*triage_command(), "demo", name, "--out", str(out), "--output", "quiet"],
                   check=True, cwd=REPO)
    return out / "report.html"


def screenshot(html: Path, png: Path, width: int = 1200, height: int = 2600) -> None:
    """The first `height` pixels of the page, as a reader first sees it: the verdict, the proof and the
    walked path (at 1200 px wide its text is at reading size: no zoom needed)."""
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
             f"--user-data-dir={profile}", "--host-resolver-rules=MAP * ~NOTFOUND",
             f"--screenshot={png}", f"--window-size={width},{height}", html.resolve().as_uri()],
            check=True, capture_output=True, timeout=120)
    _shrink(png)


def _shrink(png: Path) -> None:
    """A 256-colour palette: a third of the bytes for a page of flat colours."""
    try:
        from PIL import Image
    except ImportError:
        return
    Image.open(png).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(png, optimize=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="zoo examples (see `triage demo --list`)")
    parser.add_argument("--all", action="store_true", help="every zoo example")
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "samples", help="parent folder")
    parser.add_argument("--height", type=int, default=2600, help="screenshot height in pixels")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    names = args.names
    if args.all:
        from triage.cli.zoo import example_names
        names = example_names()
    if not names:
        parser.error("name at least one zoo example, or pass --all")
    if not CHROMIUM.exists():
        log.warning("no %s: writing reports without screenshots (apt-get install -y chromium)", CHROMIUM)
    failed = []
    for name in names:
        try:
            html = make_sample(name, args.out / name)
            if CHROMIUM.exists():
                screenshot(html, html.parent / "screenshot.png", height=args.height)
            log.info("%s: %s", name, html)
        except subprocess.CalledProcessError as exc:
            failed.append(name)
            log.error("%s failed (exit %s): %s", name, exc.returncode, (exc.stderr or b"").decode()[-2000:])
    if failed:
        log.error("failed: %s", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
