#!/usr/bin/env bash
# Supply-chain checks with cargo-deny (deny.toml): licenses, banned crates, sources, and the
# RustSec advisories when a copy of the advisory database is on this machine.
#
#   scripts/deny.sh            install cargo-deny if missing, run the checks
#   scripts/deny.sh --symbols  also show that no function of rustls-webpki 0.102 (pulled by
#                              rumqttc, see deny.toml) is linked into the gridlet binary
#
# The advisory database is a git repository on GitHub, which CI machines cannot reach. Put a
# checkout at $GRIDLET_ADVISORY_DB (or in ~/.cargo/advisory-dbs, where cargo-deny keeps its own) to
# include the advisories; without one the script says that it skipped them.
set -euo pipefail
cd "$(dirname "$0")/.."
DENY_VERSION=0.20.2

if ! cargo deny --version 2>/dev/null | grep -q "$DENY_VERSION"; then
  echo "== installing cargo-deny $DENY_VERSION (once per machine)"
  cargo install --locked --quiet cargo-deny --version "$DENY_VERSION"
fi
cargo fetch --locked --quiet

db_root="$HOME/.cargo/advisory-dbs"
if [ -n "${GRIDLET_ADVISORY_DB:-}" ] && [ -d "$GRIDLET_ADVISORY_DB/crates" ]; then
  mkdir -p "$db_root"
  # cargo-deny looks for the default database under this name (a hash of its URL).
  ln -sfn "$GRIDLET_ADVISORY_DB" "$db_root/advisory-db-3157b0e258782691"
fi
checks=(bans licenses sources)
if [ -d "$db_root/advisory-db-3157b0e258782691/crates" ]; then
  checks+=(advisories)
  echo "== cargo deny: advisories from $(git -C "$db_root/advisory-db-3157b0e258782691" log -1 --format=%cs 2>/dev/null || echo 'a local copy')"
else
  echo "== cargo deny: no advisory database on this machine (no route to it from CI); advisories skipped"
fi
cargo deny --offline check "${checks[@]}"

if [ "${1:-}" = "--symbols" ]; then
  echo "== functions of each rustls-webpki linked into gridlet (v0 symbol mangling names the crate instance)"
  target=target/deny-symbols
  CARGO_TARGET_DIR=$target RUSTFLAGS="-C symbol-mangling-version=v0" CARGO_PROFILE_RELEASE_STRIP=false \
    cargo build --release --locked --quiet --bin gridlet
  # v0 symbols carry the crate's disambiguator: `Cs<hash>_13rustls_webpki`. Map each to a version
  # through the rlib that defines it.
  for rlib in "$target"/release/deps/librustls_webpki-*.rlib; do
    version=$(strings "$rlib" | grep -o 'rustls-webpki-0\.[0-9]*\.[0-9]*' | head -1)
    disamb=$(nm "$rlib" 2>/dev/null | grep -o 'Cs[0-9A-Za-z_]*_13rustls_webpki' | sort | uniq -c | sort -rn | head -1 | awk '{print $2}')
    linked=$(nm "$target/release/gridlet" | grep -c "$disamb" || true)
    echo "$version: $linked functions linked"
  done
fi
