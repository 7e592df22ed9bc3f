"""The memory view in a real browser (Debian's chromium, driven by Playwright, offline): the
page over a store made by memory-import shows the stored keyframes on the map, a search lists
the same hits as /api/search with their thumbnails and marks them, a clicked hit opens its
image with its neighbours in time, a named place shows its visits, a click on the map searches
there, and rows written while the page is open appear without a reload."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import camera_ids, get_json, open_view

from memory_node.core.ingest import CameraFrame
from memory_node.core.types import Pose

CHROMIUM = "/usr/bin/chromium"
LIVE_WITHIN_MS = 5000


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail("the browser tests need Debian's chromium: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 860})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert errors == []


def _ids(page, selector: str) -> list[int]:
    return [int(v) for v in page.eval_on_selector_all(
        selector, "els => els.map(e => e.dataset.id)")]


def _images_loaded(page, selector: str) -> list[int]:
    page.wait_for_function(
        f"() => [...document.querySelectorAll({json.dumps(selector)})].every(i => i.complete)")
    return page.eval_on_selector_all(selector, "els => els.map(e => e.naturalWidth)")


def test_search_lists_the_apis_hits_with_thumbnails_and_opens_a_hit(view, imported_store,
                                                                    page, tmp_path):
    server, _ = view
    page.goto(server.url)
    stored = camera_ids(imported_store)
    page.wait_for_function(f"document.querySelectorAll('#map .keyframe').length === "
                           f"{len(stored)}")
    assert set(_ids(page, "#map .keyframe")) == stored

    query = "a bright scene"
    page.fill("input#search", query)
    page.press("input#search", "Enter")
    page.wait_for_selector("#results .hit")
    _, answer = get_json(f"{server.url}api/search", data=query.encode())
    assert _ids(page, "#results .hit") == [r["id"] for r in answer["results"]]
    cameras = [r for r in answer["results"] if r["stream"] == "camera"]
    assert page.locator("#results .hit img").count() == len(cameras) > 0
    assert all(w > 0 for w in _images_loaded(page, "#results .hit img"))
    assert page.locator("#map .hit-mark").count() == len(answer["results"])

    second = answer["results"][1]["id"]
    page.click(f"#results .hit[data-id='{second}']")
    page.wait_for_selector(f"#detail[data-id='{second}'] img")
    assert _images_loaded(page, "#detail img")[0] > 200  # the keyframe itself, not a thumb
    assert page.locator(f"#map .keyframe.selected[data-id='{second}']").count() == 1
    # Its neighbour in time, one click away.
    _, row = get_json(f"{server.url}api/rows/{second}")
    page.click("#detail button.next")
    page.wait_for_selector(f"#detail[data-id='{row['next']}'] img")
    shot = tmp_path / "memory-view.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 20_000
    if os.environ.get("MEMORY_VIEW_SCREENSHOT"):  # the README's picture
        shutil.copy(shot, os.environ["MEMORY_VIEW_SCREENSHOT"])


def test_a_map_click_searches_there_zoom_and_pan_move_the_map(view, page):
    server, engine = view
    page.goto(server.url)
    page.wait_for_selector("#map .keyframe")
    # The streams panel: one row per stream of the streams answer.
    streams = json.loads(engine.streams())["streams"]
    page.wait_for_function(f"document.querySelectorAll('#streams table tr').length >= "
                           f"{len(streams) + 1}")
    names = page.eval_on_selector_all("#streams table:first-of-type tr td:first-child",
                                      "els => els.map(e => e.textContent.split(' ')[0])")
    assert names == [s["name"] for s in streams]

    # Zoom in on the map's centre: dots move apart and the scale bar says fewer metres; a
    # drag pans them by the drag.
    box = page.locator("#map").bounding_box()
    assert box is not None
    first = page.locator("#map .keyframe").first
    scale_before = page.text_content("#overlay .scalebar text")
    x0 = float(first.get_attribute("cx") or 0)
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.wheel(0, -800)
    page.wait_for_function(f"document.querySelector('#overlay .scalebar text').textContent "
                           f"!== {json.dumps(scale_before)}")
    x1 = float(first.get_attribute("cx") or 0)
    assert x1 != x0
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] / 2 + 100, box["y"] + box["height"] / 2, steps=5)
    page.mouse.up()
    page.wait_for_function(f"Math.abs(Number(document.querySelector('#map .keyframe')"
                           f".getAttribute('cx')) - {x1} - 100) < 1")
    assert page.locator("#near:not([hidden])").count() == 0  # a drag is not a click
    page.mouse.wheel(0, 800)
    # A click on the map beside a keyframe (not on it) searches around that point.
    spot = page.evaluate("""() => {
        for (const dot of document.querySelectorAll('#map .keyframe')) {
            const r = dot.getBoundingClientRect();
            for (const [dx, dy] of [[9, 0], [-9, 0], [0, 9], [0, -9]]) {
                const x = r.x + r.width / 2 + dx, y = r.y + r.height / 2 + dy;
                const hit = document.elementFromPoint(x, y);
                if (hit && !hit.matches('.keyframe, .note, .place')) return [x, y];
            }
        }
        return null;
    }""")
    assert spot is not None
    page.mouse.click(*spot)
    page.wait_for_selector("#near:not([hidden])")
    page.wait_for_function("document.querySelector('#results h3') !== null")
    hits = _ids(page, "#results .hit")
    near = page.evaluate("state.near")
    assert hits and near["radius"] == 2
    for hit_id in hits:
        _, row = get_json(f"{server.url}api/rows/{hit_id}")
        pose = row["result"]["pose"]
        assert np.hypot(pose["x"] - near["x"], pose["y"] - near["y"]) <= near["radius"] + 1e-6


def test_rows_written_while_the_page_is_open_appear_without_a_reload(imported_store,
                                                                     browser, tmp_path):
    memory = tmp_path / "memory"
    shutil.copytree(imported_store, memory)
    robot = Pose(x=4.0, y=3.0, yaw=0.5)
    server, engine = open_view(memory, pose_provider=lambda: robot)
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    try:
        page = context.new_page()
        page.goto(server.url)
        before = len(camera_ids(memory))
        page.wait_for_function(f"document.querySelectorAll('#map .keyframe').length === "
                               f"{before}")
        page.wait_for_selector("#map .robot")  # the current pose, live
        rng = np.random.default_rng(3)
        now = time.time()
        frames = [CameraFrame(now + i, Pose(x=3.0 + i, y=2.0, yaw=0.0),
                              rng.integers(0, 255, (240, 320, 3), dtype=np.uint8))
                  for i in range(2)]
        new_ids = engine.add_stream_rows("camera", frames)
        saved = json.loads(engine.save('{"note": "the plant by the window needs water", '
                                       '"tags": {"plant": true}}'))
        named = json.loads(engine.save('{"place": "hall", "x": 4.0, "y": 3.0, '
                                       '"radius": 1.5}'))
        assert saved["ok"] and named["ok"]
        written = time.monotonic()
        page.wait_for_function(f"document.querySelectorAll('#map .keyframe').length === "
                               f"{before + 2}", timeout=LIVE_WITHIN_MS)
        page.wait_for_selector(f"#map .note[data-id='{saved['id']}']", timeout=LIVE_WITHIN_MS)
        page.wait_for_selector("#map .place[data-name='hall']", timeout=LIVE_WITHIN_MS)
        assert time.monotonic() - written < LIVE_WITHIN_MS / 1000
        assert set(new_ids) <= set(_ids(page, "#map .keyframe"))

        # The place's visits, as the visits query answers them.
        place = page.locator("#map .place[data-name='hall']")
        size = place.bounding_box()
        assert size is not None
        place.click(position={"x": size["width"] * 0.15, "y": size["height"] * 0.5})
        page.wait_for_selector("#detail h3:has-text('visits to hall')")
        _, visits = get_json(f"{server.url}api/search",
                             data=b'{"visits": true, "near": "hall"}')
        assert visits["count"] > 0
        assert page.locator("#detail table tr").count() == 1 + len(visits["visits"])
    finally:
        context.close()
        server.stop()
        engine.close()
