#!/usr/bin/env bash
# Create (idempotently) the Python venv holding the Arize Phoenix server that
# tests/tests/backend_phoenix.rs exports to.
#
#   venv:   ${HERMES_E2E_PHOENIX_VENV:-<repo>/target/phoenix-venv}
#   pkgs:   arize-phoenix==20.26.1, from PyPI
#
# Environment:
#   HERMES_E2E_PHOENIX_VENV    venv path (default <repo>/target/phoenix-venv)
#   HERMES_E2E_PYTHON          interpreter that creates the venv (default python3)
#   HERMES_E2E_LOCK_TIMEOUT    seconds to wait for the lock (default 1800)
#
# Parallel callers serialise on "$VENV.lock" (flock); a stamp file records
# the installed spec, so a second run with the same pin does nothing.
# Prints "setup_phoenix: ready <venv>" at the end.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HERMES_E2E_PHOENIX_VENV:-$REPO/target/phoenix-venv}"
PYTHON="${HERMES_E2E_PYTHON:-python3}"
REQS=("arize-phoenix==20.26.1")
SPEC="${REQS[*]}"
LOCK_TIMEOUT="${HERMES_E2E_LOCK_TIMEOUT:-1800}"

log() { echo "setup_phoenix: $*"; }
# shellcheck source=tests/lib.sh
source "$REPO/tests/lib.sh"

venv_lock "$VENV"

STAMP="$VENV/.hermes-e2e-phoenix"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check --no-input)

if [[ -x "$VENV/bin/python" && -x "$VENV/bin/phoenix" && -f "$STAMP" && "$(cat "$STAMP")" == "$SPEC" ]]; then
  log "already installed ($SPEC)"
else
  venv_create "$VENV" "$PYTHON"
  rm -f "$STAMP"
  log "pip install $SPEC (quiet; a few minutes the first time)"
  "${PIP[@]}" install -q "${REQS[@]}"
  if [[ ! -x "$VENV/bin/phoenix" ]]; then
    log "ERROR: $VENV/bin/phoenix missing after the install"
    exit 1
  fi
  echo "$SPEC" >"$STAMP"
fi

log "installed arize-phoenix $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("arize-phoenix"))')"
log "ready $VENV"
