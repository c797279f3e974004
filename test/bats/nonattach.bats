#!/usr/bin/env bats
# Non-attach mode (attach: false), as root with real loop devices, filesystems and mounts: kubelet calls only
# `mount <podDir> <json>` and `unmount <podDir>`, and latch does the whole job on the node through the ledger.
# Two simulated nodes (node-a, node-b) share one ledger and one pool. Every driver call goes through latch_call,
# which checks the one-JSON-reply contract; volume_teardown unmounts and detaches whatever a failed test left.

load 'test_helper/common-setup'
load 'test_helper/volume-setup'
load 'test_helper/nonattach-setup'

setup() {
  nonattach_setup
  PV=$(unique_name pv)
}

teardown() {
  volume_teardown
}

# ---- the mode ---------------------------------------------------------------------------------------------------

@test "init says attach false and requiresFSResize true; the attach-family ops answer Not supported" {
  node_call a init
  assert_reply Success
  assert_equal "$(jq -c '.capabilities | [.attach, .requiresFSResize, .fsGroup]' <<<"$output")" '[false,true,true]'

  local options global
  options=$(flex_options "$PV")
  global=$(node_global_path a "$PV")
  node_call a attach "$options" node-a
  assert_reply "Not supported"
  node_call a isattached "$options" node-a
  assert_reply "Not supported"
  node_call a detach "$PV" node-a
  assert_reply "Not supported"
  node_call a waitforattach "" "$options"
  assert_reply "Not supported"
  node_call a mountdevice "$global" /dev/loop0 "$options"
  assert_reply "Not supported"
  node_call a unmountdevice "$global"
  assert_reply "Not supported"
  # Nothing was created by any of them.
  assert_equal "$(ledger_doc "$PV")" null
  refute [ -e "$LATCH_POOL_DIR/$PV.img" ]
}

@test "in attach mode mount and unmount answer Not supported (kubelet bind-mounts itself)" {
  local dir
  dir=$(node_pod_dir a uid-1 "$PV")
  LATCH_CONFIG=$ATTACH_A_CONFIG latch_call mount "$dir" "$(flex_mount_options "$PV" uid-1)"
  assert_reply "Not supported"
  LATCH_CONFIG=$ATTACH_A_CONFIG latch_call unmount "$dir"
  assert_reply "Not supported"
  assert_equal "$(ledger_doc "$PV")" null
}

# ---- one node, several pods -------------------------------------------------------------------------------------

@test "two pods on one node share one staging mount; pods and fsGroup are on their tickets; the last unmount releases everything" {
  local staging dir1 dir2 device sum
  staging=$(staging_of a "$PV")

  pod_mount_ok a uid-1 "$PV" size 64Mi
  dir1=$pod_dir
  assert_loop_count "$PV" 1
  device=$loop_devices
  assert_mounted "$staging" "$device" ext4 rw
  assert_mounted "$dir1" "$device" ext4 rw
  dd if=/dev/urandom of="$dir1/data" bs=1M count=8 status=none
  sync
  sum=$(sha256sum <"$dir1/data")

  pod_mount_ok a uid-2 "$PV" kubernetes.io/mounterArgs.FsGroup 2000
  dir2=$pod_dir
  assert_loop_count "$PV" 1
  assert_equal "$(mount_count "$staging")" 1
  assert_mounted "$dir2" "$device" ext4 rw
  assert_equal "$(sha256sum <"$dir2/data")" "$sum"

  # One ticket per pod, both on node-a, both saying who asked.
  run pod_tickets "$PV"
  assert_success
  assert_equal "$(jq -c '[.[] | {node: .nodeID, uid: .requestedBy.pod.uid, ns: .requestedBy.pod.namespace,
      fsGroup: .requestedBy.fsGroup, pv: .requestedBy.pvName, sat: .status.satisfied}] | sort_by(.uid)' <<<"$output")" \
    "[{\"node\":\"node-a\",\"uid\":\"uid-1\",\"ns\":\"default\",\"fsGroup\":null,\"pv\":\"$PV\",\"sat\":true},{\"node\":\"node-a\",\"uid\":\"uid-2\",\"ns\":\"default\",\"fsGroup\":2000,\"pv\":\"$PV\",\"sat\":true}]"
  run env LATCH_CONFIG="$NODE_A_CONFIG" "$LATCH_EXEC" ticket list "$PV"
  assert_success
  assert_output --partial 'pod default/pod-uid-1'
  assert_output --partial 'pod default/pod-uid-2'

  # The first pod leaves: the volume stays for the second.
  pod_unmount_ok a uid-1 "$PV"
  assert_not_mounted "$dir1"
  assert_mounted "$staging" "$device" ext4 rw
  assert_loop_count "$PV" 1
  assert_equal "$(sha256sum <"$dir2/data")" "$sum"
  assert_ledger "$PV" '(.spec.tickets | length) == 1 and .status.nodes["node-a"].phase == "attached"'

  # The last pod leaves: staging mount, device and the node's hold all go, the device with the staging mount's
  # umount -d (no losetup ran).
  noting_tool losetup
  PATH="$LATCH_TMP/notebin:$PATH" pod_unmount_ok a uid-2 "$PV"
  assert_not_mounted "$dir2"
  assert_released "$PV"
  [[ ! -e $LATCH_TMP/losetup.runs ]] || fail "the last unmount ran losetup: $(<"$LATCH_TMP/losetup.runs")"
  refute [ -e "$staging" ]

  # Repeating the unmount changes nothing.
  local before
  before=$(kernel_state)
  pod_unmount_ok a uid-2 "$PV"
  assert_kernel_state_unchanged "$before"
}

@test "a repeated mount of the same pod is Success and adds neither a mount nor a ticket" {
  pod_mount_ok a uid-1 "$PV"
  local before
  before=$(kernel_state)
  pod_mount_ok a uid-1 "$PV"
  assert_kernel_state_unchanged "$before"
  assert_equal "$(mount_count "$pod_dir")" 1
  assert_equal "$(pod_tickets "$PV" | jq length)" 1
  pod_unmount_ok a uid-1 "$PV"
  assert_released "$PV"
}

@test "a read-only pod gets a read-only bind while another pod on the node writes" {
  pod_mount_ok a uid-rw "$PV"
  local rw_dir=$pod_dir
  pod_mount_ok a uid-ro "$PV" kubernetes.io/readwrite ro
  local ro_dir=$pod_dir
  assert_loop_count "$PV" 1
  assert_mounted "$ro_dir" "$loop_devices" ext4 ro
  assert_mounted "$(staging_of a "$PV")" "$loop_devices" ext4 rw
  echo hello >"$rw_dir/file"
  assert_equal "$(cat "$ro_dir/file")" hello
  run bash -c "echo x >'$ro_dir/other'"
  assert_failure
  assert_output --partial 'Read-only file system'

  pod_unmount_ok a uid-ro "$PV"
  pod_unmount_ok a uid-rw "$PV"
  assert_released "$PV"
}

# ---- two nodes -----------------------------------------------------------------------------------------------

@test "a pod on node-b is refused, naming node-a, while node-a holds the volume read-write; it mounts once node-a lets go, data intact" {
  pod_mount_ok a uid-a "$PV"
  dd if=/dev/urandom of="$pod_dir/data" bs=1M count=4 status=none
  sync
  local sum
  sum=$(sha256sum <"$pod_dir/data")

  local before
  before=$(kernel_state)
  pod_mount b uid-b "$PV"
  assert_failure_naming "$PV" node-a
  assert_kernel_state_unchanged "$before" 'the refused mount on node-b'
  assert_not_mounted "$pod_dir"
  refute [ -e "$(staging_of b "$PV")" ]
  assert_ledger "$PV" '[.spec.tickets[] | .nodeID] == ["node-a"]' 'only node-a has a ticket (the refused one was not left behind)'

  pod_unmount_ok a uid-a "$PV"
  assert_released "$PV"

  # The volume moves: same filesystem, never reformatted.
  pod_mount_ok b uid-b "$PV"
  assert_equal "$(sha256sum <"$pod_dir/data")" "$sum"
  assert_ledger "$PV" '.status.nodes | keys == ["node-b"]'
  pod_unmount_ok b uid-b "$PV"
  assert_released "$PV"
}

@test "read-only pods on two nodes both mount when every ticket is read-only; a read-write pod is refused meanwhile" {
  # Format once, read-write, with data on it.
  pod_mount_ok a uid-w "$PV"
  echo shared >"$pod_dir/file"
  pod_unmount_ok a uid-w "$PV"
  assert_released "$PV"

  pod_mount_ok a uid-ra "$PV" kubernetes.io/readwrite ro
  local dir_a=$pod_dir
  pod_mount_ok b uid-rb "$PV" kubernetes.io/readwrite ro
  local dir_b=$pod_dir
  assert_loop_count "$PV" 1
  assert_mounted "$dir_a" "$loop_devices" ext4 ro
  assert_mounted "$dir_b" "$loop_devices" ext4 ro
  assert_mounted "$(staging_of a "$PV")" "$loop_devices" ext4 ro
  assert_mounted "$(staging_of b "$PV")" "$loop_devices" ext4 ro
  assert_equal "$(cat "$dir_a/file")" shared
  assert_equal "$(cat "$dir_b/file")" shared
  run bash -c "echo x >'$dir_b/other'"
  assert_failure
  assert_ledger "$PV" '(.status.nodes | keys) == ["node-a", "node-b"] and ([.status.tickets[] | .satisfied] | all)'

  pod_mount b uid-wb "$PV"
  assert_failure_naming "$PV"
  assert_ledger "$PV" '(.spec.tickets | length) == 2' 'the refused read-write ticket was not left behind'

  pod_unmount_ok a uid-ra "$PV"
  assert_not_mounted "$dir_a"
  assert_not_mounted "$(staging_of a "$PV")"
  pod_unmount_ok b uid-rb "$PV"
  assert_not_mounted "$dir_b"
  # On one host the two simulated nodes share the loop device: node-a could not release a device node-b still had
  # mounted, so it kept its hold (state detaching, the safe side). A repeated unmount finds the device free and
  # finishes (on separate hosts the first unmount releases at once).
  pod_unmount_ok a uid-ra "$PV"
  assert_released "$PV"
}

# ---- lost state: kubelet restarts, reboots, a lost staging mount ----------------------------------------

@test "unmount after the staging mount was lost (umount by hand) still cleans up" {
  pod_mount_ok a uid-1 "$PV"
  umount "$(staging_of a "$PV")"
  assert_not_mounted "$(staging_of a "$PV")"
  pod_unmount_ok a uid-1 "$PV"
  assert_not_mounted "$pod_dir"
  assert_released "$PV"
}

@test "unmount after the bind mount was lost (only the pod dir's name is left) still cleans up" {
  pod_mount_ok a uid-1 "$PV"
  umount "$pod_dir"
  pod_unmount_ok a uid-1 "$PV"
  assert_released "$PV"
}

@test "after a simulated reboot (no mount, no loop device) unmount of each pod clears the ledger" {
  pod_mount_ok a uid-1 "$PV"
  local dir1=$pod_dir
  pod_mount_ok a uid-2 "$PV"
  local dir2=$pod_dir
  assert_loop_count "$PV" 1
  umount "$dir1" "$dir2" "$(staging_of a "$PV")"
  losetup -d "$loop_devices"
  assert_loop_count "$PV" 0

  pod_unmount_ok a uid-1 "$PV"
  assert_ledger "$PV" '(.spec.tickets | length) == 1' "uid-2's ticket remains"
  pod_unmount_ok a uid-2 "$PV"
  assert_released "$PV"
}

@test "after a simulated reboot a pod that is still scheduled mounts again with its data" {
  pod_mount_ok a uid-1 "$PV"
  echo kept >"$pod_dir/file"
  umount "$pod_dir" "$(staging_of a "$PV")"
  losetup -d "$(volume_loops "$PV")"

  pod_mount_ok a uid-1 "$PV"
  assert_equal "$(cat "$pod_dir/file")" kept
  assert_loop_count "$PV" 1
  assert_equal "$(pod_tickets "$PV" | jq length)" 1
  pod_unmount_ok a uid-1 "$PV"
  assert_released "$PV"
}

# ---- refusals leave nothing behind -------------------------------------------------------------------------

@test "a blank volume asked for read-only is refused and nothing is left set up" {
  pod_mount a uid-1 "$PV" kubernetes.io/readwrite ro
  assert_failure_naming "$PV" read-only
  assert_not_mounted "$pod_dir"
  assert_released "$PV"
}

@test "a mount that fails after its grant (fsType mismatch) leaves no ticket; the device goes unless another pod uses it" {
  pod_mount_ok a uid-1 "$PV" fsType ext4
  local dir1=$pod_dir before
  echo data >"$dir1/file"
  before=$(kernel_state)

  # Another pod asks for xfs while the staging mount holds ext4: refused, pod 1 untouched.
  pod_mount a uid-2 "$PV" fsType xfs
  assert_failure_naming "$PV" ext4 xfs
  assert_not_mounted "$pod_dir"
  assert_kernel_state_unchanged "$before"
  assert_equal "$(cat "$dir1/file")" data

  # The only pod asks for xfs: refused in the staging mount; everything it set up is undone.
  pod_unmount_ok a uid-1 "$PV"
  assert_released "$PV"
  pod_mount a uid-3 "$PV" fsType xfs
  assert_failure_naming "$PV" ext4 xfs
  assert_not_mounted "$pod_dir"
  assert_released "$PV"
  assert_equal "$(fs_type_of "$LATCH_POOL_DIR/$PV.img")" ext4
}

@test "unmount refuses a pod dir where something that is not a latch volume is mounted, and leaves it" {
  local dir
  dir=$(node_pod_dir a uid-1 "$PV")
  mount -t tmpfs -o size=1m tmpfs "$dir"
  latch_on_teardown "umount '$dir' 2>/dev/null || true"
  node_call a unmount "$dir"
  assert_failure_naming "$dir" "not a latch volume"
  assert_equal "$(findmnt -n -o FSTYPE --mountpoint "$dir")" tmpfs
}

@test "unmount of a pod dir that was never mounted is Success and changes nothing" {
  local dir before
  dir=$(node_pod_dir a uid-1 "$PV")
  before=$(kernel_state)
  node_call a unmount "$dir"
  assert_reply Success
  node_call a unmount "$LATCH_TMP/kubelet-node-a/pods/uid-9/volumes/latch~loop/NOT_A_NAME"
  assert_reply Success
  assert_kernel_state_unchanged "$before"
}

@test "parallel mounts and unmounts of several pods on one node converge on one device and one staging mount" {
  local i pids=() uid dir
  for i in 1 2 3 4; do
    dir=$(node_pod_dir a "uid-$i" "$PV")
    LATCH_CONFIG=$NODE_A_CONFIG "$LATCH_EXEC" mount "$dir" "$(flex_mount_options "$PV" "uid-$i")" \
      >"$BATS_TEST_TMPDIR/mount-$i.out" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[i]}" || true
  done
  for i in 1 2 3 4; do
    assert_equal "$(jq -r .status "$BATS_TEST_TMPDIR/mount-$i.out")" Success
    assert_mounted "$LATCH_TMP/kubelet-node-a/pods/uid-$i/volumes/latch~loop/$PV" "$(volume_loops "$PV")" ext4 rw
  done
  assert_loop_count "$PV" 1
  assert_equal "$(mount_count "$(staging_of a "$PV")")" 1
  assert_equal "$(pod_tickets "$PV" | jq length)" 4

  pids=()
  for i in 1 2 3 4; do
    LATCH_CONFIG=$NODE_A_CONFIG "$LATCH_EXEC" unmount "$LATCH_TMP/kubelet-node-a/pods/uid-$i/volumes/latch~loop/$PV" \
      >"$BATS_TEST_TMPDIR/unmount-$i.out" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[i]}" || true
  done
  for i in 1 2 3 4; do
    assert_equal "$(jq -r .status "$BATS_TEST_TMPDIR/unmount-$i.out")" Success
  done
  assert_released "$PV"
}
