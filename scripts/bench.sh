#!/usr/bin/env bash
# The benchmark command: installs the peer the `store` scenario measures beside gridlet (NATS
# JetStream's file store, Debian's `nats-server`) if missing, builds the release binaries, then
# runs gridlet-bench with the arguments given (e.g. `scripts/bench.sh --scenario store --quick`).
# Without nats-server the bench still runs and prints "peer skipped".
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nats-server >/dev/null 2>&1 && [ ! -x /usr/sbin/nats-server ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing nats-server (the store scenario's peer)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nats-server
  else
    echo "nats-server is missing (the store scenario's peer): 'sudo apt-get install nats-server'; running without it" >&2
  fi
fi
cargo build --release --locked --bins
exec target/release/gridlet-bench "$@"
