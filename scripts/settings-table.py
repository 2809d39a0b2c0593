#!/usr/bin/env python3
"""Print the README's settings table from src/config.rs (the single source of settings)."""
import re, pathlib
src = pathlib.Path(__file__).resolve().parent.parent.joinpath("src/config.rs").read_text()
block = src[src.index("settings! {"):]
block = block[:block.index("\n}\n")]
print("| Setting | Default | Meaning |")
print("|---|---|---|")
for key, default, doc in re.findall(r'"([^"]+)"\s*=\s*"([^"]*)"\s*:\s*"((?:[^"\\]|\\.)*)";', block):
    print(f"| `{key}` | {('`' + default + '`') if default else '—'} | {doc} |")
