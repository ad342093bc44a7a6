"""The HTML report as a reader sees it: rendered by a real, headless Chromium.

Each report is opened at a laptop's width (1366 x 768) and at a narrow
window (800 px), a full-page screenshot is written, and the page is
measured in the browser:

* every figure's image decoded (``naturalWidth > 0``) and is drawn wider
  than a thumbnail;
* every figure has a non-empty caption, and the page has its title and
  headline;
* nothing is wider than the window: no horizontal scroll bar on the page,
  and no table, figure or paragraph whose right edge passes the viewport;
  at a laptop's width every table fits whole, and on the narrow window a
  wide table scrolls inside its own box (the only block allowed to).

Chromium comes from the system (Debian's ``chromium`` package, which
``.ci/run`` installs); Playwright only drives it, no browser is downloaded.
Without Chromium the test is skipped, unless ``HYFL_REQUIRE_BROWSER=1``
(set by ``.ci/run``) makes that a failure. Screenshots go to
``$HYFL_SCREENSHOTS`` when set, else to the test's temporary folder.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hyfl.cli import app
from hyfl.experiments.report import build_report
from test_report import _fake_results

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
# What the machine's closed network needs: no background fetches, no first-run pages.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WIDTHS = {"laptop": (1366, 768), "narrow": (800, 900)}

# Run in the page: what a reader would notice, as numbers the test can assert on.
MEASURE = """() => {
  const vw = document.documentElement.clientWidth;
  const right = (el) => el.getBoundingClientRect().right;
  const images = [...document.querySelectorAll('figure img')].map((img) => ({
    alt: img.alt, loaded: img.complete && img.naturalWidth > 0,
    width: img.getBoundingClientRect().width, right: right(img)}));
  const captions = [...document.querySelectorAll('figure')].map(
    (f) => (f.querySelector('figcaption') || {innerText: ''}).innerText.trim());
  const blocks = [...document.querySelectorAll('body > *')].map((el) => ({
    tag: el.tagName, cls: el.className, text: el.innerText.slice(0, 60), right: right(el),
    scroll: el.scrollWidth, client: el.clientWidth}));
  return {viewport: vw, page: document.documentElement.scrollWidth, title: document.title,
          h1: (document.querySelector('h1') || {innerText: ''}).innerText,
          images, captions, blocks};
}"""


def _chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser():
    executable = _chromium()
    if executable is None:
        if os.environ.get("HYFL_REQUIRE_BROWSER") == "1":
            pytest.fail("HYFL_REQUIRE_BROWSER=1 but no Chromium is installed "
                        "(apt-get install chromium)")
        pytest.skip("no Chromium on this machine (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    folder = os.environ.get("HYFL_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Path]:
    """Two reports: the synthetic two-setting results, and a real ``hyfl compare``."""
    fake = build_report(_fake_results(tmp_path_factory.mktemp("fake")))
    out = tmp_path_factory.mktemp("compare") / "cmp"
    done = CliRunner().invoke(app, [
        "compare", "--data", "breast_cancer", "--partition", "grid:2x2",
        "--algorithms", "hyfdca,fedavg,hyfem", "--iterations", "20", "--eval-every", "5",
        "--seed", "0", "--out", str(out),
    ])
    assert done.exit_code in (0, 3), done.output  # 3: a run judged trivial, still written
    done = CliRunner().invoke(app, ["report", str(out)])
    assert done.exit_code == 0, done.output
    return {"synthetic": fake, "compare": out / "report.html"}


@pytest.mark.parametrize("width", sorted(WIDTHS))
@pytest.mark.parametrize("name", ["synthetic", "compare"])
def test_report_renders_in_chromium(browser, reports, screenshots, name, width):
    viewport_width, viewport_height = WIDTHS[width]
    page = browser.new_page(viewport={"width": viewport_width, "height": viewport_height})
    try:
        page.goto(reports[name].resolve().as_uri(), wait_until="load")
        seen = page.evaluate(MEASURE)
        shot = screenshots / f"report-{name}-{width}.png"
        page.screenshot(path=str(shot), full_page=True)
    finally:
        page.close()
    assert shot.stat().st_size > 10_000  # a rendered page, not a blank one

    assert seen["title"] and seen["h1"] == seen["title"]
    assert seen["images"], "the report has no figures"
    for image in seen["images"]:
        assert image["loaded"], f"figure {image['alt']!r} did not load"
        assert image["width"] > min(400, viewport_width / 2), image
    assert len(seen["captions"]) == len(seen["images"])
    assert all(len(c) > 20 for c in seen["captions"]), seen["captions"]

    viewport = seen["viewport"]
    assert seen["page"] <= viewport, f"the page scrolls sideways: {seen['page']} > {viewport}"
    wide = [b for b in seen["blocks"] if b["right"] > viewport + 0.5]
    assert not wide, f"passes the window's right edge ({viewport} px): {wide}"
    scrolling = [b for b in seen["blocks"] if b["scroll"] > b["client"]]
    if width == "laptop":
        assert not scrolling, f"does not fit at {viewport} px: {scrolling}"
    else:
        assert all(b["tag"] == "DIV" and b["cls"] == "table" for b in scrolling), scrolling
