"""A minimal OTLP/HTTP traces receiver for gridlet's tests.

Decodes every `POST /v1/traces` with the official protobuf definitions (PyPI
`opentelemetry-proto`) and prints one JSON line per span on stdout; the first line is the port.
`POST /control/status/<code>` makes later exports answer `<code>` (a failing collector);
`POST /control/delay/<seconds>` makes them wait first (a slow one). With `--discard` it only
answers 200 (a collector that costs the machine little, for measuring gridlet's side).
`--port N` listens on N (default: any free port); docs/OBSERVABILITY.md uses it as the trace
receiver to try gridlet with.
"""

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

STATE = {"status": 200, "delay": 0.0, "discard": "--discard" in sys.argv}


def any_value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attrs(kvs):
    return {kv.key: any_value(kv.value) for kv in kvs}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        parts = self.path.strip("/").split("/")
        if parts[0] == "control":
            STATE[parts[1]] = float(parts[2]) if parts[1] == "delay" else int(parts[2])
            self.send_response(204)
            self.end_headers()
            return
        if STATE["delay"]:
            time.sleep(STATE["delay"])
        if STATE["status"] != 200:
            self.send_response(STATE["status"])
            self.end_headers()
            return
        if STATE["discard"]:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/v1/metrics":
            self.metrics(body)
            return
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        for rs in req.resource_spans:
            resource = attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    line = {
                        "content_type": self.headers.get("Content-Type"),
                        "auth": self.headers.get("x-test-auth"),
                        "resource": resource,
                        "scope": ss.scope.name,
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "trace_state": s.trace_state,
                        "name": s.name,
                        "kind": s.kind,
                        "start": s.start_time_unix_nano,
                        "end": s.end_time_unix_nano,
                        "attributes": attrs(s.attributes),
                        "links": [{"trace_id": l.trace_id.hex(), "span_id": l.span_id.hex()} for l in s.links],
                        "status_code": s.status.code,
                        "status_message": s.status.message,
                    }
                    print(json.dumps(line), flush=True)
        out = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


    def metrics(self, body):
        """One JSON line per metric: `{"metric": name, "kind", "points": [...]}`."""
        req = ExportMetricsServiceRequest()
        req.ParseFromString(body)
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    data = getattr(m, kind)
                    points = []
                    for p in data.data_points:
                        point = {"attributes": attrs(p.attributes), "start": p.start_time_unix_nano, "time": p.time_unix_nano}
                        if kind == "histogram":
                            point.update(count=p.count, sum=p.sum, buckets=list(p.bucket_counts), bounds=list(p.explicit_bounds))
                        else:
                            point["value"] = p.as_int
                        points.append(point)
                    line = {"metric": m.name, "kind": kind, "unit": m.unit, "description": m.description,
                            "resource": attrs(rm.resource.attributes), "points": points}
                    if kind in ("sum", "histogram"):
                        line["temporality"] = data.aggregation_temporality
                    if kind == "sum":
                        line["monotonic"] = data.is_monotonic
                    print(json.dumps(line), flush=True)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


PORT = int(sys.argv[sys.argv.index("--port") + 1]) if "--port" in sys.argv else 0
server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
print(server.server_address[1], flush=True)
try:
    server.serve_forever()
except KeyboardInterrupt:
    sys.exit(0)
