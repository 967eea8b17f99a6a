"""The round-grid page in a real browser: Debian's Chromium, headless, driven by Playwright, against a real
`minirt serve` on 127.0.0.1.

What the page shows is read back from its DOM (each grid cell's data-row, data-round, data-request and
data-state) and held to independent references: the grid `python -m minirt.rounds --lengths 2,5,8,4
--batch-size 3` prints, for either policy; the completion ids and token counts the openai client gets; the
text the openai client gets for the form's prompt and seed.  Any console error or uncaught exception in the
page fails the test.

Needs the browser extra (`pip install -e ".[serve,test,browser]"`: Playwright for Python and Pillow) and
Chromium from Debian (`apt-get install chromium`); without them these tests skip.  Playwright downloads no
browser here: it launches /usr/bin/chromium (or $MINIRT_CHROMIUM).  Set MINIRT_SCREENSHOT=docs/rounds-page.png
to write the README's screenshot.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import threading
from collections import Counter
from pathlib import Path

import pytest

from serving import MISSING, Server
from test_rounds_feed import printed_grid

CHROMIUM = os.environ.get("MINIRT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
BROWSER_STACK = [name for name in ("playwright", "PIL") if importlib.util.find_spec(name) is None]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        bool(MISSING + BROWSER_STACK),
        reason=f"not installed: {', '.join(MISSING + BROWSER_STACK)} "
        '(pip install -e ".[serve,test,browser]")',
    ),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no Chromium: apt-get install chromium"),
]

# As root Chromium needs --no-sandbox; the rest keep it from reaching for Google's hosts.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


class Page:
    """One browser tab on the page, recording every console error and uncaught exception."""

    def __init__(self, browser, url: str):
        self.tab = browser.new_page(viewport={"width": 1400, "height": 820})
        self.errors: list[str] = []
        self.tab.on("console", self.on_console)
        self.tab.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        self.tab.goto(f"{url}/")
        # The hello event has come: the server's facts are shown.
        self.tab.wait_for_function("document.getElementById('policy').textContent !== '?'")

    def on_console(self, message) -> None:
        if message.type == "error":
            self.errors.append(f"console: {message.text}")

    def cells(self) -> list[dict]:
        """Every grid cell's attributes, as the DOM has them."""
        return self.tab.eval_on_selector_all(
            "#grid .cell",
            "cells => cells.map(c => ({row: +c.dataset.row, round: +c.dataset.round, run: +c.dataset.run,"
            " request: c.dataset.request, state: c.dataset.state}))",
        )

    def close(self) -> None:
        self.tab.close()


def wait_until_listed_as_finished(page: Page, ids: list[str]) -> None:
    """Wait until the page lists every one of these requests as finished.  Under continuous batching the
    exercise's fourth request ends in round 6 and its longest in round 8, so the fourth's result alone
    does not mean the grid is whole."""
    for request_id in ids:
        page.tab.wait_for_selector(
            f"#finished-table tr[data-request='{request_id}']", timeout=WAIT_MS
        )


def grid_marks(cells: list[dict], request_id: str) -> tuple[str, set[int]]:
    """A request's marks in the page's grid, a character a round of its run ('#' active, '.' held), and
    the rows it took."""
    own = [c for c in cells if c["request"] == request_id]
    assert own, f"{request_id} is not in the grid"
    run = own[0]["run"]
    states = {c["round"]: c["state"] for c in own if c["run"] == run}
    last = max(states)
    marks = "".join(
        {"active": "#", "held": "."}.get(states.get(n, ""), " ") for n in range(1, last + 1)
    )
    return marks, {c["row"] for c in own}


def test_an_idle_page_shows_an_empty_grid_and_no_error(browser):
    with Server("--batch-size", "4") as server:
        page = Page(browser, server.url)
        assert page.tab.text_content("#policy") == "continuous"
        assert page.tab.text_content("#batch-size") == "4"
        assert page.cells() == []
        assert page.tab.locator("#row-labels div").count() == 4
        assert page.tab.text_content("#waiting-count") == "0"
        page.tab.wait_for_timeout(500)
        assert page.errors == []
        page.close()
        assert server.stop() == 0


def readme_serve_flags() -> list[str]:
    """The flags of README's `minirt serve` command under "Watch it live", whose page the README's screenshot
    shows: the static case is served with exactly these, so the screenshot and the command beside it agree."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    [flags] = re.findall(r"^minirt serve (--policy static[^#\n]*?)\s+#", readme, re.M)
    return flags.split()


def test_the_readme_serves_the_exercise_in_static_groups_of_3():
    flags = readme_serve_flags()
    assert flags[:4] == ["--policy", "static", "--batch-size", "3"] and "--round-delay" in flags


@pytest.mark.parametrize("policy, waited", [("static", 8), ("continuous", 2)])
def test_the_exercise_button_draws_the_grid_minirt_rounds_prints(browser, policy, waited, tmp_path):
    if policy == "static":
        flags = readme_serve_flags()
    else:
        flags = ["--policy", policy, "--batch-size", "3", "--round-delay", "100"]
    with Server(*flags) as server:
        page = Page(browser, server.url)
        with page.tab.expect_response("**/rounds/exercise") as response:
            page.tab.click("#exercise")
        ids = response.value.json()["ids"]
        if policy == "static":
            # During the run: the first group's sixth round is drawn, and the fourth request still waits.
            sixth_round = f"#grid .cell[data-round='6'][data-request='{ids[2]}']"
            # Polled every 20 ms: the animation frames that Playwright polls on by default come late
            # in headless Chromium (here, half a second).
            page.tab.wait_for_function(
                f'document.querySelector("{sixth_round}") !== null', polling=20, timeout=WAIT_MS
            )
            shot = tmp_path / "rounds-page.png"
            page.tab.screenshot(path=str(shot))
            check_not_blank(shot)
            target = os.environ.get("MINIRT_SCREENSHOT")
            if target:
                shutil.copyfile(shot, target)
        wait_until_listed_as_finished(page, ids)
        assert page.tab.text_content("#exercise-waited") == str(waited)
        cells = page.cells()
        expected = printed_grid(policy)
        for index, request_id in enumerate(ids):
            marks, rows = grid_marks(cells, request_id)
            # The page shows waiting in its queue, not in the grid: '-' is a blank there.
            assert marks.rstrip() == expected[index].replace("-", " ").rstrip(), (policy, index)
            assert len(rows) == 1
        # No row shows two requests in one round.
        taken = Counter((c["run"], c["round"], c["row"]) for c in cells)
        assert max(taken.values()) == 1
        assert page.errors == []
        page.close()
        assert server.stop() == 0


def check_not_blank(path: Path) -> None:
    """A screenshot with a drawn grid: many colours, and much of it unlike its background."""
    from PIL import Image

    image = Image.open(path).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None
    background_pixels = max(count for count, _ in colours)
    total = image.width * image.height
    assert len(colours) > 50, "the screenshot has almost no colours"
    assert background_pixels / total < 0.9, "the screenshot is nearly one colour"


def test_openai_requests_show_in_the_grid_under_their_ids_for_as_many_rounds_as_tokens(browser):
    with Server("--batch-size", "3") as server:
        page = Page(browser, server.url)
        client = server.client()
        answers = {}

        def send(k):
            answers[k] = client.completions.create(
                model=None, prompt=f"KING {k}:", max_tokens=4 + 6 * k, seed=k, temperature=0.9
            )

        threads = [threading.Thread(target=send, args=(k,)) for k in range(5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(answers) == 5
        for answer in answers.values():
            page.tab.wait_for_selector(
                f"#finished-table tr[data-request='{answer.id}']", timeout=WAIT_MS
            )
        cells = page.cells()
        for answer in answers.values():
            active = [c for c in cells if c["request"] == answer.id and c["state"] == "active"]
            assert len(active) == answer.usage.completion_tokens
            row = page.tab.locator(f"#finished-table tr[data-request='{answer.id}'] td.tokens")
            assert row.text_content() == str(answer.usage.completion_tokens)
        assert page.errors == []
        page.close()
        assert server.stop() == 0


def test_the_forms_streamed_text_is_the_openai_clients_completion(browser):
    with Server() as server:
        page = Page(browser, server.url)
        prompt = "JULIET:\nO Romeo, Romeo!"
        page.tab.fill("#form-prompt", prompt)
        page.tab.fill("#form-max-tokens", "30")
        page.tab.fill("#form-seed", "11")
        page.tab.click("#form-send")
        page.tab.wait_for_selector("#form-text[data-done]", timeout=WAIT_MS)
        streamed = page.tab.text_content("#form-text")
        completion_id = page.tab.get_attribute("#form-id", "data-request")
        answer = server.client().completions.create(
            model=None, prompt=prompt, max_tokens=30, seed=11
        )
        assert streamed == answer.choices[0].text
        assert completion_id.startswith("cmpl-") and completion_id != answer.id
        assert page.errors == []
        page.close()
        assert server.stop() == 0


def test_a_reconnection_redraws_without_doubles_and_an_idle_rate_falls_to_0(browser):
    with Server("--batch-size", "3") as server:
        page = Page(browser, server.url)
        with page.tab.expect_response("**/rounds/exercise") as response:
            page.tab.click("#exercise")
        ids = response.value.json()["ids"]
        wait_until_listed_as_finished(page, ids)
        before = page.cells()
        # What the browser does after a dropped stream: a new EventSource, whose hello brings the rounds again.
        page.tab.evaluate("() => connect()")
        page.tab.wait_for_timeout(3700)
        after = page.cells()
        assert sorted(map(str, after)) == sorted(map(str, before))
        finished = page.tab.eval_on_selector_all(
            "#finished-table tbody tr", "rows => rows.map(r => r.dataset.request)"
        )
        assert sorted(finished) == sorted(ids)
        # Nothing has run for over 3 seconds: the rate says so.
        assert page.tab.text_content("#rounds-per-second") == "0.0"
        assert page.errors == []
        page.close()
        assert server.stop() == 0
