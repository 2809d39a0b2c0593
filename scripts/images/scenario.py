#!/usr/bin/env python3
"""Runs a built gridlet image the way IoT Edge runs the module, and checks what a user relies on.

    scenario.py --image gridlet:amd64 --full
    scenario.py --image gridlet:arm64v8 --platform linux/arm64 [--persisted]

Smoke (every image): the container starts as UID 2000 with named volumes at /app/metadataDb and
/app/eventsDb and ports 4438 (HTTPS) and 5888 (HTTP) published on 127.0.0.1, answers /healthz on
both, takes a topic and a webhook subscription, and delivers a published event to a receiver on
the host.

--full adds: events published while the receiver is down are acknowledged; `podman stop`
(SIGTERM) stops the container cleanly within IoT Edge's grace period; a new container on the
same volumes has the topic and subscription back and delivers the undelivered events; a host
directory bind-mounted without write access for UID 2000 ends start-up with one clear line that
says what to chown, not a crash loop.

Standard library only. Every wait has a deadline; containers and volumes are removed at the end.
"""

import argparse
import http.server
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid

API = "api-version=2019-01-01-preview"
GRACE_SECONDS = 30  # IoT Edge's default: edgeAgent waits this long after SIGTERM
LIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]


def log(msg):
    print(f"== scenario: {msg}", flush=True)


def fail(msg):
    print(f"scenario: FAILED: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Receiver:
    """A webhook receiver on the host; answers 503 while `down`."""

    def __init__(self):
        self.ids = []
        self.down = False
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if receiver.down:
                    self.send_response(503)
                    self.end_headers()
                    return
                with receiver.lock:
                    receiver.ids.extend(e.get("id") for e in json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        # The container reaches the host through podman's host.containers.internal, which is
        # the host's address on the container network, not loopback.
        self.server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, ids, seconds):
        deadline = time.time() + seconds
        while time.time() < deadline:
            with self.lock:
                if set(ids) <= set(self.ids):
                    return
            time.sleep(0.2)
        fail(f"events {sorted(set(ids) - set(self.ids))} not delivered within {seconds} s")


def podman(*args, check=True, capture=True):
    cmd = ["podman", "--runtime", "runc", *args]
    r = subprocess.run(cmd, capture_output=capture, text=True)
    if check and r.returncode != 0:
        fail(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r


class Gridlet:
    """One container of the image, reached on its published ports."""

    def __init__(self, image, platform, volumes, env=()):
        self.http_port, self.https_port = free_port(), free_port()
        self.name = f"gridlet-scenario-{uuid.uuid4().hex[:8]}"
        args = ["run", "-d", "--name", self.name, *LIMITS,
                "-p", f"127.0.0.1:{self.http_port}:5888", "-p", f"127.0.0.1:{self.https_port}:4438",
                "-e", "inbound__serverAuth__tlsPolicy=enabled",
                "-e", "inbound__clientAuth__clientCert__enabled=false",
                "-e", "outbound__webhook__httpsOnly=false"]
        for e in env:
            args += ["-e", e]
        if platform:
            args += ["--platform", platform]
        for src, dst in volumes:
            args += ["-v", f"{src}:{dst}"]
        podman(*args, image)
        self.base = f"http://127.0.0.1:{self.http_port}"

    def call(self, method, path, body=None, timeout=10):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.base}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def wait_healthy(self, seconds):
        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                if self.call("GET", "/healthz", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            state = podman("inspect", "-f", "{{.State.Status}}", self.name).stdout.strip()
            if state in ("exited", "stopped"):
                fail(f"container exited while starting:\n{self.logs()}")
            time.sleep(0.3)
        fail(f"/healthz did not answer within {seconds} s:\n{self.logs()}")

    def https_healthz(self):
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the module's own self-signed certificate
        with urllib.request.urlopen(f"https://127.0.0.1:{self.https_port}/healthz",
                                    context=ctx, timeout=10) as r:
            return r.status

    def logs(self):
        r = podman("logs", self.name, check=False)
        return (r.stdout + r.stderr)[-4000:]

    def stop(self):
        start = time.time()
        podman("stop", "-t", str(GRACE_SECONDS), self.name)
        took = time.time() - start
        code = podman("inspect", "-f", "{{.State.ExitCode}}", self.name).stdout.strip()
        return took, code

    def remove(self):
        podman("rm", "-f", self.name, check=False)


def ok(status_body, what):
    status, body = status_body
    if status != 200:
        fail(f"{what}: {status} {body[:300]!r}")


def event(i):
    return {"id": i, "subject": "s", "eventType": "t", "eventTime": "2026-11-24T00:00:00Z",
            "dataVersion": "1", "data": {"n": i}}


def set_up(g, receiver, persisted):
    ok(g.call("PUT", f"/topics/t?{API}", {"properties": {"inputSchema": "EventGridSchema"}}), "PUT topic")
    props = {"destination": {"endpointType": "WebHook", "properties": {
        "endpointUrl": f"http://host.containers.internal:{receiver.port}/events"}},
        # Event Grid cloud's schedule retries after 10 s instead of the original's 1 minute.
        "retryPolicy": {"schedule": "eventGridCloud"}}
    if persisted:
        props["persistencePolicy"] = {"isPersisted": True}
    ok(g.call("PUT", f"/topics/t/eventSubscriptions/s?{API}", {"properties": props}), "PUT subscription")


def whoami(g):
    """The UID the container's process runs as (read from the image's config, then checked)."""
    user = podman("inspect", "-f", "{{.Config.User}}", g.name).stdout.strip()
    return user


def smoke(image, platform, persisted):
    receiver = Receiver()
    vols = [f"gridlet-scenario-{uuid.uuid4().hex[:8]}-{d}" for d in ("meta", "events")]
    g = Gridlet(image, platform, [(vols[0], "/app/metadataDb"), (vols[1], "/app/eventsDb")])
    try:
        g.wait_healthy(180 if platform else 60)
        if g.https_healthz() != 200:
            fail("HTTPS /healthz")
        if whoami(g) != "2000:2000":
            fail(f"runs as {whoami(g)!r}, not 2000:2000")
        # The image's HEALTHCHECK command, run inside the container (no curl there).
        hc = podman("exec", g.name, "/app/gridlet", "healthcheck", check=False)
        if hc.returncode != 0:
            fail(f"gridlet healthcheck inside the container: {hc.returncode} {hc.stderr.strip()}")
        set_up(g, receiver, persisted)
        ok(g.call("POST", f"/topics/t/events?{API}", [event("e1")], timeout=60), "publish")
        receiver.wait_for(["e1"], 120)
        log(f"{image}: healthz on HTTP and HTTPS, `gridlet healthcheck` inside, UID 2000, e1 delivered"
            + (" (persisted subscription)" if persisted else ""))
        return receiver, g, vols
    except BaseException:
        print(g.logs(), file=sys.stderr)
        g.remove()
        raise


def full(image, platform):
    receiver, g, vols = smoke(image, platform, persisted=True)
    g2 = None
    try:
        receiver.down = True
        for i in ("e2", "e3"):
            ok(g.call("POST", f"/topics/t/events?{API}", [event(i)]), f"publish {i}")
        took, code = g.stop()
        logs = g.logs()
        if code != "0" or took >= GRACE_SECONDS:
            fail(f"SIGTERM stop: exit {code} after {took:.1f} s:\n{logs}")
        log(f"SIGTERM: stopped cleanly in {took:.1f} s (exit 0)")
        g.remove()
        receiver.down = False
        g2 = Gridlet(image, platform, [(vols[0], "/app/metadataDb"), (vols[1], "/app/eventsDb")])
        g2.wait_healthy(60)
        status, body = g2.call("GET", f"/topics/t/eventSubscriptions/s?{API}")
        if status != 200 or json.loads(body)["name"] != "s":
            fail(f"subscription not back after restart: {status} {body[:200]!r}")
        receiver.wait_for(["e2", "e3"], 120)
        log("new container on the same volumes: topic and subscription back, e2 and e3 delivered")
    finally:
        if g2:
            g2.remove()
        g.remove()
        podman("volume", "rm", "-f", *vols, check=False)
    unwritable_bind_mount(image, platform)


def unwritable_bind_mount(image, platform):
    host_dir = tempfile.mkdtemp(prefix="gridlet-root-owned-")
    os.chmod(host_dir, 0o755)  # owned by root: UID 2000 cannot write
    g = Gridlet(image, platform, [(host_dir, "/app/eventsDb")])
    try:
        deadline = time.time() + 30
        state = ""
        while time.time() < deadline:
            state = podman("inspect", "-f", "{{.State.Status}}", g.name).stdout.strip()
            if state in ("exited", "stopped"):
                break
            time.sleep(0.3)
        logs = g.logs()
        if state not in ("exited", "stopped"):
            fail(f"started although /app/eventsDb is not writable:\n{logs}")
        hint = [line for line in logs.splitlines() if "chown" in line]
        if len(hint) != 1 or "2000" not in hint[0]:
            fail(f"expected one line telling what to chown for UID 2000, got:\n{logs}")
        log(f"unwritable bind mount: exits with {hint[0].strip()!r}")
    finally:
        g.remove()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--image", required=True)
    p.add_argument("--platform")
    p.add_argument("--persisted", action="store_true")
    p.add_argument("--full", action="store_true")
    a = p.parse_args()
    if a.full:
        full(a.image, a.platform)
    else:
        receiver, g, vols = smoke(a.image, a.platform, a.persisted)
        g.remove()
        podman("volume", "rm", "-f", *vols, check=False)


if __name__ == "__main__":
    main()
