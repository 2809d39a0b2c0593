#!/usr/bin/env bash
# Tracing's cost, interleaved: the same gridlet binary with OpenTelemetry export off, on at
# 100 % sampling, and on with a parent-based 1 % sampler, round after round (off, 100 %, 1 %, off,
# …) so the machine's drift falls on all three alike. Export goes to the bench's own OTLP sink
# (`gridlet-bench --otlp ok`: it reads each request and answers 200 without decoding), so what is
# measured is gridlet's cost. Prints each run's summary rows.
#
#   scripts/bench-otel.sh [ROUNDS] [bench args…]      e.g. scripts/bench-otel.sh 3 --quick --scenario a,b,d
#
# BENCH_OTEL_SIDES (default "off full ratio") picks the sides; add "dead", "slow" or "500" for a
# collector that is not there, answers after 30 s, or refuses every export.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift $(( $# < 1 ? $# : 1 ))
bench=${BENCH:-target/release/gridlet-bench}
[ -x "$bench" ] || cargo build --release --locked --bins
out=${BENCH_OTEL_OUT:-target/bench-otel}
mkdir -p "$out"
for i in $(seq 1 "$rounds"); do
  for side in ${BENCH_OTEL_SIDES:-off full ratio}; do
    echo "== round $i: $side"
    case $side in
      off)   env -u OTEL_TRACES_SAMPLER -u OTEL_TRACES_SAMPLER_ARG "$bench" "$@" ;;
      full)  env -u OTEL_TRACES_SAMPLER -u OTEL_TRACES_SAMPLER_ARG "$bench" --otlp ok "$@" ;;
      ratio) OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0.01 \
               "$bench" --otlp ok "$@" ;;
      dead|slow|500) env -u OTEL_TRACES_SAMPLER -u OTEL_TRACES_SAMPLER_ARG "$bench" --otlp "$side" "$@" ;;
      *) echo "unknown side $side" >&2; exit 2 ;;
    esac > "$out/$side-$i.txt" 2>&1 || { tail -20 "$out/$side-$i.txt"; exit 1; }
    sed -n '/== summary (markdown) ==/,$p' "$out/$side-$i.txt" | grep -E '^\| (a|b|c|d|e):|^total' || true
    grep -E '^otlp sink' "$out/$side-$i.txt" || true
  done
done
echo "full outputs in $out/"
