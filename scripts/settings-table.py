#!/usr/bin/env python3
"""Print the README's settings table from src/config/settings.rs (the single source of settings)."""
import re, pathlib
src = pathlib.Path(__file__).resolve().parent.parent.joinpath("src/config/settings.rs").read_text()
block = src[src.index("settings! {"):]
block = block[:block.index("\n}\n")]
print("| Setting | Default | Meaning |")
print("|---|---|---|")
for key, default, doc in re.findall(r'^\s*(\w+)\s*=\s*"([^"]*)"\s*:\s*"((?:[^"\\]|\\.)*)";', block, re.M):
    print(f"| `{key}` | {('`' + default + '`') if default else '—'} | {doc} |")
