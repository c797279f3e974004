#!/usr/bin/env bats
# Issue 15: volume metrics for kubelet. init says supportsMetrics: true, and kubelet then computes a FlexVolume
# volume's metrics itself, with statfs(2) on the pod's volume directory (pkg/volume/flexvolume/plugin.go picks
# volume.NewMetricsStatFS(GetPodVolumeDir(...)); pkg/volume/util/fs FsInfo: capacity = Blocks*Bsize,
# available = Bavail*Bsize, used = (Blocks-Bfree)*Bsize, inodes = Files, inodesFree = Ffree). These tests set a
# volume up as kubelet does in attach mode (attach, waitforattach, mountdevice, then kubelet's own bind mount of the
# global path into the pod's volume directory) and read what kubelet would read, with `stat -f` on the pod dir.
# Needs root; each test skips with a message otherwise.

load 'test_helper/common-setup'
load 'test_helper/volume-setup'

setup() {
  volume_setup
}

teardown() {
  volume_teardown
}

MiB=$((1024 * 1024))

# kubelet_metrics PATH -- sets capacity, available, used, inodes, inodes_free, inodes_used as kubelet's FsInfo
# computes them from statfs(PATH). `stat -f`: %b = f_blocks, %f = f_bfree, %a = f_bavail, %s = f_bsize (kubelet
# multiplies by Bsize), %c = f_files, %d = f_ffree.
kubelet_metrics() {
  local blocks bfree bavail bsize files ffree
  read -r blocks bfree bavail bsize files ffree < <(stat -f -c '%b %f %a %s %c %d' "$1") || fail "stat -f $1 failed"
  capacity=$((blocks * bsize))
  available=$((bavail * bsize))
  used=$(((blocks - bfree) * bsize))
  inodes=$files
  inodes_free=$ffree
  inodes_used=$((files - ffree))
}

# kubelet_pod_bind NODE UID PV -- what kubelet does after mountdevice in attach mode: bind-mount the global path into
# the pod's volume directory. Prints the pod dir.
kubelet_pod_bind() {
  local pod_dir
  pod_dir=$(node_pod_dir "$1" "$2" "$3")
  mount --bind "$(node_global_path "$1" "$3")" "$pod_dir" || fail "bind mount into $pod_dir failed"
  printf '%s\n' "$pod_dir"
}

@test "metrics: init declares supportsMetrics, so kubelet will statfs the pod's volume directory" {
  node_call_success a init
  jq -e '.capabilities.supportsMetrics == true' <<<"$output" >/dev/null || fail "init: $output"
}

@test "metrics: what kubelet reads on the pod dir of a 256Mi ext4 volume: its capacity, and used grows by what is written" {
  local pv size pod_dir
  pv=$(unique_name pv)
  size=$((256 * MiB))
  volume_start a "$pv" size 256Mi fsType ext4
  pod_dir=$(kubelet_pod_bind a "$(unique_name uid)" "$pv")

  kubelet_metrics "$pod_dir"
  local capacity0=$capacity used0=$used inodes_used0=$inodes_used
  # statfs on ext4 leaves out the filesystem's own overhead (journal, inode tables, group descriptors): at 256 MiB
  # that is well under 15%, so capacity lies in [85% of the size, the size].
  ((capacity0 <= size)) || fail "capacity $capacity0 is above the volume size $size"
  ((capacity0 >= size * 85 / 100)) || fail "capacity $capacity0 is below 85% of the volume size $size"
  ((available <= capacity0 - used0)) || fail "available $available > capacity - used ($capacity0 - $used0)"
  ((inodes > 0 && inodes_free > 0 && inodes_used0 > 0)) || fail "inodes $inodes, free $inodes_free, used $inodes_used0"
  # The pod dir and the global path are the same filesystem: the numbers do not depend on which path is asked.
  [[ $(stat -f -c '%b %s %c' "$pod_dir") == "$(stat -f -c '%b %s %c' "$volume_path")" ]] ||
    fail "statfs of the pod dir and of the global path differ"

  # A pod writes 32 MiB: used grows by that much (plus at most 1 MiB of block-map metadata), one inode more.
  dd if=/dev/urandom of="$pod_dir/data" bs=1M count=32 conv=fsync status=none || fail "writing 32 MiB failed"
  sync -f "$pod_dir/data"
  kubelet_metrics "$pod_dir"
  local grown=$((used - used0))
  ((grown >= 32 * MiB && grown <= 33 * MiB)) || fail "used grew by $grown bytes after writing $((32 * MiB))"
  ((capacity == capacity0)) || fail "capacity changed from $capacity0 to $capacity"
  ((inodes_used == inodes_used0 + 1)) || fail "inodes used went from $inodes_used0 to $inodes_used, not one more"

  # Deleting the file gives the space back.
  rm "$pod_dir/data"
  sync -f "$pod_dir"
  kubelet_metrics "$pod_dir"
  ((used - used0 < MiB)) || fail "used is still $((used - used0)) bytes above the start after deleting the file"

  umount "$pod_dir" || fail "unmounting the pod's bind mount failed"
  volume_stop a "$pv"
}
