#!/usr/bin/env bash
# Before/after comparison of two gridlet binaries with one bench binary, interleaved (A B A B …)
# so the machine's drift falls on both alike. Prints each run's summary table.
#
#   scripts/bench-ab.sh OLD_GRIDLET NEW_GRIDLET [ROUNDS] [bench args…]
#
# e.g. build the old commit in a worktree (`git worktree add ../old <rev> && cargo build
# --release --bins` there), then `scripts/bench-ab.sh ../old/target/release/gridlet
# target/release/gridlet 2 --scenario a,b,c,d,e`.
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1 new=$2 rounds=${3:-2}
shift $(( $# < 3 ? $# : 3 ))
bench=target/release/gridlet-bench
[ -x "$bench" ] || cargo build --release --locked --bin gridlet-bench
# The store scenario's peer (NATS JetStream): scripts/bench.sh installs it the same way.
if ! command -v nats-server >/dev/null 2>&1 && [ ! -x /usr/sbin/nats-server ] \
  && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nats-server
fi
out=${BENCH_AB_OUT:-target/bench-ab}
mkdir -p "$out"
for i in $(seq 1 "$rounds"); do
  for side in old new; do
    bin=$old; [ "$side" = new ] && bin=$new
    echo "== round $i: $side ($bin)"
    "$bench" --gridlet "$bin" "$@" > "$out/$side-$i.txt" 2>&1 || { tail -20 "$out/$side-$i.txt"; exit 1; }
    sed -n '/== summary (markdown) ==/,$p' "$out/$side-$i.txt" | grep -E '^\| (a|b|c|d|e):|^\| \((e)\)|^\| store:|^\| idle|^\| release|^total' || true
  done
done
echo "full outputs in $out/"
