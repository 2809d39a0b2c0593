#!/usr/bin/env python3
"""Rewrite the README's settings table from src/config/settings.rs (run after adding a setting)."""
import pathlib, subprocess, sys
root = pathlib.Path(__file__).resolve().parent.parent
table = subprocess.run([sys.executable, str(root / "scripts/settings-table.py")], capture_output=True, text=True, check=True).stdout
readme = (root / "README.md").read_text()
start = readme.index("| Setting | Default | Meaning |")
end = readme.index("\n\n", start)
(root / "README.md").write_text(readme[:start] + table.rstrip("\n") + readme[end:])
