#!/usr/bin/env bash
# The test command: installs what the tests need, then runs `cargo test` (extra args pass through).
# The IoT Edge tests use a real Mosquitto broker as the MQTT side of edgeHub; the Azure Storage
# tests use Azurite.
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
# The Azure Storage tests use Azurite (the Storage emulator, an npm package), installed once under
# ~/.cache/gridlet/azurite (reruns reuse it; GRIDLET_AZURITE points at another install).
AZURITE_DIR="${HOME}/.cache/gridlet/azurite"
if [ -z "${GRIDLET_AZURITE:-}" ] && [ ! -x "$AZURITE_DIR/node_modules/.bin/azurite" ]; then
  if command -v npm >/dev/null 2>&1; then
    echo "== installing azurite@3.37.0 into $AZURITE_DIR (needed by the Azure Storage tests)"
    mkdir -p "$AZURITE_DIR"
    npm install --prefix "$AZURITE_DIR" --no-audit --no-fund --loglevel=error azurite@3.37.0
  else
    echo "npm is missing: install Node.js 20 and npm (Azurite, the Storage emulator, is an npm package) and rerun" >&2
    exit 1
  fi
fi
exec cargo test "$@"
