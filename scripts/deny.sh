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
  # v0 symbols carry the crate instance's disambiguator (`Cs<hash>_6webpki`, rustls-webpki's lib
  # name is `webpki`); the dep-info file next to each rlib says which version it was built from.
  for dep in "$target"/release/deps/webpki-*.d; do
    version=$(head -1 "$dep" | grep -o 'rustls-webpki-0\.[0-9]*\.[0-9]*' | head -1)
    rlib="$target/release/deps/lib$(basename "${dep%.d}").rlib"
    disamb=$(nm "$rlib" 2>/dev/null | grep -oE 'Cs[0-9A-Za-z_]+_6webpki' | sort | uniq -c | sort -rn | head -1 | awk '{print $2}')
    echo "-- $version: symbols of this crate instance in target/deny-symbols/release/gridlet"
    syms=$(nm "$target/release/gridlet" | awk '{print $NF}' | grep -F "$disamb" | c++filt)
    echo "   $(printf "%s\n" "$syms" | grep -c .) functions, e.g.:"
    printf "%s\n" "$syms" | head -4 | cut -c1-160 | sed "s/^/   /"
  done
fi
