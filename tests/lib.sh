#!/usr/bin/env bash
# Shared by tests/setup_venv.sh and tests/setup_phoenix.sh (sourced, never
# run): the lock that serialises parallel callers on one venv, and the venv
# itself, made again when it is broken. Each caller defines `log` first.

# Takes "$1.lock" (flock on fd 9, held until the caller exits), waiting at
# most $LOCK_TIMEOUT seconds (default 1800); exits 1 if it cannot.
venv_lock() {
  local venv="$1" timeout="${LOCK_TIMEOUT:-1800}"
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  if ! flock -n 9; then
    log "waiting for lock $venv.lock (at most ${timeout}s)"
  fi
  if ! flock -w "$timeout" 9; then
    log "ERROR: could not take $venv.lock within ${timeout}s"
    exit 1
  fi
}

# Makes sure "$1" is a venv created by the interpreter "$2": removes one
# without a working python, creates it if missing.
venv_create() {
  local venv="$1" python="$2"
  if [[ -e "$venv" && ! -x "$venv/bin/python" ]]; then
    log "removing broken venv $venv"
    rm -rf "$venv"
  fi
  if [[ ! -x "$venv/bin/python" ]]; then
    log "creating venv $venv with $("$python" --version 2>&1)"
    "$python" -m venv "$venv"
  fi
}
