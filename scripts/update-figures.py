#!/usr/bin/env python3
"""Writes the measured figures in the README and docs from one recorded gridlet-bench run.

A figure in a doc sits between two HTML comments, which Markdown does not show:

    a <!-- figure binary -->7.5 MiB<!-- /figure --> binary

This script replaces what is between them with the figure of that name computed from the
recorded run, `docs/bench-run.json`, which `gridlet-bench --json` writes:

    cargo build --release --bins
    target/release/gridlet-bench --scenario footprint --json docs/bench-run.json
    python3 scripts/update-figures.py

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
DOCS = ["README.md", "docs/BENCHMARKS.md", "docs/OBSERVABILITY.md"]
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
    return f


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
