"""The operator console in a real browser (headless Chromium from Debian, driven by Playwright
for Python), against the gridlet the Rust test started (tests/it/console.rs).

Environment: GRIDLET_URL, GRIDLET_KEY (administrator), GRIDLET_PUBLISH_KEY, CHROMIUM (the
browser binary), SCREENSHOTS (a directory). The webhook receiver is this script's own small
HTTP server, whose answer per path can be switched between success and failure.
"""

import json
import os
import re
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from playwright.sync_api import expect, sync_playwright

BASE = os.environ["GRIDLET_URL"]
KEY = os.environ["GRIDLET_KEY"]
PUBLISH_KEY = os.environ["GRIDLET_PUBLISH_KEY"]
SHOTS = os.environ["SCREENSHOTS"]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
V = "api-version=2019-01-01-preview"
XSS = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


class Receiver:
    """Records what gridlet delivers; answers each path with its configured status."""

    def __init__(self):
        self.status = {}
        self.got = {}
        self.lock = threading.Lock()
        rx = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with rx.lock:
                    code = rx.status.get(self.path, 200)
                    if code == 200:
                        for e in json.loads(body):
                            rx.got.setdefault(self.path, []).append(e)
                self.send_response(code)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path):
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def ids(self, path):
        with self.lock:
            return sorted(e["id"] for e in self.got.get(path, []))

    def wait_for(self, path, ids, within=20):
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if set(ids) <= set(self.ids(path)):
                return
            time.sleep(0.05)
        raise AssertionError(f"{path} got {self.ids(path)}, wanted {ids}")


def request(method, path, body=None, content_type="application/json", version=V):
    req = urllib.request.Request(
        f"{BASE}{path}?{version}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": content_type, "aeg-sas-key": KEY},
        method=method,
    )
    with urllib.request.urlopen(req) as r:
        assert r.status == 200, r.status
        text = r.read()
        return json.loads(text) if text else None


def publish(topic, events):
    request("POST", f"/topics/{topic}/events", events)


def event(i, subject="orders/1", data=None):
    return {
        "id": str(i),
        "subject": subject,
        "eventType": "order.created",
        "eventTime": "2026-11-28T06:00:00Z",
        "dataVersion": "1.0",
        "data": data if data is not None else {"n": i},
    }


def shot(page, name):
    page.screenshot(path=os.path.join(SHOTS, f"{name}.png"), full_page=True)


def main():
    rx = Receiver()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        problems = []
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        failed = []
        page.on(
            "console",
            lambda m: problems.append(f"console {m.type}: {m.text}")
            if m.type == "error" and "Failed to load resource" not in m.text
            else None,
        )
        page.on(
            "response",
            lambda r: failed.append(f"{r.status} {r.request.method} {r.url.split('?')[0]}")
            if r.status >= 400
            else None,
        )
        page.on("dialog", lambda d: d.accept())
        expect.set_options(timeout=20_000)

        # A publish-only key sees no management page.
        page.goto(f"{BASE}/console/")
        expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        # Keyboard: focus starts in the key field; Tab reaches the button.
        assert page.evaluate("document.activeElement.id") == "sas-key"
        page.keyboard.type(PUBLISH_KEY)
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.textContent") == "Sign in"
        page.keyboard.press("Enter")
        expect(page.locator("#refused")).to_be_visible()
        expect(page.locator("#nav")).to_be_hidden()
        page.goto(f"{BASE}/console/#/topics")
        page.reload()
        expect(page.locator("#refused")).to_be_visible()
        assert page.locator("#topic-list").count() == 0
        shot(page, "refused")
        page.get_by_role("button", name="Use another key").click()

        # Sign in as administrator, with the keyboard.
        page.get_by_label("SAS key").fill(KEY)
        page.keyboard.press("Enter")
        # Back where it was going.
        expect(page.get_by_role("heading", name="Topics and subscriptions")).to_be_visible()
        assert page.evaluate("sessionStorage.length") == 1
        assert page.evaluate("document.cookie") == ""

        # Create a topic and a webhook subscription through the forms; publish; the counts move.
        page.get_by_label("New topic name").fill("orders")
        page.get_by_role("button", name="Create topic").click()
        orders = page.locator('section[data-topic="orders"]')
        expect(orders).to_be_visible()
        # A bad name is refused by the API's own validation, shown by the form.
        page.get_by_label("New topic name").fill("no spaces allowed")
        page.get_by_role("button", name="Create topic").click()
        expect(page.locator("section[aria-label='New topic'] .error")).to_contain_text("Invalid")

        def add_subscription(name, path, attempts=None):
            section = page.locator('section[data-topic="orders"]')
            section.get_by_text("Add a webhook subscription to orders").click()
            section.get_by_label("New subscription", exact=True).fill(name)
            section.get_by_label("Webhook URL").fill(rx.url(path))
            if attempts:
                section.get_by_label("Max attempts").fill(str(attempts))
            section.get_by_role("button", name="Add subscription").click()
            expect(page.get_by_role("link", name=name, exact=True)).to_be_visible()

        add_subscription("audit", "/audit")
        publish("orders", [event(i) for i in range(1, 4)])
        rx.wait_for("/audit", ["1", "2", "3"])
        expect(page.locator("#stat-delivered-orders-audit")).to_have_text("3")
        expect(page.locator("#stat-pending-orders-audit")).to_have_text("0")
        expect(page.locator("#stat-oldest-orders-audit")).to_have_text("—")
        shot(page, "topics")

        # A failing endpoint: its events become dead letters, and it freezes.
        rx.status["/flaky"] = 500
        add_subscription("flaky", "/flaky", attempts=1)
        publish(
            "orders",
            [
                event(10),
                event(11, data={"note": XSS}),
                {**event(12), "traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"},
            ],
        )
        expect(page.locator("#stat-dead-orders-flaky")).to_have_text("3")
        expect(page.locator("#stat-health-orders-flaky")).to_have_text("Frozen")
        # The healthy subscription got those three too: its count moved on.
        expect(page.locator("#stat-delivered-orders-audit")).to_have_text("6")
        page.evaluate("document.getElementById('toast').textContent = ''")
        page.locator("main").screenshot(path=os.path.join(SHOTS, "topics-frozen.png"))
        page.get_by_role("link", name="flaky", exact=True).click()
        expect(page.locator("#dead-letter-count")).to_have_text("3")
        expect(page.locator("#health-state")).to_have_text("Frozen")
        expect(page.locator("#last-error")).to_contain_text("500")
        rows = page.locator("#dead-letters tbody tr")

        def letter(event_id):
            return rows.filter(has=page.locator("code.event-id", has_text=re.compile(f"^{event_id}$")))

        expect(rows).to_have_count(3)
        # The <script> body is text, never markup.
        row = letter("11")
        row.get_by_role("button", name="Body").click()
        expect(row.locator("pre.body")).to_contain_text("<script>window.__pwned = 1</script>")
        assert page.locator("#dead-letters pre.body img, #dead-letters pre.body script").count() == 0
        assert page.evaluate("window.__pwned") is None
        # The traced event links to the trace viewer.
        link = letter("12").get_by_role("link")
        expect(link).to_have_attribute("href", f"http://jaeger.example:16686/trace/{TRACE}")
        shot(page, "subscription")

        # The receiver recovers; re-enable the frozen endpoint, then replay one, then the rest.
        rx.status["/flaky"] = 200
        page.get_by_role("button", name="Re-enable endpoint").click()
        expect(page.locator("#health-state")).to_have_text("Enabled")
        letter("10").get_by_role("checkbox").check()
        page.get_by_role("button", name="Replay selected").click()
        rx.wait_for("/flaky", ["10"])
        expect(rows).to_have_count(2)
        page.get_by_role("button", name="Replay all").click()
        rx.wait_for("/flaky", ["10", "11", "12"])
        expect(page.locator("#no-letters")).to_be_visible()
        expect(page.locator("#dead-letter-count")).to_have_text("0")
        delivered = [e for e in rx.got["/flaky"] if e["id"] == "11"][0]
        assert delivered["data"]["note"] == XSS

        # The live tail shows a published event, as text.
        page.get_by_role("link", name="Live tail").click()
        page.get_by_label("Topic").select_option("orders")
        page.get_by_label("Subject begins with").fill("tail/")
        page.get_by_role("button", name="Start").click()
        expect(page.locator("#tail-state")).to_have_text("Listening to orders.")
        publish("orders", [event(20, subject="other/1"), event(21, subject="tail/1", data={"x": XSS})])
        tailed = page.locator("li.tail-event")
        expect(tailed).to_have_count(1)
        expect(tailed).to_contain_text("tail/1")
        expect(tailed.locator("pre.body")).to_contain_text("<script>window.__pwned = 1</script>")
        assert page.evaluate("window.__pwned") is None
        shot(page, "tail")
        page.get_by_role("button", name="Stop").click()

        # A queue subscription, created from JSON in the UI: locked events, their delivery
        # counts, the oldest one.
        page.get_by_role("link", name="Topics").click()
        page.get_by_label("New topic name").fill("jobs")
        page.get_by_label("Input schema").select_option("CloudEventSchemaV1_0")
        page.get_by_role("button", name="Create topic").click()
        jobs_section = page.locator('section[data-topic="jobs"]')
        jobs_section.get_by_text("Add any subscription to jobs from JSON").click()
        jobs_section.get_by_label("Subscription name").fill("workers")
        props = jobs_section.get_by_label("Properties (JSON, as in the API)")
        props.fill('{"deliveryConfiguration": {"deliveryMode": "Bogus"}}')
        jobs_section.get_by_role("button", name="Create from JSON").click()
        expect(jobs_section.get_by_role("alert").filter(has_text="Invalid")).to_contain_text("deliveryMode")
        props.fill('{"deliveryConfiguration": {"deliveryMode": "Queue"}}')
        jobs_section.get_by_role("button", name="Create from JSON").click()
        expect(page.get_by_role("link", name="workers", exact=True)).to_be_visible()
        jobs = [
            {"specversion": "1.0", "id": f"j{i}", "source": "s", "type": "job", "data": {"i": i}}
            for i in range(3)
        ]
        request("POST", "/topics/jobs/events", jobs, content_type="application/cloudevents-batch+json")
        got = request(
            "POST",
            "/topics/jobs/eventsubscriptions/workers:receive",
            version="api-version=2024-06-01&maxEvents=2&maxWaitTime=5",
        )
        assert len(got["value"]) == 2, got
        page.goto(f"{BASE}/console/#/topics/jobs/subscriptions/workers")
        expect(page.locator("#queue-locked")).to_have_text("2")
        expect(page.get_by_role("table", name="Locked events by delivery count")).to_contain_text("2")
        expect(page.get_by_text("Oldest locked event")).to_be_visible()
        shot(page, "queue")

        # The overview: charts from the ring of samples, changed settings masked.
        page.get_by_role("link", name="Overview").click()
        expect(page.locator("#charts figure")).to_have_count(4)
        # The broker's connections: no MQTT sources in this test, every endpoint reachable.
        expect(page.locator("#connections")).to_contain_text("No MQTT source connections")
        expect(page.locator("#connections")).to_contain_text("Every endpoint is reachable")
        expect(page.locator("#charts polyline").first).to_be_attached(timeout=30_000)
        expect(page.get_by_text("inbound__clientAuth__sasKeys__key1")).to_be_visible()
        assert KEY not in page.content()
        shot(page, "overview")

        # A phone-sized screen: nothing wider than the screen but the scrollable tables.
        page.set_viewport_size({"width": 390, "height": 844})
        page.get_by_role("link", name="Topics").click()
        expect(orders).to_be_visible()
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 392, f"page is {width}px wide on a 390px screen"
        shot(page, "topics-phone")

        assert not problems, problems
        # The only failed requests are the ones provoked: the refused key and the bad name.
        unexpected = [
            f
            for f in failed
            if not (f.startswith("401 GET") or f.startswith("403 GET"))
            and f != f"400 PUT {BASE}/topics/no%20spaces%20allowed"
            and f != f"400 PUT {BASE}/topics/jobs/eventSubscriptions/workers"
        ]
        assert not unexpected, failed
        browser.close()
    print("console scenario passed")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the Rust test prints stdout and stderr
        print(f"FAILED: {e!r}", file=sys.stderr)
        raise
