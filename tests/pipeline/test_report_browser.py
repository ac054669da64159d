"""The report opens in a real browser (headless Chromium) with every plot decoded.

Skips where Chromium is not installed (`.ci/run` installs Debian's `chromium`)."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")

PLOTS = {"loss_vs_tokens", "loss_vs_time", "bpb", "schedule", "throughput", "eval"}
# after the page loads, write what the browser made of each image into the DOM that --dump-dom prints
PROBE = """<script>window.addEventListener('load', () => {
  const seen = [...document.images].map(i => ({plot: i.dataset.plot, w: i.naturalWidth, h: i.naturalHeight, ok: i.complete}));
  document.body.setAttribute('data-images', JSON.stringify(seen));
});</script>"""


def images_in_browser(html_file: Path, tmp_path: Path) -> list[dict]:
    probed = tmp_path / f"probed-{html_file.name}"
    probed.write_text(html_file.read_text().replace("</body>", PROBE + "</body>"))
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         "--dump-dom", probed.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    match = re.search(r'data-images="([^"]*)"', dom)
    assert match, f"the probe did not run; DOM starts: {dom[:300]}"
    return json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def test_every_plot_renders_in_chromium(tiny_run, tmp_path):
    report = tiny_run / "report.html"
    images = images_in_browser(report, tmp_path)
    assert {i["plot"] for i in images} == PLOTS
    for image in images:
        assert image["ok"] and image["w"] > 100 and image["h"] > 100, image
    # and the embedded images are the PNG files written beside the report
    html = report.read_text()
    for name in PLOTS:
        data = re.search(rf'data-plot="{name}"[^>]*src="data:image/png;base64,([^"]+)"', html).group(1)
        assert base64.b64decode(data) == (tiny_run / "plots" / f"{name}.png").read_bytes()


def test_the_check_catches_a_broken_plot(tiny_run, tmp_path):
    broken = tmp_path / "broken.html"
    html = (tiny_run / "report.html").read_text()
    broken.write_text(re.sub(r'(data-plot="schedule"[^>]*src="data:image/png;base64,)[^"]+', r"\1AAAA", html))
    images = {i["plot"]: i for i in images_in_browser(broken, tmp_path)}
    assert images["schedule"]["w"] == 0 and images["eval"]["w"] > 0
