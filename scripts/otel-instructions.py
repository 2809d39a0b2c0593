#!/usr/bin/env python3
"""Tracing's cost in instructions per event, independent of the machine's load.

Runs the release gridlet under valgrind's callgrind (which counts every instruction the process
executes), publishes N events one per request to a webhook subscription, waits until all are
delivered, stops gridlet with SIGTERM and reads the instruction total. Each mode is run with N
events and with none; the difference divided by N is the instructions one event costs
(publish, route, delivery, settle, and for `--persisted` the event log). Modes: export off;
export on at 100 % sampling; a parent-based 1 % sampler. Export goes to a local sink that
answers 200 without decoding.

    scripts/otel-instructions.py [--gridlet target/release/gridlet] [--events 2000] [--persisted]

Needs valgrind. On a shared VM wall-clock numbers move by a third between runs; these do not
(callgrind counts instructions, not time), which is what bounding a 5 % cost needs.
"""

import argparse
import http.client
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

V = "api-version=2019-01-01-preview"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Counter(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    count = 0
    lock = threading.Lock()

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path.startswith("/hook"):
            with Counter.lock:
                Counter.count += len(json.loads(body))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


def serve():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Counter)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv.server_address[1]


def request(conn, method, path, body=None, headers=None):
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=h)
    r = conn.getresponse()
    r.read()
    return r.status


def run(gridlet, mode, n, persisted, hook_port, sink_port):
    port = free_port()
    d = tempfile.mkdtemp(prefix="gridlet-ir-")
    out = os.path.join(d, "callgrind.out")
    env = {
        "PATH": os.environ.get("PATH", ""),
        "inbound__serverAuth__tlsPolicy": "disabled",
        "inbound__clientAuth__clientCert__enabled": "false",
        "inbound__bindAddress": "127.0.0.1",
        "inbound__httpPort": str(port),
        "outbound__webhook__httpsOnly": "false",
        "persistence__metadataPath": os.path.join(d, "m"),
        "persistence__eventsPath": os.path.join(d, "e"),
        "broker__workerThreads": "2",
    }
    if not persisted:
        # No sled and no event log: fewer background threads whose work grows with wall time.
        env["persistence__store"] = "memory"
    else:
        # No periodic sled flush (its work grows with wall time, not with events).
        env["persistence__flushEveryMs"] = "0"
    if mode != "off":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{sink_port}"
    if mode == "ratio":
        env["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
        env["OTEL_TRACES_SAMPLER_ARG"] = "0.01"
    p = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", gridlet],
        env=env,
        cwd=d,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 300
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                if request(c, "GET", "/healthz") == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise SystemExit("gridlet did not start under valgrind")
            time.sleep(0.5)
        assert request(c, "PUT", f"/topics/t?{V}", {}) == 200
        sub = {
            "properties": {
                "destination": {
                    "endpointType": "WebHook",
                    "properties": {"endpointUrl": f"http://127.0.0.1:{hook_port}/hook"},
                },
                "persistencePolicy": {"isPersisted": persisted},
            }
        }
        assert request(c, "PUT", f"/topics/t/eventSubscriptions/s?{V}", sub) == 200
        with Counter.lock:
            Counter.count = 0
        for i in range(n):
            ev = [{"id": f"e{i}", "subject": "s", "eventType": "t", "dataVersion": "1",
                   "eventTime": "2026-01-01T00:00:00Z", "data": {"pad": "x" * 150}}]
            assert request(c, "POST", f"/topics/t/events?{V}", ev) == 200
        while True:
            with Counter.lock:
                if Counter.count >= n:
                    break
            if time.time() > deadline + 600:
                raise SystemExit("not every event was delivered")
            time.sleep(0.2)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=300)
    text = open(out).read()
    m = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
    return int(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gridlet", default="target/release/gridlet")
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--persisted", action="store_true")
    ap.add_argument("--modes", default="off,ratio,full")
    a = ap.parse_args()
    hook, sink = serve(), serve()
    zeros, totals = {}, []
    for mode in a.modes.split(","):
        zeros.setdefault(mode, []).append(run(a.gridlet, mode, 0, a.persisted, hook, sink))
        totals.append((mode, run(a.gridlet, mode, a.events, a.persisted, hook, sink)))
    # Each mode's start-up and shutdown (the exporter's last export) apart: the mean of its runs
    # without events.
    zero = {m: sum(z) / len(z) for m, z in zeros.items()}
    for m, z in zeros.items():
        print(f"{m:5}: without events {', '.join(f'{x:,}' for x in z)}")
    per = [(m, (t - zero[m]) / a.events, t) for m, t in totals]
    off = [p for m, p, _ in per if m == "off"]
    for mode, p, total in per:
        rel = ""
        if off:
            rel = f" ({(p / (sum(off) / len(off)) - 1) * 100:+.1f} % against export off)"
        print(f"{mode:5}: {total:,} with {a.events} events = {p:,.0f} per event{rel}", flush=True)

if __name__ == "__main__":
    sys.exit(main())
