#!/usr/bin/env bats
# Online resize, as root with real loop devices and filesystems: kubelet's
# `expandfs <json> <devicePath> <podVolumeDir> <newBytes> <oldBytes>` and the admin's `latch volume expand`.
# Volumes are mounted the way kubelet would (non-attach mode's mount, or attach mode's attach/waitforattach/
# mountdevice), filled with data, grown while mounted, and checked with df and a checksum of the data.
# Every driver call goes through latch_call (the one-JSON-reply contract); volume_teardown cleans up on failure.

load 'test_helper/common-setup'
load 'test_helper/volume-setup'
load 'test_helper/nonattach-setup'

MiB=$((1024 * 1024))

setup() {
  nonattach_setup
  PV=$(unique_name pv)
}

teardown() {
  volume_teardown
}

# expandfs_call NODE PV POD_DIR NEW OLD [DEVICE] -- kubelet's expandfs: options without the pod keys (kubelet
# passes none), devicePath "" in non-attach mode.
expandfs_call() {
  node_call "$1" expandfs "$(flex_options "$2")" "${6:-}" "$3" "$4" "$5"
}

# fill DIR -- writes 16 MiB of random data in a few files; sets $data_sum.
fill() {
  mkdir -p "$1/data/sub"
  dd if=/dev/urandom of="$1/data/a" bs=1M count=12 status=none
  dd if=/dev/urandom of="$1/data/sub/b" bs=1M count=4 status=none
  sync
  data_sum=$(tree_sum "$1/data")
}

image_bytes() {
  stat -c %s "$LATCH_POOL_DIR/$1.img"
}

# grow_online FSTYPE SIZE_MIB NEW_MIB -- the whole story for one filesystem type, in non-attach mode.
grow_online() {
  local fstype=$1 size=$2 new=$3 before after
  pod_mount_ok a uid-1 "$PV" size "${size}Mi" fsType "$fstype"
  assert_mounted "$pod_dir" "$(volume_loops "$PV")" "$fstype" rw
  fill "$pod_dir"
  before=$(fs_bytes "$pod_dir")

  expandfs_call a "$PV" "$pod_dir" $((new * MiB)) $((size * MiB))
  assert_reply Success
  after=$(fs_bytes "$pod_dir")
  # df shows the new size: grown by most of what was added (metadata takes a little).
  ((after > before + (new - size) * MiB * 8 / 10)) || fail "df shows $after bytes after growing $fstype from $before (+$(((new - size) * MiB)) expected)"
  assert_equal "$(image_bytes "$PV")" $((new * MiB))
  assert_equal "$(blockdev --getsize64 "$(volume_loops "$PV")")" $((new * MiB))
  assert_ledger "$PV" ".spec.sizeBytes == $((new * MiB))"
  assert_equal "$(tree_sum "$pod_dir/data")" "$data_sum"

  # Idempotent: the same size again is Success and changes nothing.
  local state
  state=$(kernel_state)
  expandfs_call a "$PV" "$pod_dir" $((new * MiB)) $((size * MiB))
  assert_reply Success
  assert_kernel_state_unchanged "$state"
  assert_equal "$(fs_bytes "$pod_dir")" "$after"

  # The data is still there after a full unmount and mount.
  pod_unmount_ok a uid-1 "$PV"
  assert_released "$PV"
  pod_mount_ok a uid-1 "$PV"
  assert_equal "$(tree_sum "$pod_dir/data")" "$data_sum"
  assert_equal "$(fs_bytes "$pod_dir")" "$after"
  pod_unmount_ok a uid-1 "$PV"
  assert_released "$PV"
}

@test "init reports requiresFSResize true in both modes; expandvolume answers Not supported" {
  local config
  for config in "$NODE_A_CONFIG" "$ATTACH_A_CONFIG"; do
    LATCH_CONFIG=$config latch_call init
    assert_reply Success
    assert_equal "$(jq -c '.capabilities.requiresFSResize' <<<"$output")" true
    LATCH_CONFIG=$config latch_call expandvolume "$(flex_options "$PV")" "$(node_global_path a "$PV")" $((128 * MiB)) $((64 * MiB))
    assert_reply "Not supported"
  done
}

@test "xfs: grown online while mounted with data: df shows the new size, checksum unchanged, idempotent" {
  # mkfs.xfs wants at least 300 MB.
  grow_online xfs 320 512
}

@test "btrfs: grown online while mounted with data: df shows the new size, checksum unchanged, idempotent" {
  grow_online btrfs 256 512
}

@test "ext4: grown online while mounted with data: df shows the new size, checksum unchanged, idempotent" {
  has_cap_sys_resource ||
    skip "this process lacks CAP_SYS_RESOURCE (CapEff bit 24), without which the kernel refuses online ext4 resize; the next test checks the refusal instead"
  grow_online ext4 64 192
}

@test "ext4 without CAP_SYS_RESOURCE: expandfs is a Failure naming the capability, and nothing changed" {
  has_cap_sys_resource && skip "this process has CAP_SYS_RESOURCE, so online ext4 resize works (the test above grows one)"
  pod_mount_ok a uid-1 "$PV" size 64Mi fsType ext4
  fill "$pod_dir"
  local before state
  before=$(fs_bytes "$pod_dir")
  state=$(kernel_state)
  expandfs_call a "$PV" "$pod_dir" $((128 * MiB)) $((64 * MiB))
  assert_failure_naming CAP_SYS_RESOURCE "$PV" "nothing was changed"
  assert_kernel_state_unchanged "$state"
  assert_equal "$(fs_bytes "$pod_dir")" "$before"
  assert_equal "$(image_bytes "$PV")" $((64 * MiB))
  assert_equal "$(tree_sum "$pod_dir/data")" "$data_sum"
  pod_unmount_ok a uid-1 "$PV"
  assert_released "$PV"
}

@test "shrinking and growing beyond maxSize are refused with nothing changed" {
  pod_mount_ok a uid-1 "$PV" size 320Mi fsType xfs
  fill "$pod_dir"
  local state df
  state=$(kernel_state)
  df=$(fs_bytes "$pod_dir")

  expandfs_call a "$PV" "$pod_dir" $((256 * MiB)) $((320 * MiB))
  assert_failure_naming "$PV" shrink
  assert_kernel_state_unchanged "$state" 'expandfs to a smaller size'

  expandfs_call a "$PV" "$pod_dir" $((2048 * MiB)) $((320 * MiB))
  assert_failure_naming "$PV" maxSize
  assert_kernel_state_unchanged "$state" 'expandfs beyond maxSize (1Gi)'

  run env LATCH_CONFIG="$NODE_A_CONFIG" "$LATCH_EXEC" volume expand "$PV" --size 256Mi
  assert_failure
  assert_output --partial shrink
  run env LATCH_CONFIG="$NODE_A_CONFIG" "$LATCH_EXEC" volume expand "$PV" --size 2Gi
  assert_failure
  assert_output --partial maxSize
  assert_kernel_state_unchanged "$state" 'latch volume expand, shrinking and beyond maxSize'

  assert_equal "$(fs_bytes "$pod_dir")" "$df"
  assert_equal "$(tree_sum "$pod_dir/data")" "$data_sum"
  pod_unmount_ok a uid-1 "$PV"
  assert_released "$PV"
}

@test "growing beyond the pool's free space is refused with nothing changed" {
  # A pool on a 700 MiB tmpfs: a 320 MiB volume (sparse) fits, growing it to 1000 MiB (under maxSize) does not.
  local pool="$LATCH_TMP/small-pool"
  mkdir -p "$pool"
  mount -t tmpfs -o size=700m tmpfs "$pool"
  latch_on_teardown "umount '$pool' 2>/dev/null || umount -l '$pool' 2>/dev/null || true"
  NODE_A_CONFIG=$(make_config -o "$LATCH_TMP/configs/node-a-small-pool.json" nodeName=node-a attach=false maxSize=1Gi \
    poolDir="$pool")
  LATCH_POOL_DIR=$pool

  pod_mount_ok a uid-1 "$PV" size 320Mi fsType xfs
  fill "$pod_dir"
  local state
  state=$(kernel_state)
  expandfs_call a "$PV" "$pod_dir" $((1000 * MiB)) $((320 * MiB))
  assert_failure_naming "$PV" "available in the pool"
  assert_kernel_state_unchanged "$state"
  assert_equal "$(tree_sum "$pod_dir/data")" "$data_sum"

  # What does fit still works.
  expandfs_call a "$PV" "$pod_dir" $((400 * MiB)) $((320 * MiB))
  assert_reply Success
  pod_unmount_ok a uid-1 "$PV"
  assert_released "$PV"
}

@test "expandfs refuses a volume that is not mounted on this node, and one mounted read-only; nothing changed" {
  pod_mount_ok a uid-1 "$PV" size 320Mi fsType xfs
  local dir_a=$pod_dir state
  state=$(kernel_state)
  # node-b does not have it.
  expandfs_call b "$PV" "$(node_pod_dir b uid-2 "$PV")" $((512 * MiB)) $((320 * MiB))
  assert_failure_naming "$PV" node-b
  assert_kernel_state_unchanged "$state"
  pod_unmount_ok a uid-1 "$PV"

  pod_mount_ok a uid-2 "$PV" kubernetes.io/readwrite ro
  state=$(kernel_state)
  expandfs_call a "$PV" "$pod_dir" $((512 * MiB)) $((320 * MiB))
  assert_failure_naming "$PV" read-only
  assert_kernel_state_unchanged "$state"
  pod_unmount_ok a uid-2 "$PV"
  assert_released "$PV"
}

@test "attach mode: expandfs with the device and the global mount path grows an xfs volume online" {
  use_config "$ATTACH_A_CONFIG"
  NODE_A_CONFIG=$ATTACH_A_CONFIG
  volume_start a "$PV" size 320Mi fsType xfs
  fill "$volume_path"
  local before
  before=$(fs_bytes "$volume_path")
  node_call a expandfs "$(flex_options "$PV")" "$volume_device" "$volume_path" $((640 * MiB)) $((320 * MiB))
  assert_reply Success
  (($(fs_bytes "$volume_path") > before + 250 * MiB)) || fail "df does not show the new size: $(df -h "$volume_path")"
  assert_equal "$(tree_sum "$volume_path/data")" "$data_sum"
  assert_ledger "$PV" ".spec.sizeBytes == $((640 * MiB))"
  volume_stop a "$PV"
  assert_loop_count "$PV" 0
}

@test "latch volume expand: online on the node that holds it, image only elsewhere and offline; expandfs finishes later" {
  pod_mount_ok a uid-1 "$PV" size 320Mi fsType xfs
  fill "$pod_dir"
  local before
  before=$(fs_bytes "$pod_dir")

  # On the node that has it mounted: image, device and filesystem.
  run env LATCH_CONFIG="$NODE_A_CONFIG" "$LATCH_EXEC" volume expand "$PV" --size 448Mi
  assert_success
  assert_output --partial 'grown online'
  (($(fs_bytes "$pod_dir") > before + 100 * MiB)) || fail "df does not show the new size: $(df -h "$pod_dir")"
  assert_ledger "$PV" ".spec.sizeBytes == $((448 * MiB))"
  before=$(fs_bytes "$pod_dir")

  # From another node: only the image; the message says where to finish.
  run env LATCH_CONFIG="$NODE_B_CONFIG" "$LATCH_EXEC" volume expand "$PV" --size 512Mi
  assert_success
  assert_output --partial 'node-a'
  assert_equal "$(image_bytes "$PV")" $((512 * MiB))
  assert_equal "$(fs_bytes "$pod_dir")" "$before"
  # Running it on node-a (same size) refreshes the device and grows the filesystem.
  run env LATCH_CONFIG="$NODE_A_CONFIG" "$LATCH_EXEC" volume expand "$PV" --size 512Mi
  assert_success
  assert_output --partial 'grown online'
  (($(fs_bytes "$pod_dir") > before + 50 * MiB)) || fail "df does not show the new size: $(df -h "$pod_dir")"
  before=$(fs_bytes "$pod_dir")
  pod_unmount_ok a uid-1 "$PV"
  assert_released "$PV"

  # Offline: only the image and the ledger.
  run env LATCH_CONFIG="$NODE_A_CONFIG" "$LATCH_EXEC" volume expand "$PV" --size 640Mi
  assert_success
  assert_output --partial offline
  assert_equal "$(image_bytes "$PV")" $((640 * MiB))
  assert_ledger "$PV" ".spec.sizeBytes == $((640 * MiB))"
  assert_released "$PV"
  # kubelet's expandfs at the next mount grows the filesystem into it.
  pod_mount_ok a uid-1 "$PV"
  assert_equal "$(fs_bytes "$pod_dir")" "$before"
  expandfs_call a "$PV" "$pod_dir" $((640 * MiB)) $((512 * MiB))
  assert_reply Success
  (($(fs_bytes "$pod_dir") > before + 100 * MiB)) || fail "df does not show the new size: $(df -h "$pod_dir")"
  assert_equal "$(tree_sum "$pod_dir/data")" "$data_sum"
  pod_unmount_ok a uid-1 "$PV"
  assert_released "$PV"
}
