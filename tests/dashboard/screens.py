"""Every dashboard page the browser tests visit is photographed at 1280 and 390 px and checked for
what an operator would see as broken: a page wider than the screen, or a card, table cell or
scrolling box whose content does not fit it (at 1280 px nothing may hide behind a scroll bar; at
390 px a wide table may scroll inside its card, but no card and no cell may clip).

The photographs go to tests/e2e/screenshots/ (CI keeps them as artifacts); `make screenshots`
sets TENZRO_SCREENSHOTS_DIR=docs/screenshots to refresh the 1280 px ones the docs show: the tour of
a three-node network with traffic (tests/dashboard/test_tour.py), and the generate page's own."""

from __future__ import annotations

import os
from pathlib import Path

SCREENSHOTS = Path(__file__).resolve().parents[1] / "e2e" / "screenshots"
DOCS_DIR = os.environ.get("TENZRO_SCREENSHOTS_DIR")

# [selector text, scrollWidth, clientWidth] of every element of the page whose content is wider than it.
_OVERFLOWING = """(scrollBoxesToo) => {
  const wide = (el) => el.scrollWidth > el.clientWidth + 1;
  const name = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") +
    (el.className && typeof el.className === "string" ? "." + el.className.trim().split(/\\s+/).join(".") : "") +
    " '" + (el.textContent || "").trim().slice(0, 40) + "'";
  const selector = scrollBoxesToo ? "main .card, main td, main th, main .scroll" : "main .card, main td, main th";
  return Array.from(document.querySelectorAll(selector)).filter(wide)
    .map((el) => [name(el), el.scrollWidth, el.clientWidth]);
}"""


def shoot(page, name: str, *, docs_name: str | None = None) -> None:
    """Photograph the page at 1280 px and at 390 px and check that nothing overflows; leaves 1280 px.
    `docs_name`: the page's photograph in docs/screenshots/ (under `make screenshots`) is this one."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for width, height in ((1280, 900), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        page.wait_for_timeout(200)
        page.screenshot(path=str(SCREENSHOTS / f"{name}-{width}.png"), full_page=True)
        if DOCS_DIR and docs_name and width == 1280:
            Path(DOCS_DIR).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(Path(DOCS_DIR) / f"{docs_name}.png"), full_page=True)
        assert page.evaluate("document.documentElement.scrollWidth") <= width + 4, (name, width)
        overflowing = page.evaluate(_OVERFLOWING, width >= 1280)
        assert overflowing == [], (name, width, overflowing)
    page.set_viewport_size({"width": 1280, "height": 900})
