#!/usr/bin/env bash
# Runs a command inside a throw-away QEMU guest that boots Debian's stock
# kernel with Soft-RoCE (rdma_rxe), so loom's verbs code meets a real verbs
# stack on machines without RDMA hardware or rdma kernel modules.
#
#   guest.sh [--cache DIR] [--timeout SECONDS] -- COMMAND...
#
# The guest's root is this machine's own root, read-only over virtio-9p
# under a tmpfs overlay: everything built or installed here runs there
# unchanged. It has no NIC (no packet leaves it); a dummy interface carries
# one rxe device (rxe0, port 1, link-local RoCE v2 GID at index 0), and
# loom's bootstrap runs over 127.0.0.1. COMMAND runs under bash as root, in
# the current directory, which is shared read-write at the same path (so
# results written there come back). Its output is streamed here.
#
# Exit status: COMMAND's; 124 when it ran out of time; 125 when the guest
# could not be set up (its console and setup log are printed); 77 when this
# machine cannot run a guest at all (not root), with the reason.
#
# Environment: LOOM_RDMA_CACHE (default /var/tmp/loom-rdma-guest; the kernel
# and initramfs, ~300 MB, made once), LOOM_RDMA_SMP (2; never more than the
# host's cores under TCG), LOOM_RDMA_MEM (2G), LOOM_RDMA_MTU (1500; 9000
# gives rxe an active MTU of 4096), LOOM_RDMA_KERNEL (a linux-image package
# to pin), LOOM_RDMA_VERBOSE=1 (the whole console).
set -euo pipefail

cache="${LOOM_RDMA_CACHE:-/var/tmp/loom-rdma-guest}"
timeout_s=900
while [ $# -gt 0 ]; do
  case "$1" in
    --cache) cache="$2"; shift 2 ;;
    --timeout) timeout_s="$2"; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: guest.sh [--cache DIR] [--timeout S] -- COMMAND..." >&2; exit 2; }
command_text="$*"
share="$(pwd)"
say() { echo "rdma-guest: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  say "skipped: needs root (apt-get for qemu and the guest kernel, 9p passthrough of /)"
  exit 77
fi
[ "$share" != / ] || { say "run it from a folder other than /"; exit 2; }
smp="${LOOM_RDMA_SMP:-$(( $(nproc) < 2 ? $(nproc) : 2 ))}"
mem="${LOOM_RDMA_MEM:-2G}"
mtu="${LOOM_RDMA_MTU:-1500}"
mkdir -p "$cache"
started=$(date +%s)

# ---- host packages --------------------------------------------------------------
packages=(qemu-system-x86 busybox-static kmod cpio xz-utils iproute2 ibverbs-providers)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get install -y -qq --no-install-recommends "${missing[@]}" ||
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; }; } \
    >"$cache/apt.log" 2>&1 || { say "apt-get failed:"; tail -20 "$cache/apt.log" >&2; exit 125; }
fi

# ---- the guest image (kernel, modules, initramfs), made once ----------------------
image_format=2
image="$cache/image"
make_image() {
  local pkg="${LOOM_RDMA_KERNEL:-}"
  if [ -z "$pkg" ]; then
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/.*Depends: \(linux-image-[0-9][^ ]*\).*/\1/p' | head -1)
    if [ -z "$pkg" ]; then
      apt-get update -qq >>"$cache/apt.log" 2>&1 || true
      pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/.*Depends: \(linux-image-[0-9][^ ]*\).*/\1/p' | head -1)
    fi
  fi
  [ -n "$pkg" ] || { say "cannot tell which kernel package linux-image-amd64 means"; return 1; }
  say "making the guest image from $pkg (once)"
  local work="$cache/image.new"
  rm -rf "$work"
  mkdir -p "$work/download" "$work/initrd/bin" "$work/initrd/modules"
  ( cd "$work/download" && apt-get download -o APT::Sandbox::User=root "$pkg" ) >>"$cache/apt.log" 2>&1 ||
    { apt-get update -qq >>"$cache/apt.log" 2>&1; ( cd "$work/download" && apt-get download -o APT::Sandbox::User=root "$pkg" ) >>"$cache/apt.log" 2>&1; } ||
    { say "cannot download $pkg"; return 1; }
  dpkg-deb -x "$work"/download/*.deb "$work/root"
  rm -rf "$work/download"
  local kver
  kver=$(ls "$work/root/lib/modules")
  # What a headless guest never loads: smaller cache, faster 9p lookups.
  local k="$work/root/lib/modules/$kver/kernel"
  rm -rf "$k/sound" "$k/drivers/gpu" "$k/drivers/media" "$k/drivers/net/wireless" "$k/drivers/staging" \
         "$k/drivers/bluetooth" "$k/drivers/iio" "$k/drivers/input"
  depmod -b "$work/root" "$kver"
  cp "$work/root/boot/vmlinuz-$kver" "$work/vmlinuz"
  # The uncompressed kernel boots through its PVH entry, skipping a slow
  # decompression under emulation; the xz stream starts at its magic.
  local at
  at=$(LC_ALL=C grep -abo $'\xfd7zXZ' "$work/vmlinuz" | head -1 | cut -d: -f1 || true)
  if [ -n "$at" ]; then tail -c +"$((at + 1))" "$work/vmlinuz" | xz -dc >"$work/vmlinux" 2>/dev/null || true; fi
  [ "$(head -c 4 "$work/vmlinux" 2>/dev/null | od -An -tx1 | tr -d ' ')" = 7f454c46 ] || rm -f "$work/vmlinux"
  # The initramfs: busybox and the modules that mount the 9p shares.
  for m in virtio_pci 9pnet_virtio 9p overlay; do
    modprobe -d "$work/root" -S "$kver" --show-depends "$m"
  done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }' >"$work/modules.txt"
  while read -r f; do
    cp "$f" "$work/initrd/modules/"
    basename "$f" >>"$work/initrd/modules/order"
  done <"$work/modules.txt"
  cp /bin/busybox "$work/initrd/bin/busybox"
  cat >"$work/initrd/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc && mount -t sysfs sysfs /sys && mount -t devtmpfs devtmpfs /dev
fail() { echo "@@LOOM-GUEST-FAILED@@ initramfs: $*"; poweroff -f; }
for m in $(cat /modules/order); do insmod "/modules/$m" || fail "insmod $m"; done
o=trans=virtio,version=9p2000.L,msize=512000
mkdir -p /lower /upper /root
mount -t 9p -o "$o,cache=loose,ro" hostroot /lower || fail "mount the host root"
mount -t tmpfs -o mode=755 tmpfs /upper && mkdir -p /upper/data /upper/work
mount -t overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work overlay /root || fail "overlay"
# /tmp stays the overlay's (the host's, written in RAM): a checkout or a
# build under /tmp must be visible in the guest too.
mkdir -p /root/var/tmp && mount -t tmpfs -o mode=1777 tmpfs /root/var/tmp
mount -t tmpfs -o mode=755 tmpfs /root/run
mkdir -p /root/run/loom-guest /root/lib/modules
mount -t 9p -o "$o,cache=none" control /root/run/loom-guest || fail "mount the control folder"
mount -t 9p -o "$o,cache=loose,ro" modules /root/lib/modules || fail "mount the modules"
share=$(cat /root/run/loom-guest/share)
mkdir -p "/root$share"
mount -t 9p -o "$o,cache=mmap" share "/root$share" || fail "mount $share"
cp /bin/busybox /root/run/loom-guest-busybox
for d in proc sys dev; do mount --move "/$d" "/root/$d"; done
exec switch_root /root /bin/sh /run/loom-guest/stage2.sh
INIT
  chmod +x "$work/initrd/init"
  mkdir -p "$work/initrd/proc" "$work/initrd/sys" "$work/initrd/dev"
  ( cd "$work/initrd" && find . | cpio -o -H newc 2>/dev/null | gzip -1 ) >"$work/initrd.gz"
  rm -rf "$work/initrd" "$work/modules.txt" "$work/root/boot"
  echo "$image_format" >"$work/format"
  rm -rf "$image"
  mv "$work" "$image"
}
exec 9>"$cache/.lock"
flock 9
if [ "$(cat "$image/format" 2>/dev/null)" != "$image_format" ]; then
  make_image || { say "could not make the guest image (see $cache/apt.log)"; exit 125; }
fi
flock -u 9

# ---- one run --------------------------------------------------------------------
run=$(mktemp -d "$cache/run.XXXXXX")
cleanup() { [ -n "${qemu_pid:-}" ] && kill "$qemu_pid" 2>/dev/null; rm -rf "$run"; }
trap cleanup EXIT
printf '%s\n' "$share" >"$run/share"
printf '%s\n' "$command_text" >"$run/command.sh"
{
  printf 'export LOOM_GUEST_SHARE=%q LOOM_GUEST_MTU=%q LOOM_GUEST_TIMEOUT=%q LOOM_GUEST_VERBOSE=%q\n' \
    "$share" "$mtu" "$timeout_s" "${LOOM_RDMA_VERBOSE:-0}"
} >"$run/env"
cat >"$run/stage2.sh" <<'STAGE2'
# PID 1 of the guest, under the host's /bin/sh.
bb=/run/loom-guest-busybox
c=/run/loom-guest
. $c/env
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 TERM=dumb
halt() { sync; $bb poweroff -f; }
fail() { echo "@@LOOM-GUEST-FAILED@@ $*"; cat $c/setup.log 2>/dev/null; echo 125 >$c/status; halt; }
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
$bb stty -onlcr 2>/dev/null
$bb hostname loom-rdma-guest
ulimit -l unlimited
{
  ip link set lo up &&
  modprobe dummy numdummies=0 &&
  ip link add dummy0 type dummy &&
  ip link set dummy0 mtu "$LOOM_GUEST_MTU" &&
  ip link set dummy0 up &&
  modprobe rdma_rxe &&
  rdma link add rxe0 type rxe netdev dummy0
} >$c/setup.log 2>&1 || fail "setting up rxe0"
# The port turns ACTIVE and its link-local GID appears a little later.
tries=0
until grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null &&
      grep -q '^fe80:' /sys/class/infiniband/rxe0/ports/1/gids/0 2>/dev/null; do
  tries=$((tries + 1))
  [ $tries -le 300 ] || fail "rxe0 never became ACTIVE with a GID"
  $bb usleep 100000
done
[ "$LOOM_GUEST_VERBOSE" = 1 ] || dmesg -n 1
cut -d' ' -f1 /proc/uptime >$c/ready-at
echo "@@LOOM-GUEST-BEGIN@@"
cd "$LOOM_GUEST_SHARE" || fail "cd $LOOM_GUEST_SHARE"
timeout -k 10 "$LOOM_GUEST_TIMEOUT" bash $c/command.sh </dev/null
echo $? >$c/status
echo "@@LOOM-GUEST-END@@"
dmesg >$c/dmesg.log 2>&1
halt
STAGE2

if [ -f "$image/vmlinux" ] && [ -f /usr/share/qemu/qboot.rom ]; then
  kernel=(-kernel "$image/vmlinux" -bios /usr/share/qemu/qboot.rom)
else
  kernel=(-kernel "$image/vmlinuz")
fi
share9p() { echo "local,path=$1,mount_tag=$2,security_model=none$3"; }
# TCG, not KVM: the KVM on our machines is PVM, which a stock kernel cannot
# use; TCG boots the guest in seconds.
timeout -k 10 $((timeout_s + 300)) qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m "$mem" -smp "$smp" \
  -display none -monitor none -serial "file:$run/console.log" -no-reboot -nic none \
  "${kernel[@]}" -initrd "$image/initrd.gz" \
  -append "console=ttyS0 panic=-1 loglevel=4 mitigations=off" \
  -virtfs "$(share9p / hostroot ,readonly=on,multidevs=remap)" \
  -virtfs "$(share9p "$image/root/lib/modules" modules ,readonly=on)" \
  -virtfs "$(share9p "$run" control "")" \
  -virtfs "$(share9p "$share" share ,multidevs=remap)" \
  </dev/null >"$run/qemu.log" 2>&1 &
qemu_pid=$!
: >"$run/console.log"
tail -n +1 -s 0.2 -f --pid="$qemu_pid" "$run/console.log" | awk -v all="${LOOM_RDMA_VERBOSE:-0}" '
  { sub(/\r$/, "") }
  /@@LOOM-GUEST-BEGIN@@$/ { on = 1; if (all != 1) next }
  /@@LOOM-GUEST-END@@$/ { line = $0; sub(/@@LOOM-GUEST-END@@$/, "", line); if (line != "") print line; on = 0; fflush(); if (all != 1) next }
  on || all == 1 || /@@LOOM-GUEST-FAILED@@/ { print; fflush() }'
set +e
wait "$qemu_pid"
qemu_status=$?
set -e
qemu_pid=""
if [ -s "$run/status" ]; then
  status=$(cat "$run/status")
  say "exit $status after $(( $(date +%s) - started )) s (rxe0 ready at guest uptime $(cat "$run/ready-at" 2>/dev/null || echo ?) s)"
else
  if [ "$qemu_status" = 124 ] || [ "$qemu_status" = 137 ]; then status=124; else status=125; fi
  say "the guest ended without a status (qemu exit $qemu_status); its console's end:"
  tail -n 40 "$run/console.log" | sed 's/\r$//' >&2
  cat "$run/qemu.log" >&2
fi
if [ "$status" = 125 ] && [ -s "$run/setup.log" ]; then say "setup log:"; cat "$run/setup.log" >&2; fi
exit "$status"
