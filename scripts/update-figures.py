#!/usr/bin/env python3
"""Writes the measured figures in the README and docs from one recorded gridlet-bench run
and the recorded image build.

A figure in a doc sits between two HTML comments, which Markdown does not show:

    a <!-- figure binary -->7.5 MiB<!-- /figure --> binary

This script replaces what is between them with the figure of that name computed from the
recorded run, `docs/bench-run.json`, which `gridlet-bench --json` writes, and the image sizes in
`docs/images-run.json`, which `scripts/images.sh build` (or `record`, for the images present)
writes:

    cargo build --release --bins
    target/release/gridlet-bench --scenario a,b,c,d,e,footprint,mqtt,outage \
        --outage-events 1000000 --json docs/bench-run.json
    scripts/images.sh build
    python3 scripts/update-figures.py

Footprint figures come from the `footprint` scenario, throughput figures from the rows and
scenario figures of the same run (a, b, c, d, e, mqtt, outage). A doc naming a figure the record
lacks (a scenario left out of the run) is an error, not a blank.

`--check` changes nothing and exits 1 when a doc differs from the record (tests/it/docs.rs runs
it), so a figure cannot drift from the run it claims to come from. `source` is the date, the
machine and its load, to print beside the figures. Sizes are in MiB, as gridlet-bench prints
them.
"""

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "docs" / "bench-run.json"
IMAGES = ROOT / "docs" / "images-run.json"
DOCS = ["README.md", "docs/BENCHMARKS.md", "docs/OBSERVABILITY.md", "docs/CLOUD.md",
        "docs/MQTT.md"]
MARK = re.compile(r"<!-- figure (\w+) -->(.*?)<!-- /figure -->", re.S)


def mib(n):
    return f"{n / 1048576:.1f} MiB"


def figures(run):
    """Every figure a doc may name, as the text it shows."""
    f = {}
    load = run.get("load_at_start", "").split()
    f["source"] = (
        f"gridlet-bench, {run['build']} build, {run['date']}, {run['machine']}"
        + (f", load average {load[0]} at start" if load else "")
    )
    f["date"] = run["date"]
    fp = run["scenarios"].get("footprint")
    if fp:
        f["binary"] = mib(fp["binary_bytes"])
        f["binary_bytes"] = f"{fp['binary_bytes']:,}"
        f["idle_rss"] = mib(fp["idle_rss_bytes"])
        f["start_ms"] = f"{fp['start_ms_median']:.0f} ms"
        f["first_start_ms"] = f"{fp['first_start_ms']:.0f} ms"
    throughput(run, f)
    return f


def eps(x):
    """Events per second as the docs write them: 940, 51k, 1.25M."""
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e4:
        return f"{x / 1e3:.0f}k"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def us(x):
    """Microseconds of CPU per event: 1.4 µs, 32 µs."""
    return f"{x:.1f} µs" if x < 10 else f"{x:.0f} µs"


def ratio(p):
    """A paired ratio and its rounds' spread: `0.39 × (rounds 0.32–0.44)`."""
    return f"{p['ratio']:.2f} × (rounds {p['lowest']:.2f}–{p['highest']:.2f})"


def row(run, prefix):
    return next((r for r in run.get("rows", []) if r["name"].startswith(prefix)), None)


def throughput(run, f):
    """The throughput figures of scenarios a–e, mqtt and outage, where the run has them."""
    for key, prefix in [("a", "a: 1 sub"), ("b", "b: batch 100"), ("c", "c: fan-out 10"),
                        ("d", "d: persisted")]:
        r = row(run, prefix)
        if not r:
            continue
        f[f"{key}_eps"] = f"{eps(r['delivered_eps'])} events/s"
        f[f"{key}_cpu"] = us(r["cpu_us_per_event"])
        if r.get("paired_raw"):
            f[f"{key}_paired"] = ratio(r["paired_raw"])
        if r.get("paired_durable"):
            f[f"{key}_paired_durable"] = ratio(r["paired_durable"])
    for key, prefix in [("a", "a: paced"), ("d", "d: paced")]:
        r = row(run, prefix)
        if r and r.get("latency_us"):
            f[f"{key}_paced_p99"] = f"{r['latency_us']['p99'] / 1e3:.2f} ms"
    if run.get("raw_limit_eps"):
        f["raw_eps"] = f"{eps(run['raw_limit_eps'])} events/s"
    sc = run["scenarios"]
    e = sc.get("e")
    if e:
        f["e_events"] = f"{e['events']:,}"
        f["e_rss"] = mib(e["rss_queued_bytes"])
        f["e_restart"] = f"{e['restart_ms'] / 1e3:.2f} s"
        f["e_drain_eps"] = f"{eps(e['drain_eps'])} events/s"
        f["e_drain_rss"] = mib(e["drain_peak_rss_bytes"])
        f["e_disk_per_event"] = f"{e['disk_bytes'] / e['events']:.0f} bytes"
    m = sc.get("mqtt", {})
    d = m.get("destination")
    if d:
        f["mqtt_out_eps"] = f"{eps(d['gridlet_eps'])} events/s"
        f["mqtt_out_ratio"] = f"{d['ratio']:.2f} ×"
        f["mqtt_out_cpu"] = us(d['cpu_us_per_event'])
    s = m.get("source")
    if s:
        f["mqtt_in_eps"] = f"{eps(s['gridlet_eps'])} events/s"
        f["mqtt_in_raw_eps"] = f"{eps(s['raw_forwarder_eps'])} messages/s"
        f["mqtt_in_ratio"] = ratio({"ratio": s["ratio"], "lowest": s["ratio_lowest"],
                                    "highest": s["ratio_highest"]})
        f["mqtt_in_cpu"] = us(s['cpu_us_per_event'])
        f["mqtt_in_persisted_eps"] = f"{eps(s['persisted_eps'])} events/s"
        f["mqtt_in_durable_eps"] = f"{eps(s['raw_durable_eps'])} events/s"
        f["mqtt_in_persisted_ratio"] = ratio({"ratio": s["persisted_ratio"],
                                              "lowest": s["persisted_ratio_lowest"],
                                              "highest": s["persisted_ratio_highest"]})
        f["mqtt_in_persisted_cpu"] = us(s['persisted_cpu_us_per_event'])
        f["mqtt_rounds"] = f"{s['rounds']} rounds of {s['messages_per_slice']:,} messages"
    o = sc.get("outage")
    if o:
        f["outage_events"] = f"{o['events']:,}"
        f["outage_down"] = o["down"]
        f["outage_probe"] = f"{o['probe_seconds']} s"
        f["outage_first"] = f"{o['first_delivery_s']:.2f} s"
        f["outage_last"] = f"{o['last_delivery_s']:.2f} s"
        f["outage_drain_eps"] = f"{eps(o['drain_eps'])} events/s"
        f["outage_rss"] = mib(o["outage_peak_rss_bytes"])
        f["outage_drain_rss"] = mib(o["drain_peak_rss_bytes"])
        f["outage_disk"] = mib(o["outage_peak_disk_bytes"])
        f["outage_duplicates"] = f"{o['duplicates']:,}"
        f["outage_publish_eps"] = f"{eps(o['publish_eps'])} events/s"


def images(f):
    """Image sizes from `docs/images-run.json` (MB of 10^6 bytes, as podman prints them)."""
    if not IMAGES.exists():
        return
    rec = json.loads(IMAGES.read_text())
    for platform, img in rec["images"].items():
        f[f"image_{platform}"] = f"{img['size_bytes'] / 1e6:.1f} MB"
    f["images_source"] = f"`{rec['command']}` on {rec['date']}"


def render(text, figs, doc):
    def one(m):
        name = m.group(1)
        if name not in figs:
            sys.exit(f"{doc}: figure {name!r} is not in {RECORD.relative_to(ROOT)} "
                     f"(known: {', '.join(sorted(figs))})")
        return f"<!-- figure {name} -->{figs[name]}<!-- /figure -->"

    return MARK.sub(one, text)


def main():
    check = "--check" in sys.argv[1:]
    figs = figures(json.loads(RECORD.read_text()))
    images(figs)
    stale = []
    for doc in DOCS:
        path = ROOT / doc
        text = path.read_text()
        new = render(text, figs, doc)
        if new == text:
            continue
        if check:
            old = dict((m.group(1), m.group(2)) for m in MARK.finditer(text))
            diff = [f"{k}: {old[k]!r} != {figs[k]!r}" for k in old if old[k] != figs[k]]
            stale.append(f"{doc}: " + "; ".join(diff))
        else:
            path.write_text(new)
            print(f"updated {doc}")
    if stale:
        print("figures differ from docs/bench-run.json (run scripts/update-figures.py):")
        print("\n".join(stale))
        sys.exit(1)


if __name__ == "__main__":
    main()
