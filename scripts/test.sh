#!/usr/bin/env bash
# The test command: installs what the tests need, then runs `cargo test` (extra args pass through).
# The IoT Edge tests use a real Mosquitto broker as the MQTT side of edgeHub.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing mosquitto (needed by the IoT Edge tests)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mosquitto
  else
    echo "mosquitto is missing: install it (e.g. 'sudo apt-get install mosquitto') and rerun" >&2
    exit 1
  fi
fi
exec cargo test "$@"
