#!/usr/bin/env bash
# Builds what users install, into dist/ (README.md, "Install"):
#
#   hermes_collector_shim-<V>-cp311-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
#                     the Hermes plugin, one wheel for CPython 3.11 and later
#                     (abi3), checked with `auditwheel show`
#   hermes_collector_shim-<V>.tar.gz
#                     its sdist (builds from source with a Rust toolchain)
#   hermes-collector-<V>-x86_64-unknown-linux-gnu.tar.gz
#                     the collector binary, the example configuration and
#                     its JSON schema; needs glibc >= 2.17 (checked below)
#   SHA256SUMS        `sha256sum -c SHA256SUMS` checks every file above
#
# Usage: deploy/release.sh [TARGET]
#
#   TARGET   a Rust target triple, default x86_64-unknown-linux-gnu (on macOS
#            the host's, e.g. aarch64-apple-darwin). Linux targets are built
#            with zig (PyPI's `ziglang`, through maturin and cargo-zigbuild)
#            against glibc 2.17, whatever the build machine's glibc is; other
#            Linux architectures need `rustup target add TARGET` first.
#            macOS targets use the host's toolchain (Xcode's linker).
#
# Environment:
#   HERMES_RELEASE_DIST   output directory (default <repo>/dist). Files of
#                         the same version and target are replaced; every
#                         file there is listed in SHA256SUMS.
#   HERMES_RELEASE_VENV   venv with the build tools (default
#                         <target dir>/release-venv): maturin, ziglang,
#                         cargo-zigbuild and auditwheel from PyPI, installed
#                         on first use (pinned below).
#   HERMES_RELEASE_LOCK_TIMEOUT  seconds to wait for another release build
#                         (default 3600)
#   CARGO_TARGET_DIR      shared with the other builds (default <repo>/target):
#                         the zig builds go to <target dir>/<TARGET>/release.
#                         CARGO_INCREMENTAL is set to 0.
#
# Parallel callers serialise on "<target dir>/release.lock" (flock). Prints
# every step; the last line is "release: ready <dist>".
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target}"
export CARGO_TARGET_DIR="$TARGET_DIR"
# Release artifacts are never built incrementally, whatever the caller's
# setting (a change of it would also rebuild the workspace's crates).
export CARGO_INCREMENTAL=0
DIST="${HERMES_RELEASE_DIST:-$REPO/dist}"
VENV="${HERMES_RELEASE_VENV:-$TARGET_DIR/release-venv}"
LOCK_TIMEOUT="${HERMES_RELEASE_LOCK_TIMEOUT:-3600}"
PYTHON="${HERMES_RELEASE_PYTHON:-python3}"
# The oldest glibc the Linux artifacts run on: manylinux2014's.
GLIBC="2.17"
# Build tools, pinned: maturin 1.16 links through cargo-zigbuild 0.24's
# wrappers, and this zig is one both know.
TOOLS=("maturin==1.16.0" "ziglang==0.17.1" "cargo-zigbuild==0.24.1" "auditwheel==6.8.2")
TOOLS_SPEC="${TOOLS[*]}"

log() { echo "release: $*"; }
die() {
  echo "release: ERROR: $*" >&2
  exit 1
}

case "$(uname -s)" in
  Darwin) DEFAULT_TARGET="$(uname -m | sed 's/arm64/aarch64/')-apple-darwin" ;;
  *) DEFAULT_TARGET="$(uname -m)-unknown-linux-gnu" ;;
esac
TARGET="${1:-$DEFAULT_TARGET}"
case "$TARGET" in
  *-linux-gnu) KIND=linux ;;
  *-apple-darwin) KIND=macos ;;
  *) die "unsupported target $TARGET (supported: *-unknown-linux-gnu, *-apple-darwin)" ;;
esac

if [[ "$KIND" == linux ]] && ! command -v objdump >/dev/null 2>&1; then
  die "objdump not found: it checks the collector's glibc symbols (apt-get install binutils)"
fi
command -v cargo >/dev/null 2>&1 || die "cargo not found: building a release needs a Rust toolchain (rustup.rs)"

mkdir -p "$TARGET_DIR" "$DIST"
exec 9>"$TARGET_DIR/release.lock"
if ! flock -n 9; then
  log "waiting for $TARGET_DIR/release.lock (at most ${LOCK_TIMEOUT}s)"
  flock -w "$LOCK_TIMEOUT" 9 || die "could not take $TARGET_DIR/release.lock within ${LOCK_TIMEOUT}s"
fi

# 1. The build tools, in a venv of their own (idempotent).
STAMP="$VENV/.hermes-release-tools"
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$TOOLS_SPEC" ]]; then
  log "build tools already installed ($TOOLS_SPEC)"
else
  if [[ ! -x "$VENV/bin/python" ]]; then
    rm -rf "$VENV"
    log "creating venv $VENV with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
  fi
  log "pip install $TOOLS_SPEC"
  "$VENV/bin/python" -m pip --disable-pip-version-check --no-input install -q "${TOOLS[@]}"
  echo "$TOOLS_SPEC" >"$STAMP"
fi
export PATH="$VENV/bin:$PATH"

VERSION="$("$VENV/bin/python" - "$REPO/Cargo.toml" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    print(tomllib.load(f)["workspace"]["package"]["version"])
EOF
)"
log "version $VERSION, target $TARGET"

# The highest GLIBC_x.y symbol version an ELF file needs ("" for none).
glibc_needed() {
  objdump -T "$1" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1
}

# 2. The plugin's wheel (abi3: the pyo3 feature abi3-py311 in
#    agent-shim/Cargo.toml) and sdist.
rm -f "$DIST"/hermes_collector_shim-"$VERSION"-*"$(echo "$TARGET" | cut -d- -f1)"*.whl
wheel_args=(build --release --locked --target "$TARGET" --out "$DIST")
if [[ "$KIND" == linux ]]; then
  wheel_args+=(--zig --compatibility "manylinux_${GLIBC/./_}")
fi
log "maturin ${wheel_args[*]}"
(cd "$REPO/agent-shim" && maturin "${wheel_args[@]}")
log "maturin sdist"
(cd "$REPO/agent-shim" && maturin sdist --out "$DIST")

if [[ "$KIND" == linux ]]; then
  arch="${TARGET%%-*}"
  wheel="$(ls "$DIST"/hermes_collector_shim-"$VERSION"-cp311-abi3-manylinux*"$arch".whl)"
  log "auditwheel show $(basename "$wheel")"
  report="$(auditwheel show "$wheel")"
  echo "$report"
  grep -q "\"manylinux_${GLIBC/./_}_$arch\"" <<<"$report" ||
    die "auditwheel does not find $(basename "$wheel") manylinux_${GLIBC/./_}_$arch compliant (a newer glibc symbol, or a library outside the manylinux policy, was linked)"
fi

# 3. The collector binary, in the `dist` profile (Cargo.toml: the release
#    profile with fat LTO and one codegen unit).
if [[ "$KIND" == linux ]]; then
  log "cargo zigbuild --profile dist --locked -p hermes-collector --target $TARGET.$GLIBC"
  cargo zigbuild --profile dist --locked -p hermes-collector --target "$TARGET.$GLIBC"
else
  log "cargo build --profile dist --locked -p hermes-collector --target $TARGET"
  cargo build --profile dist --locked -p hermes-collector --target "$TARGET"
fi
binary="$TARGET_DIR/$TARGET/dist/hermes-collector"
if [[ "$KIND" == linux ]]; then
  needed="$(glibc_needed "$binary")"
  log "hermes-collector needs glibc $needed"
  [[ "$(printf '%s\n%s\n' "$needed" "$GLIBC" | sort -V | tail -n 1)" == "$GLIBC" ]] ||
    die "hermes-collector needs GLIBC_$needed, above the $GLIBC it promises"
fi
name="hermes-collector-$VERSION-$TARGET"
stage="$TARGET_DIR/release-stage/$name"
rm -rf "$stage"
mkdir -p "$stage"
cp "$binary" "$stage/hermes-collector"
cp "$REPO/config/collector.yaml" "$REPO/config/collector.schema.json" "$stage/"
tar -C "$(dirname "$stage")" -czf "$DIST/$name.tar.gz" "$name"
log "wrote $DIST/$name.tar.gz"

# 4. Checksums of everything in dist/.
(cd "$DIST" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%f\n' | sort |
  xargs sha256sum >SHA256SUMS)
log "SHA256SUMS:"
cat "$DIST/SHA256SUMS"
log "ready $DIST"
