#!/usr/bin/env bash
# Prepares a fresh Debian machine (as root) to build, demo and test latch: the Debian tools latch drives,
# the npm packages, and the build. Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# command -> Debian package that provides it: every tool latch runs (src/filesystems.ts and doctor's list; a unit
# test, test/unit/filesystems.test.ts, checks this table against them), then what the tests and `npm run bench`
# use (fio: volume I/O); the self-contained build's (patchelf, and a C compiler for its native helper,
# src/native/helper.c); last, the rbd backend's node side: rbd and rbd-fuse, and the one-host Ceph cluster of its
# tests: test/ceph/cluster.ts (with ceph-mds for shared volumes' file system, and ceph-fuse, their node client), with
# the RADOS Gateway for the S3 backup target's tests (test/ceph/rgw.ts); and the nemesis rig's network tools
# (test/nemesis/rig.ts).
declare -A PACKAGES=(
  [losetup]=mount [mount]=mount [umount]=mount [findmnt]=util-linux [blkid]=util-linux [setpriv]=util-linux
  [getfattr]=attr [setfattr]=attr [setfacl]=acl
  [mkfs.ext4]=e2fsprogs [mkfs.ext3]=e2fsprogs [resize2fs]=e2fsprogs [mkfs.xfs]=xfsprogs [xfs_growfs]=xfsprogs [xfs_io]=xfsprogs
  [mkfs.btrfs]=btrfs-progs [btrfs]=btrfs-progs
  [jq]=jq [inotifywait]=inotify-tools [etcd]=etcd-server [patchelf]=patchelf [cc]=gcc [fio]=fio
  [rbd]=ceph-common [ceph]=ceph-common [ceph-authtool]=ceph-common [monmaptool]=ceph-mon [rbd-fuse]=rbd-fuse
  [ceph-mon]=ceph-mon [ceph-mgr]=ceph-mgr [ceph-osd]=ceph-osd [ceph-mds]=ceph-mds [ceph-fuse]=ceph-fuse
  [radosgw]=radosgw [radosgw-admin]=ceph-common
  [ip]=iproute2 [nsenter]=util-linux [nft]=nftables [curl]=curl [openssl]=openssl
)
missing=()
for cmd in "${!PACKAGES[@]}"; do
  PATH="$PATH:/usr/sbin:/sbin" command -v "$cmd" >/dev/null 2>&1 || missing+=("${PACKAGES[$cmd]}")
done
# The C library's headers, for the compiler above (gcc only recommends them).
[ -e /usr/include/stdio.h ] || missing+=(libc6-dev)
if [ ${#missing[@]} -gt 0 ]; then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing Debian packages (${missing[*]}); run as root to install them" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

npm ci --no-audit --no-fund --loglevel=error
npm run --silent build
echo "setup: done ($(bin/latch version))"
