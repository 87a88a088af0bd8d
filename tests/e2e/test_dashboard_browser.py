"""The dashboard (hub/operators/static/) in a real Chromium against a real `taskhub serve` and NATS.

Tasks are written as a server writes them, with the bridge; the page must show each change
without a reload, open a task's detail (by keyboard), sign in with a token, show what an
operator sees, warn when the hub is not ready, survive the hub going away and coming back,
fit a phone, and stay usable with 10,000 tasks. It must also apply `taskhub tail`'s progress
rule, keep text at WCAG AA contrast and log no console error (a CSP violation is one).
Waits are Playwright's expectations with deadlines, never sleeps. Screenshots go to
tmp_path, or to TASKHUB_SCREENSHOTS (docs/img/dashboard.png for the README).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest

from bridge import TaskBridge
from bridge.wire import TaskRecord
from hub.commands.embedded_nats import NatsServerProcess
from hub.operators import tail_view
from tests.cluster import HubProcess
from tests.e2e.browser import PageErrors, chromium, require_chromium, screenshot_dir
from tests.tokens import jwt

pytestmark = pytest.mark.usefixtures("browser_available")

SECRET = "dashboard-test-secret-that-is-long-enough-for-hs256"
RESULT = {"content": [{"type": "text", "text": "<b>done</b> & dusted"}], "isError": False}
ELICIT = {
    "method": "elicitation/create",
    "params": {"message": "Deploy to production?", "requestedSchema": {"type": "object"}},
}


PROGRESS_SAMPLES = [
    "40%",
    "12.5 % done",
    "3/10",
    "3 of 10 files",
    "step 2.5/10",
    "0/0",
    "150%",
    "5/4",
    "batch 1/4, 80%",
    "90% of 3/4",
    "of 3",
    "no numbers",
    "",
]


@pytest.fixture
def browser_available() -> None:
    require_chromium()


def expect(target: Any) -> Any:
    from playwright.async_api import expect as playwright_expect

    return playwright_expect(target)


@contextlib.asynccontextmanager
async def running_hub(
    data_dir: Path, nats_url: str, bucket: str, *args: str
) -> AsyncIterator[HubProcess]:
    hub = HubProcess(data_dir, nats_url, bucket, *args)
    hub.args += ["--public-url", hub.url]
    hub.start()
    try:
        async with httpx.AsyncClient() as client:
            await hub.wait_ready(client)
        yield hub
    finally:
        hub.stop()


def token(sub: str, *, operator: bool) -> str:
    claims: dict[str, Any] = {"sub": sub, "exp": int(time.time()) + 3600}
    if operator:
        claims["scope"] = "taskhub:operator"
    return jwt(claims, SECRET.encode())


def row(page: Any, task_id: str) -> Any:
    return page.locator(f'[data-testid="task-row"][data-task-id="{task_id}"]')


async def gather_chunked(calls: Iterable[Awaitable[TaskRecord]], size: int = 500) -> list[Any]:
    """Many writes in flight at once, but not all: the bridge pipelines its publishes."""
    done: list[Any] = []
    batch: list[Awaitable[TaskRecord]] = []
    for call in calls:
        batch.append(call)
        if len(batch) == size:
            done += await asyncio.gather(*batch)
            batch = []
    return done + list(await asyncio.gather(*batch))


async def no_horizontal_overflow(page: Any) -> None:
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= await page.evaluate("window.innerWidth"), "the page scrolls sideways"


# Every visible piece of text against the first opaque background behind it: the WCAG AA
# ratio for normal text, (L1 + 0.05) / (L2 + 0.05) >= 4.5. Returns the failures.
CONTRAST = """() => {
  const rgba = (css) => css.match(/[\\d.]+/g).map(Number);
  const lum = ([r, g, b]) => {
    const [R, G, B] = [r, g, b].map((v) => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * R + 0.7152 * G + 0.0722 * B;
  };
  const background = (el) => {
    for (; el; el = el.parentElement) {
      const c = rgba(getComputedStyle(el).backgroundColor);
      if (c.length < 4 || c[3] === 1) return c;
    }
    return [255, 255, 255];
  };
  const failures = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const el = node.parentElement;
    if (!node.textContent.trim() || !el.checkVisibility({ visibilityProperty: true })) continue;
    if (!el.getClientRects().length) continue;
    const [a, b] = [lum(rgba(getComputedStyle(el).color)), lum(background(el))];
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    if (ratio < 4.5) failures.push([node.textContent.trim().slice(0, 40), ratio.toFixed(2)]);
  }
  return failures;
}"""


async def test_live_updates_detail_disconnect_and_resync(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    async with (
        running_hub(tmp_path / "hub", nats_url, bucket) as hub,
        await TaskBridge.connect(nats_url, "srv-live", bucket=bucket) as bridge,
        chromium() as browser,
    ):
        page = await browser.new_page(viewport={"width": 1280, "height": 800})
        errors = PageErrors(page)
        await page.goto(hub.url + "/")
        await expect(page.get_by_test_id("connection")).to_have_text("live")
        await expect(page.get_by_test_id("empty")).to_be_visible()

        # A task written after the page loaded appears, with its progress bar.
        record = await bridge.create(owner="anonymous", status_message="step 1 of 4")
        task_row = row(page, record.task_id)
        await expect(task_row).to_have_attribute("data-status", "working")
        await expect(task_row.locator(".bar")).to_be_visible()
        await expect(page.get_by_test_id("count-working")).to_have_text("1")
        await bridge.working(record.task_id, status_message="step 3/4")
        await expect(task_row.locator(".c-message")).to_have_text("step 3/4")
        await expect(task_row.locator(".bar")).to_have_attribute("aria-valuenow", "75")

        # It completes without a reload; the counts follow.
        await bridge.complete(record.task_id, RESULT, status_message="finished")
        await expect(task_row).to_have_attribute("data-status", "completed")
        await expect(page.get_by_test_id("count-completed")).to_have_text("1")
        await expect(page.get_by_test_id("count-working")).to_have_text("0")
        assert await page.evaluate(CONTRAST) == [], "text below WCAG AA contrast"

        # Keyboard only: focus the grid, move to the row, open it with Enter.
        await page.get_by_test_id("task-grid").focus()
        await page.keyboard.press("ArrowDown")
        await expect(task_row).to_have_attribute("aria-selected", "true")
        await page.keyboard.press("Enter")
        detail = page.get_by_test_id("detail")
        await expect(detail).to_be_visible()
        result = page.get_by_test_id("detail-result")
        await expect(result).to_contain_text('"text": "<b>done</b> & dusted"')
        assert await detail.locator("b").count() == 0, "task data was parsed as HTML"
        await expect(page.get_by_test_id("detail-json")).to_contain_text(record.task_id)
        await page.screenshot(path=tmp_path / "detail.png")
        await page.keyboard.press("Escape")
        await expect(detail).to_be_hidden()

        # `/` jumps to the text filter; a filter that matches nothing empties the table.
        await page.keyboard.press("/")
        await expect(page.get_by_test_id("text-filter")).to_be_focused()
        await page.keyboard.type("no-such-task")
        await expect(page.get_by_test_id("empty")).to_have_text("No task matches the filters.")
        await page.get_by_test_id("text-filter").fill("srv-live")
        await expect(task_row).to_be_visible()
        await page.get_by_test_id("status-toggle-completed").click()
        await expect(task_row).to_be_hidden()
        await page.get_by_test_id("status-toggle-completed").click()
        await expect(task_row).to_be_visible()

        # The progress rule is `taskhub tail`'s (docs/dashboard.md, shared views).
        shown = await page.evaluate(
            "(ms) => ms.map((m) => window.taskhubDashboard.progressOf(m))", PROGRESS_SAMPLES
        )
        assert shown == [tail_view.progress(m) for m in PROGRESS_SAMPLES]

        # The page passes the stream's own filters on, and shows the hub's refusal of a bad one.
        filtered = await browser.new_page()
        await filtered.goto(hub.url + "/?status=working&server=srv-live")
        await expect(filtered.get_by_test_id("connection")).to_have_text("live")
        await expect(filtered.locator("#stream-filters")).to_have_text(
            "stream: server=srv-live status=working"
        )
        await expect(filtered.get_by_test_id("count-total")).to_have_text("0")
        await filtered.goto(hub.url + "/?status=finished")
        await expect(filtered.get_by_test_id("banner")).to_contain_text("unknown status")
        await filtered.close()

        # The hub goes away: a banner says so. A task deleted meanwhile is gone once it is
        # back, because the page replaces its view at `synced`.
        other = await bridge.create(owner="anonymous", status_message="survivor")
        await expect(row(page, other.task_id)).to_be_visible()
        assert errors.stop() == []
        hub.stop()
        banner = page.get_by_test_id("banner")
        await expect(banner).to_have_text("Disconnected — reconnecting…")
        await expect(page.get_by_test_id("connection")).to_have_text("disconnected")
        await page.screenshot(path=tmp_path / "disconnected.png")
        async with await nats.connect(nats_url) as nc:
            kv = await nc.jetstream().key_value(bucket)
            await kv.delete(record.task_id)
        hub.start()
        await expect(page.get_by_test_id("connection")).to_have_text("live", timeout=20_000)
        await expect(banner).to_be_hidden()
        await expect(row(page, other.task_id)).to_be_visible()
        await expect(task_row).to_have_count(0)
        await expect(page.get_by_test_id("count-total")).to_have_text("1")


async def write_mix(nats_url: str, bucket: str) -> list[TaskRecord]:
    """~30 tasks of every status, three owners, three servers; one server's clock is ten
    minutes behind so its tasks look stuck, and a few tasks expire within a minute."""
    records: list[TaskRecord] = []
    stale = datetime.now(UTC) - timedelta(minutes=10)
    async with (
        await TaskBridge.connect(nats_url, "srv-alpha", bucket=bucket) as alpha,
        await TaskBridge.connect(nats_url, "srv-beta", bucket=bucket) as beta,
        await TaskBridge.connect(nats_url, "srv-legacy", bucket=bucket, clock=lambda: stale) as old,
    ):
        owners = ["alice", "bob", "carol"]
        for i in range(24):
            bridge = alpha if i % 2 else beta
            owner = owners[i % 3]
            ttl = 45_000 if i in (3, 8) else 3_600_000
            rec = await bridge.create(owner=owner, ttl_ms=ttl, status_message="queued")
            kind = i % 6
            if kind == 0:
                rec = await bridge.complete(rec.task_id, RESULT, status_message="report ready")
            elif kind == 1:
                rec = await bridge.working(rec.task_id, status_message=f"indexing {i * 4}%")
            elif kind == 2:
                rec = await bridge.require_input(
                    rec.task_id, {"confirm": ELICIT}, status_message="waiting for approval"
                )
            elif kind == 3:
                error = {"code": -32603, "message": "upstream timed out"}
                rec = await bridge.fail(rec.task_id, error, status_message="gave up")
            elif kind == 4:
                rec = await bridge.working(rec.task_id, status_message=f"batch {i % 7 + 1}/8")
            else:
                rec = await bridge.cancelled(rec.task_id, status_message="cancelled by user")
            records.append(rec)
        for i in range(6):
            rec = await old.create(owner=owners[i % 3], status_message=f"migrating {i + 1} of 9")
            records.append(rec)
    return records


async def keep_working(nats_url: str, bucket: str, records: list[TaskRecord]) -> None:
    """Progress on srv-alpha and srv-beta's working tasks, so those servers stay heard."""
    live = [r for r in records if r.server != "srv-legacy" and r.task.status == "working"]
    bridges = {
        name: await TaskBridge.connect(nats_url, name, bucket=bucket)
        for name in ("srv-alpha", "srv-beta")
    }
    try:
        step = 0
        while True:
            step += 1
            for k, rec in enumerate(live):
                n = step + 7 * k
                message = f"step {n % 50 + 1}/50" if k % 2 else f"uploading chunk {n % 100}%"
                await bridges[rec.server].working(rec.task_id, status_message=message)
            await asyncio.sleep(0.3)  # a server's pace, not a wait for the page
    finally:
        for bridge in bridges.values():
            await bridge.close()


async def test_sign_in_operator_view_and_screenshot(
    nats_url: str, bucket: str, tmp_path: Path
) -> None:
    records = await write_mix(nats_url, bucket)
    args = ("--jwt-secret", SECRET, "--silent-after", "2")
    async with running_hub(tmp_path / "hub", nats_url, bucket, *args) as hub, chromium() as browser:
        updates = asyncio.create_task(keep_working(nats_url, bucket, records))
        try:
            page = await browser.new_page(viewport={"width": 1440, "height": 900})
            errors = PageErrors(page)
            await page.goto(hub.url + "/")
            # 401: the page asks for a token instead of retrying forever.
            form = page.get_by_test_id("sign-in")
            await expect(form).to_be_visible()
            await expect(page.get_by_test_id("token-input")).to_be_focused()
            forged = jwt({"sub": "olivia", "scope": "taskhub:operator"}, b"another-key" * 4)
            await page.get_by_test_id("token-input").fill(forged)
            await page.get_by_test_id("sign-in-submit").click()
            await expect(page.get_by_test_id("sign-in-error")).to_contain_text("did not accept")
            await page.get_by_test_id("token-input").fill(token("olivia", operator=True))
            await page.get_by_test_id("sign-in-submit").click()
            await expect(page.get_by_test_id("connection")).to_have_text("live")
            await expect(form).to_be_hidden()
            await expect(page.get_by_test_id("principal")).to_have_text("signed in as olivia")
            # The hub set the cookie, HttpOnly: no script on the page can read the token.
            (cookie,) = [c for c in await page.context.cookies() if c["name"] == "taskhub_token"]
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
            assert "taskhub_token" not in await page.evaluate("document.cookie")
            await expect(page.get_by_test_id("count-total")).to_have_text(str(len(records)))
            for status in ("working", "input_required", "completed", "failed", "cancelled"):
                await expect(page.get_by_test_id(f"count-{status}")).not_to_have_text("0")
            # Operators see owners, silent servers, stuck and expiring tasks.
            await expect(page.locator(".row.head .c-owner")).to_be_visible()
            await expect(page.get_by_test_id("silent-server")).to_have_count(1)
            await expect(page.get_by_test_id("silent-server")).to_contain_text("srv-legacy")
            await expect(page.locator("#stuck-count")).to_have_text("6")
            await expect(page.locator("#expiring-count")).not_to_have_text("0")
            await page.get_by_test_id("server-filter").select_option("srv-legacy")
            await expect(page.get_by_test_id("showing")).to_have_text("showing 6 of 30 tasks")
            await expect(page.locator('[data-testid="task-row"] .mark').first).to_have_text("stuck")
            await page.get_by_test_id("server-filter").select_option("")
            for box in ("stuck", "expiring", "silent"):
                await page.get_by_test_id(box).locator("summary").click()
            assert await page.evaluate(CONTRAST) == [], "text below WCAG AA contrast"

            asking = next(r for r in records if r.task.status == "input_required")
            await page.get_by_test_id("text-filter").fill(asking.task_id)
            await expect(page.get_by_test_id("showing")).to_have_text("showing 1 of 30 tasks")
            await row(page, asking.task_id).click()
            await page.get_by_test_id("text-filter").fill("")
            await page.get_by_test_id("text-filter").blur()
            await expect(page.get_by_test_id("detail-input")).to_contain_text("elicitation/create")
            await expect(page.get_by_test_id("detail-json")).to_contain_text('"owner"')
            # Charts with some history make the README picture honest.
            seconds = 15 if os.environ.get("TASKHUB_SCREENSHOTS") else 3
            await page.wait_for_function(
                f"() => window.taskhubDashboard.state.chartData[0].length >= {seconds}",
                timeout=(seconds + 10) * 1000,
            )
            await page.screenshot(path=screenshot_dir(tmp_path) / "dashboard.png")

            # Sign out, then in as a plain user: only their own tasks, no owner column.
            await page.get_by_test_id("detail-close").click()
            await page.get_by_test_id("sign-out").click()
            await expect(form).to_be_visible()
            await page.get_by_test_id("token-input").fill(token("bob", operator=False))
            await page.get_by_test_id("sign-in-submit").click()
            await expect(page.get_by_test_id("principal")).to_have_text("signed in as bob")
            bobs = sum(r.owner == "bob" for r in records)
            await expect(page.get_by_test_id("count-total")).to_have_text(str(bobs))
            await expect(page.locator(".row.head .c-owner")).to_be_hidden()
            assert [e for e in errors.stop() if "401" not in e] == []
        finally:
            updates.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await updates


async def test_phone_layout(nats_url: str, bucket: str, tmp_path: Path) -> None:
    async with (
        running_hub(tmp_path / "hub", nats_url, bucket) as hub,
        await TaskBridge.connect(nats_url, "srv-phone", bucket=bucket) as bridge,
        chromium() as browser,
    ):
        context = await browser.new_context(
            viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True
        )
        page = await context.new_page()
        errors = PageErrors(page)
        await page.goto(hub.url + "/")
        await expect(page.get_by_test_id("connection")).to_have_text("live")
        long = "a very long status message that would push a table sideways " * 4
        records = [
            await bridge.create(owner="anonymous", status_message=f"{i}/5 {long}") for i in range(5)
        ]
        done = await bridge.complete(records[0].task_id, RESULT)
        target = row(page, done.task_id)
        await expect(target).to_have_attribute("data-status", "completed")
        await expect(page.get_by_test_id("count-total")).to_have_text("5")
        await no_horizontal_overflow(page)
        # Low-value columns go; status, last update and message stay.
        assert await target.locator(".c-server").is_hidden()
        await expect(row(page, records[1].task_id).locator(".c-message")).to_be_visible()
        await target.tap()
        detail = page.get_by_test_id("detail")
        await expect(page.get_by_test_id("detail-result")).to_contain_text("dusted")
        box = await detail.bounding_box()
        assert box is not None and box["x"] == 0 and box["width"] == 390, "not full-screen"
        await no_horizontal_overflow(page)
        await page.screenshot(path=tmp_path / "phone-detail.png")
        await page.get_by_test_id("detail-close").tap()
        await expect(detail).to_be_hidden()
        await page.screenshot(path=tmp_path / "phone.png")
        assert errors.stop() == []


async def test_not_ready_banner(bucket: str, tmp_path: Path) -> None:
    """NATS goes away under a running hub: the stream stays, `fleet` says ready=false."""
    own_nats = NatsServerProcess(tmp_path / "nats")
    own_nats.start()
    try:
        async with (
            running_hub(tmp_path / "hub", own_nats.url, bucket) as hub,
            chromium() as browser,
        ):
            page = await browser.new_page()
            errors = PageErrors(page)
            await page.goto(hub.url + "/")
            await expect(page.get_by_test_id("connection")).to_have_text("live")
            await expect(page.get_by_test_id("ready-banner")).to_be_hidden()
            own_nats.stop()
            await expect(page.get_by_test_id("ready-banner")).to_contain_text("not ready")
            assert errors.stop() == []
            hub.kill()  # a graceful stop would wait for the NATS it cannot reach
    finally:
        own_nats.stop()


async def test_ten_thousand_tasks(nats_url: str, bucket: str, tmp_path: Path) -> None:
    async with (
        running_hub(tmp_path / "hub", nats_url, bucket) as hub,
        await TaskBridge.connect(nats_url, "srv-bulk", bucket=bucket) as bridge,
        chromium() as browser,
    ):
        page = await browser.new_page(viewport={"width": 1280, "height": 800})
        errors = PageErrors(page)
        await page.goto(hub.url + "/")
        await expect(page.get_by_test_id("connection")).to_have_text("live")
        records = await gather_chunked(
            bridge.create(owner="anonymous", status_message=f"item {i}", ttl_ms=600_000)
            for i in range(10_000)
        )
        total = page.get_by_test_id("count-total")
        await expect(total).to_have_text("10000", timeout=30_000)
        # Only the rows in view exist; the rest is a spacer.
        assert await page.locator('[data-testid="task-row"]:not([hidden])').count() < 100

        # A burst of changes while a filter is typed: the filter still applies.
        burst = asyncio.create_task(
            gather_chunked(
                bridge.working(r.task_id, status_message=f"busy {n % 100}%")
                for n, r in enumerate(records[:3000])
            )
        )
        needle = records[7777].task_id
        await page.get_by_test_id("text-filter").fill(needle[:13])
        await expect(page.get_by_test_id("showing")).to_have_text("showing 1 of 10000 tasks")
        await expect(row(page, needle)).to_be_visible()
        await burst
        await page.get_by_test_id("text-filter").fill("")
        await page.get_by_test_id("status-toggle-working").click()
        await expect(page.get_by_test_id("empty")).to_be_visible()
        await page.get_by_test_id("status-toggle-working").click()
        await expect(page.get_by_test_id("showing")).to_have_text("10000 tasks")
        await expect(page.get_by_test_id("count-working")).to_have_text("10000")
        await page.screenshot(path=tmp_path / "ten-thousand.png")
        assert errors.stop() == []
