#!/usr/bin/env bash
# Runs the repository's compose.yaml as a user on a plain Linux box would, with podman-compose,
# and checks what its comments promise. Called by `scripts/images.sh compose` (and `all`), which
# sets CONTAINERS_CONF (runc, rlimits this sandbox allows) and PODMAN_BUILD_ARGS.
#
#   1. `podman-compose build`: gridlet from Dockerfile.amd64, the subscriber from
#      examples/subscriber (timed, sizes reported);
#   2. `up -d`; /healthz on the published HTTP port (127.0.0.1, a free port via GRIDLET_HTTP_PORT);
#   3. a topic and a subscription whose endpoint is http://subscriber:8080/events (the service
#      name, resolved by the compose network's DNS); an event published with curl shows up in
#      `podman-compose logs subscriber`;
#   4. `down -t 10` keeps the named volumes: after `up -d` the subscription is back and a second
#      event is delivered;
#   5. `down -v` and the network removed, also when a step fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
PROJECT=gridletci   # not the file's `name: gridlet`: a user's own stack on this host is left alone
PC=(podman-compose -p "$PROJECT" -f compose.yaml)
V='api-version=2019-01-01-preview'
REPORT=${REPORT:-target/images-report.md}
LOGS=target/compose
mkdir -p "$LOGS"

log() { echo "== compose: $*"; }
fail() {
    echo "compose: FAILED: $*" >&2
    "${PC[@]}" logs > "$LOGS/containers.log" 2>&1 || true
    tail -40 "$LOGS/containers.log" >&2 || true
    exit 1
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cleanup() {
    "${PC[@]}" down -v -t 10 > "$LOGS/down.log" 2>&1 || true
    podman network rm -f "${PROJECT}_default" > /dev/null 2>&1 || true
}

GRIDLET_HTTP_PORT=$(free_port)
GRIDLET_HTTPS_PORT=$(free_port)
export GRIDLET_HTTP_PORT GRIDLET_HTTPS_PORT
B="http://127.0.0.1:$GRIDLET_HTTP_PORT"

# api METHOD PATH [BODY]: the HTTP status; the response body goes to $LOGS/last-response.
api() {
    curl -sS -o "$LOGS/last-response" -w '%{http_code}' -X "$1" -H 'Content-Type: application/json' \
        "$B$2?$V" ${3:+-d "$3"} || true
}
wait_healthy() {
    for _ in $(seq 1 150); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$B/healthz" || true)" = 200 ] && return
        sleep 0.2
    done
    fail "gridlet did not answer /healthz on $B within 30 s"
}
# wait_delivered ID: the subscriber's log shows the event within 20 s.
wait_delivered() {
    local out
    for _ in $(seq 1 100); do
        # Read the whole log first: `logs | grep -q` under pipefail fails when grep stops early.
        out=$("${PC[@]}" logs subscriber 2>/dev/null || true)
        if grep -F "\"id\":\"$1\"" <<< "$out" | sed 's/^/   /'; then
            return
        fi
        sleep 0.2
    done
    fail "event $1 not in the subscriber's log within 20 s"
}
publish() {
    local status
    status=$(api POST /topics/t1/events "[{\"id\":\"$1\",\"eventType\":\"recordInserted\",\"subject\":\"a/b\",\"eventTime\":\"2026-11-24T10:00:00Z\",\"data\":{\"make\":\"Ducati\"},\"dataVersion\":\"1.0\"}]")
    [ "$status" = 200 ] || fail "publish $1: $status $(cat "$LOGS/last-response")"
}

trap cleanup EXIT
cleanup   # whatever an interrupted run left
begin=$(date +%s)

start=$(date +%s)
"${PC[@]}" --podman-build-args "${PODMAN_BUILD_ARGS:-}" build > "$LOGS/build.log" 2>&1 \
    || { tail -30 "$LOGS/build.log"; fail "podman-compose build"; }
build_s=$(( $(date +%s) - start ))
size() { podman image inspect "$1" --format '{{.Size}}' | awk '{printf "%.1f MB", $1/1e6}'; }
log "podman-compose build: $build_s s (gridlet:amd64 $(size gridlet:amd64), gridlet-sample-subscriber $(size gridlet-sample-subscriber:latest))"
echo "| compose.yaml (gridlet + subscriber) | podman-compose build | $build_s s | $(size gridlet:amd64) + $(size gridlet-sample-subscriber:latest) |" >> "$REPORT"

start=$(date +%s)
"${PC[@]}" up -d > "$LOGS/up.log" 2>&1 || { cat "$LOGS/up.log"; fail "podman-compose up -d"; }
wait_healthy
log "up -d to /healthz 200: $(( $(date +%s) - start )) s (HTTP on $B)"

[ "$(api PUT /topics/t1 '{"properties":{"inputSchema":"EventGridSchema"}}')" = 200 ] \
    || fail "PUT topic: $(cat "$LOGS/last-response")"
[ "$(api PUT /topics/t1/eventSubscriptions/s1 '{"properties":{"destination":{"endpointType":"WebHook","properties":{"endpointUrl":"http://subscriber:8080/events"}}}}')" = 200 ] \
    || fail "PUT subscription: $(cat "$LOGS/last-response")"
id1="compose-$RANDOM-1"
publish "$id1"
wait_delivered "$id1"
log "event $id1 delivered to http://subscriber:8080/events (container-name DNS)"

start=$(date +%s)
"${PC[@]}" down -t 10 > "$LOGS/down-keep.log" 2>&1 || fail "podman-compose down -t 10"
log "down -t 10 (SIGTERM, volumes kept): $(( $(date +%s) - start )) s"
"${PC[@]}" up -d > "$LOGS/up2.log" 2>&1 || { cat "$LOGS/up2.log"; fail "second podman-compose up -d"; }
wait_healthy
if [ "$(api GET /topics/t1/eventSubscriptions/s1)" != 200 ] || ! grep -q 'subscriber:8080' "$LOGS/last-response"; then
    fail "the subscription did not survive down/up on the named volumes: $(cat "$LOGS/last-response")"
fi
id2="compose-$RANDOM-2"
publish "$id2"
wait_delivered "$id2"
log "down/up kept the topic and subscription (named volumes); event $id2 delivered"
log "passed in $(( $(date +%s) - begin )) s"
