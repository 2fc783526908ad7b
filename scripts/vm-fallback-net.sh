#!/usr/bin/env bash
# The two-sided Soft-RoCE topology of issue 20's VM acceptance test (RDMA→TCP fallback): side a
# and side b joined by a veth pair, an rxe device on each end, TCP on the same veth, and a rule
# that drops RoCE v2 (UDP port 4791) at side b while TCP goes on.
#
#   host-prep [DIR]   (host, before booting the VM) puts the netfilter modules of the VM's kernel
#                     in DIR (default: cargo's target dir/rxe-vm-extra/kmods); the VM image has
#                     no netfilter modules, and `nft` comes with RXE_VM_EXTRA_PKGS=nftables
#   up                (guest, root) builds the topology; prints the sides' addresses and devices
#   exec a|b CMD...   (guest) runs CMD as side a or b: it sees only its own rxe device
#   drop | undrop     (guest) adds / removes the nft rule dropping UDP 4791 at side b's end
#   down              (guest) removes everything `up` made
#
# Why not two network namespaces, as the issue words it: the VM's kernel (Debian 6.1) has rxe
# without network-namespace support: rxe opens its UDP socket and looks up its routes in the
# initial namespace only. Checked in the VM: rxe devices on veth ends in two namespaces come
# up with their GIDs and ping crosses, but ibv_rc_pingpong between them fails at once (local QP
# operation error). So both veth ends stay in the initial namespace, each with its own address
# (10.78.0.1 on bxa0, 10.78.0.2 on bxb0), and policy routing sends traffic between the two
# addresses over the veth instead of the kernel's local shortcut (rules before the `local`
# table for locally sent packets; accept_local on the veth ends). A side is a view instead of a
# namespace: a private mount namespace whose /dev/infiniband holds only that side's uverbs
# device, so each process finds one RDMA device (without it a link would pick a pair on one
# device, which rxe loops back internally, and never cross the veth).
set -euo pipefail

A_IP=10.78.0.1
B_IP=10.78.0.2
A_NET=bxa0
B_NET=bxb0
A_DEV=bxa
B_DEV=bxb
NFT_TABLE=bx_fallback
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)

die() { echo "vm-fallback-net: $*" >&2; exit 1; }

kmods_dir() {
  if [ -n "${BX_VM_KMODS:-}" ]; then echo "$BX_VM_KMODS"; return; fi
  local target
  target=$(cd "$repo" && cargo metadata --format-version 1 --no-deps 2>/dev/null \
    | python3 -c 'import sys,json; print(json.load(sys.stdin)["target_directory"])' 2>/dev/null) \
    || target=$repo/target
  echo "$target/rxe-vm-extra/kmods"
}

# Modules nft needs, in load order (crc32c for libcrc32c, which nf_tables needs).
KMODS="crc32c_generic libcrc32c nfnetlink nf_tables"

host_prep() {
  local out=${1:-$(kmods_dir)} kv tmp m f
  kv=$(apt-cache depends linux-image-amd64 2>/dev/null \
       | awk '/Depends: linux-image-[0-9]/{sub("linux-image-","",$2); print $2; exit}')
  [ -n "$kv" ] || die "cannot resolve the VM's kernel (apt-cache depends linux-image-amd64)"
  if [ -f "$out/.kernel" ] && [ "$(cat "$out/.kernel")" = "$kv" ]; then
    echo "vm-fallback-net: netfilter modules for $kv already in $out"; return
  fi
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  (cd "$tmp" && timeout 600 apt-get -q -o APT::Sandbox::User=root download "linux-image-$kv" >/dev/null) \
    || die "apt-get download linux-image-$kv failed"
  dpkg -x "$tmp"/linux-image-*.deb "$tmp/root"
  mkdir -p "$out"
  for m in $KMODS; do
    f=$(find "$tmp/root/lib/modules/$kv" -name "$m.ko*" | head -n1)
    [ -n "$f" ] || die "module $m not in linux-image-$kv"
    cp "$f" "$out/"
  done
  echo "$kv" >"$out/.kernel"
  echo "vm-fallback-net: netfilter modules for $kv in $out"
}

# GID index of device $1 holding IPv4 address $2 (IPv4-mapped RoCE v2 entry); waits up to 10 s.
gid_index() {
  local hex g v i
  hex=$(printf '%02x%02x:%02x%02x' ${2//./ })
  for i in $(seq 100); do
    for g in $(seq 0 15); do
      read -r v </sys/class/infiniband/$1/ports/1/gids/$g 2>/dev/null || continue
      case "$v" in *":ffff:$hex") echo "$g"; return 0;; esac
    done
    sleep 0.1
  done
  return 1
}

load_nft() {
  command -v nft >/dev/null || die "nft missing: boot the VM with RXE_VM_EXTRA_PKGS=nftables"
  nft list tables >/dev/null 2>&1 && return
  local dir m
  dir=$(kmods_dir)
  for m in $KMODS; do
    grep -q "^$m " /proc/modules && continue
    [ -f "$dir/$m.ko" ] || die "$dir/$m.ko missing: run '$0 host-prep' on the host first"
    insmod "$dir/$m.ko"
  done
  nft list tables >/dev/null || die "nft does not work after loading the modules"
}

up() {
  [ "$(id -u)" = 0 ] || die "up needs root"
  load_nft
  ip link add "$A_NET" type veth peer name "$B_NET"
  ip addr add "$A_IP/24" dev "$A_NET"
  ip addr add "$B_IP/24" dev "$B_NET"
  ip link set "$A_NET" up
  ip link set "$B_NET" up
  # Packets between the two local addresses arrive with a local source address.
  echo 0 >/proc/sys/net/ipv4/conf/all/rp_filter
  for d in "$A_NET" "$B_NET"; do
    echo 1 >"/proc/sys/net/ipv4/conf/$d/accept_local"
    echo 0 >"/proc/sys/net/ipv4/conf/$d/rp_filter"
  done
  # Locally sent packets to one side's address leave by the other side's end of the veth;
  # what arrives on an end is delivered locally (the `local` table, moved after these rules).
  ip rule add pref 100 to "$B_IP" iif lo lookup 100
  ip rule add pref 101 to "$A_IP" iif lo lookup 101
  ip route add "$B_IP" dev "$A_NET" src "$A_IP" table 100
  ip route add "$A_IP" dev "$B_NET" src "$B_IP" table 101
  ip rule add pref 1000 lookup local
  ip rule del pref 0 lookup local
  rdma link add "$A_DEV" type rxe netdev "$A_NET"
  rdma link add "$B_DEV" type rxe netdev "$B_NET"
  local ga gb
  ga=$(gid_index "$A_DEV" "$A_IP") || die "no IPv4 GID on $A_DEV"
  gb=$(gid_index "$B_DEV" "$B_IP") || die "no IPv4 GID on $B_DEV"
  echo "side a: $A_IP dev $A_DEV gid $ga netdev $A_NET"
  echo "side b: $B_IP dev $B_DEV gid $gb netdev $B_NET"
}

down() {
  nft delete table inet "$NFT_TABLE" 2>/dev/null || true
  rdma link delete "$A_DEV" 2>/dev/null || true
  rdma link delete "$B_DEV" 2>/dev/null || true
  ip rule add pref 0 lookup local 2>/dev/null || true
  ip rule del pref 1000 lookup local 2>/dev/null || true
  ip rule del pref 100 2>/dev/null || true
  ip rule del pref 101 2>/dev/null || true
  ip link delete "$A_NET" 2>/dev/null || true
}

# /dev/infiniband/uverbsN of device $1.
uverbs_of() {
  local d
  for d in /sys/class/infiniband_verbs/uverbs*; do
    [ "$(cat "$d/ibdev" 2>/dev/null)" = "$1" ] && { basename "$d"; return 0; }
  done
  return 1
}

exec_side() {
  local side=$1 dev uv
  shift
  case "$side" in a) dev=$A_DEV;; b) dev=$B_DEV;; *) die "side a or b, not $side";; esac
  [ $# -gt 0 ] || die "exec $side: no command"
  uv=$(uverbs_of "$dev") || die "no uverbs device for $dev (run up first)"
  # A private mount namespace whose /dev/infiniband holds this side's device only (and
  # rdma_cm): libibverbs lists only devices whose char device it finds.
  exec unshare -m bash -c '
    set -e
    uv=$1; shift
    keep=$(mktemp -d)
    for f in /dev/infiniband/$uv /dev/infiniband/rdma_cm; do
      if [ -e "$f" ]; then cp -a "$f" "$keep/"; fi
    done
    mount --make-rprivate / 2>/dev/null || true
    mount -t tmpfs tmpfs /dev/infiniband
    cp -a "$keep/." /dev/infiniband/
    rm -rf "$keep"
    exec "$@"' side "$uv" "$@"
}

drop() {
  load_nft
  nft add table inet "$NFT_TABLE"
  # On input only: RoCE that reaches side b's end is lost (so b's peer retries and fails
  # with RETRY_EXC_ERR, and b, whose packets still reach a, never sees a's ACKs: the same).
  # Not on output: rxe (6.1) takes a packet the output hook drops for a full queue
  # (-EAGAIN) and re-sends it at once, forever, without failing the QP.
  nft add chain inet "$NFT_TABLE" in '{ type filter hook input priority 0; policy accept; }'
  nft add rule inet "$NFT_TABLE" in iifname "$B_NET" udp dport 4791 counter drop
}

undrop() {
  nft delete table inet "$NFT_TABLE"
}

case "${1:-}" in
  host-prep) shift; host_prep "$@";;
  up) up;;
  down) down;;
  exec) shift; exec_side "$@";;
  drop) drop;;
  undrop) undrop;;
  counters) nft list table inet "$NFT_TABLE";;
  *) sed -n '2,15p' "$0" >&2; exit 2;;
esac
