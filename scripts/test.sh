#!/usr/bin/env bash
# The test command: installs what the tests need, then runs `cargo test` (extra args pass through).
# The IoT Edge tests use a real Mosquitto broker as the MQTT side of edgeHub; the Azure Storage
# tests use Azurite.
set -euo pipefail
cd "$(dirname "$0")/.."
# The MQTT tests and walk-throughs also publish and subscribe with its clients (mosquitto_pub,
# mosquitto_sub: Debian's mosquitto-clients).
if { ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; } \
  || ! command -v mosquitto_pub >/dev/null 2>&1 || ! command -v mosquitto_sub >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing mosquitto and its clients (needed by the IoT Edge and MQTT tests)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mosquitto mosquitto-clients
  else
    echo "mosquitto or its clients are missing: install them (e.g. 'sudo apt-get install mosquitto mosquitto-clients') and rerun" >&2
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
# The OpenTelemetry tests decode gridlet's OTLP export with the official protobuf definitions
# and publish with the Azure SDK's tracing on: Python packages from PyPI, installed once into a
# virtualenv under ~/.cache/gridlet/otel-py (GRIDLET_OTEL_PYTHON points at another interpreter).
OTEL_PY_DIR="${HOME}/.cache/gridlet/otel-py"
OTEL_PY_PKGS="opentelemetry-proto==1.45.2 opentelemetry-sdk==1.45.2 azure-core-tracing-opentelemetry==1.0.0b13 azure-eventgrid==4.22.1"
if [ -z "${GRIDLET_OTEL_PYTHON:-}" ] && ! "$OTEL_PY_DIR/bin/python" -c 'import opentelemetry.proto, azure.eventgrid' >/dev/null 2>&1; then
  if command -v python3 >/dev/null 2>&1; then
    echo "== installing $OTEL_PY_PKGS into $OTEL_PY_DIR (needed by the OpenTelemetry tests)"
    python3 -m venv "$OTEL_PY_DIR"
    "$OTEL_PY_DIR/bin/pip" install -q $OTEL_PY_PKGS
  else
    echo "python3 is missing: install Python 3 (with venv) and rerun" >&2
    exit 1
  fi
fi
# The operator console's browser test (tests/it/console.rs) drives Debian's headless Chromium
# with Playwright for Python (pointed at /usr/bin/chromium; Playwright's own browser download is
# never used), installed once into a virtualenv under ~/.cache/gridlet/console-py
# (GRIDLET_CONSOLE_PYTHON points at another interpreter). Where Chromium cannot be installed the
# test says so and is skipped.
if [ ! -x /usr/bin/chromium ] && [ -z "${GRIDLET_CHROMIUM:-}" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing chromium (needed by the console's browser test)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core \
      || echo "chromium could not be installed: the console's browser test will be skipped" >&2
  else
    echo "chromium is missing (apt-get install chromium): the console's browser test will be skipped" >&2
  fi
fi
CONSOLE_PY_DIR="${HOME}/.cache/gridlet/console-py"
CONSOLE_PY_PKGS="playwright==1.65.2"
if [ -z "${GRIDLET_CONSOLE_PYTHON:-}" ] && ! "$CONSOLE_PY_DIR/bin/python" -c 'import playwright' >/dev/null 2>&1; then
  if command -v python3 >/dev/null 2>&1; then
    echo "== installing $CONSOLE_PY_PKGS into $CONSOLE_PY_DIR (needed by the console's browser test)"
    python3 -m venv "$CONSOLE_PY_DIR"
    "$CONSOLE_PY_DIR/bin/pip" install -q $CONSOLE_PY_PKGS
  else
    echo "python3 is missing: install Python 3 (with venv) and rerun" >&2
    exit 1
  fi
fi
# The pull-delivery tests run Microsoft's Event Grid namespaces SDKs: the Python one is
# azure-eventgrid in the virtualenv above; the npm one, @azure/eventgrid-namespaces, is installed
# with `npm ci` from tests/pull/js/package-lock.json into ~/.cache/gridlet/eventgrid-js
# (GRIDLET_EVENTGRID_JS points at another install), again whenever the lock file changes.
EG_JS_DIR="${HOME}/.cache/gridlet/eventgrid-js"
if [ -z "${GRIDLET_EVENTGRID_JS:-}" ] && ! command -v npm >/dev/null 2>&1 \
  && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "== installing nodejs and npm (needed by the pull-delivery SDK tests)"
  apt-get update -qq
  # (Debian 12 ships Node 18; a few of the SDK's dependencies ask for 20 and install with a
  # warning. The machines CI runs on ship Node 20.)
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm
fi
if [ -z "${GRIDLET_EVENTGRID_JS:-}" ] && ! cmp -s tests/pull/js/package-lock.json "$EG_JS_DIR/package-lock.json"; then
  if command -v npm >/dev/null 2>&1; then
    echo "== installing tests/pull/js/package-lock.json into $EG_JS_DIR (needed by the pull-delivery SDK tests)"
    mkdir -p "$EG_JS_DIR"
    cp tests/pull/js/package.json tests/pull/js/package-lock.json "$EG_JS_DIR/"
    (cd "$EG_JS_DIR" && npm ci --no-audit --no-fund --loglevel=error)
  else
    echo "npm is missing: install Node.js 20 and npm (the Event Grid namespaces SDK is an npm package) and rerun" >&2
    exit 1
  fi
fi
exec cargo test "$@"
