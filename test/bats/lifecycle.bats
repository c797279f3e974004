#!/usr/bin/env bats
# Issue 4: the attach-mode lifecycle against bin/latch with real loop devices, filesystems and mounts, as kubelet
# and the controller call it (docs/protocol.md, "Sequences"), for two simulated nodes sharing one ledger and one pool.
# Every reply goes through latch_call (one JSON object, empty stderr, exit code matching the status), and the
# kernel state (loop devices, mounts) and the ledger are checked after the steps that change them.
# SIGKILL tests kill the driver at random delays, and once while a child it runs (losetup, mkfs.ext4, umount) is
# slowed down by a wrapper first on PATH: that child outlives the driver, as it does when kubelet kills a call.
# Needs root; each test skips with a message otherwise.

load 'test_helper/common-setup'
load 'test_helper/volume-setup'

setup() {
  volume_setup
}

teardown() {
  volume_teardown
}

# ---- small helpers for this file ------------------------------------------------------------------------

# reply_field FIELD -- a field of the last reply ("" when absent).
reply_field() {
  jq -r --arg f "$1" '.[$f] // "" | tostring' <<<"$output"
}

# assert_attached_reply BOOL -- the last reply is Success with "attached": BOOL (a real boolean).
assert_attached_reply() {
  assert_reply Success
  jq -e --argjson want "$1" '.attached == $want' <<<"$output" >/dev/null ||
    fail "expected attached: $1 from $latch_last_call, got: $output"
}

# sha_of FILE -- its sha256.
sha_of() {
  sha256sum "$1" | cut -d' ' -f1
}

# mounts_at PATH -- how many mounts are stacked at PATH.
mounts_at() {
  findmnt -n -r --mountpoint "$1" -o SOURCE | grep -c . || true
}

# fsck_clean IMAGE -- a read-only forced fsck of the image finds nothing to fix (exit 0).
fsck_clean() {
  run e2fsck -f -n "$1"
  [[ $status == 0 ]] || fail "e2fsck -f -n $1 exited $status: $output"
}

# after_kubelet_restart OPTIONS DEVICE PATH VOLUME -- what a restarted kubelet calls on node-a for a volume in use
# (isattached, waitforattach, mountdevice) with OPTIONS: the same device comes back, mounted once, one loop device.
after_kubelet_restart() {
  local options=$1 device=$2 path=$3 volume=$4
  node_call a isattached "$options" node-a
  assert_attached_reply true
  node_call_success a waitforattach "" "$options"
  assert_equal "$(reply_field device)" "$device"
  node_call_success a mountdevice "$path" "$device" "$options"
  assert_mounted "$path" "$device" ext4 rw
  assert_equal "$(mounts_at "$path")" 1
  assert_loop_count "$volume" 1
}

# ---- the pod start and stop sequences -------------------------------------------------------------------

@test "pod start and stop on node-a, then on node-b: every reply, and the kernel state after every step" {
  local pv options node name device path
  pv=$(unique_name pv)
  options=$(flex_options "$pv" size 128Mi)

  for node in a b; do
    name=$(node_name "$node")
    path=$(node_global_path "$node" "$pv")

    # kubelet and the controller probe the plugin
    node_call_success "$node" init
    jq -e '.capabilities | .attach == true and (.selinuxRelabel | type) == "boolean" and (.fsGroup | type) == "boolean"
      and (.requiresFSResize | type) == "boolean" and .supportsMetrics == true' <<<"$output" >/dev/null ||
      fail "init capabilities: $output"

    # controller: attach is a ledger decision only, no device yet
    node_call_success "$node" attach "$options" "$name"
    assert_loop_count "$pv" 0
    assert_ledger "$pv" "(.status.nodes | keys) == [\"$name\"] and .status.nodes[\"$name\"].phase == \"granted\"
      and (.spec.tickets | length) == 1 and .spec.sizeBytes == 134217728"
    [[ -f $LATCH_POOL_DIR/$pv.img || $node == a ]] || fail "the image of $pv is gone after node-a used it"

    node_call "$node" isattached "$options" "$name"
    assert_attached_reply true

    # kubelet: waitforattach sets up exactly one loop device and replies it
    node_call_success "$node" waitforattach "" "$options"
    device=$(reply_field device)
    assert_loop_count "$pv" 1
    assert_equal "$loop_devices" "$device"
    assert_ledger "$pv" ".status.nodes[\"$name\"].phase == \"attached\" and .status.nodes[\"$name\"].device == \"$device\"
      and .status.currentNodes == [\"$name\"] and .status.state == \"attached\""
    assert_equal "$(stat -c %s "$LATCH_POOL_DIR/$pv.img")" 134217728

    # kubelet: mountdevice at the global path: ext4, read-write, the device and nothing else
    node_call_success "$node" mountdevice "$path" "$device" "$options"
    assert_mounted "$path" "$device" ext4 rw
    assert_equal "$(mounts_at "$path")" 1
    assert_loop_count "$pv" 1
    assert_ledger "$pv" '.status.filesystem == "ext4"'
    if [[ $node == a ]]; then
      echo "written on node-a" >"$path/hello.txt"
    else
      assert_equal "$(<"$path/hello.txt")" "written on node-a"
    fi

    # pod stops: unmountdevice releases mount and loop device; the node keeps its grant until detach
    node_call_success "$node" unmountdevice "$path"
    assert_not_mounted "$path"
    assert_loop_count "$pv" 0
    assert_ledger "$pv" ".status.nodes[\"$name\"].phase == \"granted\" and .status.currentNodes == []"

    node_call_success "$node" detach "$pv" "$name"
    assert_loop_count "$pv" 0
    assert_not_mounted "$path"
    assert_ledger "$pv" '.status.state == "detached" and .status.nodes == {} and .spec.tickets == {}'
    node_call "$node" isattached "$options" "$name"
    assert_attached_reply false
  done
  assert_equal "$(fs_type_of "$LATCH_POOL_DIR/$pv.img")" ext4
}

# ---- after a kubelet restart: only kubernetes.io/* keys ------------------------------------------------

@test "kubelet restart: calls with only fsType \"\", readwrite rw and pvOrVolumeName find the volume" {
  local pv full restart device path
  pv=$(unique_name pv)
  full=$(flex_options "$pv" size 96Mi fsType ext4)
  restart=$(restart_options "$pv")
  volume_start a "$pv" size 96Mi fsType ext4
  device=$volume_device
  path=$volume_path
  echo before-restart >"$path/file"

  # kubelet restarted and reconstructed the volume from directory names
  after_kubelet_restart "$restart" "$device" "$path" "$pv"

  node_call_success a unmountdevice "$path"
  assert_not_mounted "$path"
  assert_loop_count "$pv" 0

  # a new pod on the same node, still without user options: the existing filesystem is mounted, not remade
  node_call_success a waitforattach "" "$restart"
  device=$(reply_field device)
  node_call_success a mountdevice "$path" "$device" "$restart"
  assert_mounted "$path" "$device" ext4 rw
  assert_equal "$(<"$path/file")" before-restart

  node_call_success a unmountdevice "$path"
  node_call_success a detach "$pv" node-a
  assert_loop_count "$pv" 0
  assert_ledger "$pv" '.status.state == "detached" and .spec.tickets == {} and .spec.sizeBytes == 100663296'
}

@test "kubelet restart: a volume attached with a user 'volume' option other than the PV name is still found" {
  local pv vol full restart device path path_b
  pv=$(unique_name pv)
  vol=$(unique_name data)
  full=$(flex_options "$pv" volume "$vol" size 96Mi)
  restart=$(restart_options "$pv")

  node_call_success a attach "$full" node-a
  node_call_success a waitforattach "" "$full"
  device=$(reply_field device)
  path=$(node_global_path a "$pv")
  node_call_success a mountdevice "$path" "$device" "$full"
  assert_loop_count "$vol" 1
  echo "on $vol" >"$path/file"

  # kubelet restarts: only the PV name from now on
  after_kubelet_restart "$restart" "$device" "$path" "$vol"
  assert_equal "$(ledger_doc "$pv")" null
  [[ ! -e $LATCH_POOL_DIR/$pv.img ]] || fail "an image named after the PV was created: $LATCH_POOL_DIR/$pv.img"

  node_call_success a unmountdevice "$path"
  assert_not_mounted "$path"
  assert_loop_count "$vol" 0
  # detach gets only the PV name
  node_call_success a detach "$pv" node-a
  assert_ledger "$vol" '.status.state == "detached" and .spec.tickets == {} and .status.nodes == {}'

  # node-b, also knowing only the PV name, gets the same volume and its data
  node_call_success b attach "$restart" node-b
  node_call_success b waitforattach "" "$restart"
  device=$(reply_field device)
  assert_loop_count "$vol" 1
  assert_equal "$loop_devices" "$device"
  path_b=$(node_global_path b "$pv")
  node_call_success b mountdevice "$path_b" "$device" "$restart"
  assert_mounted "$path_b" "$device" ext4 rw
  assert_equal "$(<"$path_b/file")" "on $vol"
  volume_stop b "$pv"
  assert_loop_count "$vol" 0
  assert_ledger "$vol" '.status.state == "detached" and .spec.tickets == {}'
  assert_equal "$(ledger_doc "$pv")" null
}

# ---- idempotence ------------------------------------------------------------------------------------------

# twice NODE ARGS... -- the call twice in a row: the same reply, and the second changes nothing.
twice() {
  local first state
  node_call "$@"
  first=$output
  state=$(kernel_state)
  node_call "$@"
  [[ $output == "$first" ]] ||
    batslib_print_kv_single_or_multi 6 'call' "$latch_last_call" 'first' "$first" 'second' "$output" |
    batslib_decorate 'a repeated call answered differently' | fail
  assert_kernel_state_unchanged "$state" "the second $latch_last_call"
}

@test "every op repeated twice in a row returns the same result and changes nothing the second time" {
  local pv options device path
  pv=$(unique_name pv)
  options=$(flex_options "$pv")
  path=$(node_global_path a "$pv")

  twice a attach "$options" node-a
  assert_reply Success
  twice a isattached "$options" node-a
  assert_attached_reply true
  twice a waitforattach "" "$options"
  assert_reply Success
  device=$(reply_field device)
  assert_loop_count "$pv" 1
  twice a mountdevice "$path" "$device" "$options"
  assert_reply Success
  assert_mounted "$path" "$device" ext4 rw
  assert_equal "$(mounts_at "$path")" 1
  twice a unmountdevice "$path"
  assert_reply Success
  assert_not_mounted "$path"
  assert_loop_count "$pv" 0
  twice a detach "$pv" node-a
  assert_reply Success
  assert_ledger "$pv" '.status.state == "detached" and .spec.tickets == {}'
}

# ---- SIGKILL in the middle of a call --------------------------------------------------------------------

# Random delays (ms) for the kill, printed so that a failure can be reproduced.
kill_delays() {
  local i
  for ((i = 0; i < $1; i++)); do echo $((RANDOM % 301)); done
}

@test "SIGKILL during waitforattach: the repeated call converges on one loop device" {
  local delay pv options device path
  for delay in 0 $(kill_delays 3) losetup; do
    pv=$(unique_name pv)
    options=$(flex_options "$pv")
    echo "# waitforattach of $pv killed at: $delay"
    node_call_success a attach "$options" node-a
    if [[ $delay == losetup ]]; then
      # killed while `losetup --find --show` runs (slowed down): that losetup finishes after the driver died
      spawn_and_kill_during losetup a waitforattach "" "$options"
    else
      latch_spawn a waitforattach "" "$options"
      sleep_ms "$delay"
      kill_spawned
    fi
    [[ ! -s $spawned_out ]] || echo "#   (the killed call had already replied: $(<"$spawned_out"))"

    node_call_success a waitforattach "" "$options"
    device=$(reply_field device)
    # what the killed call left running (its losetup) may finish only now; kubelet's next waitforattach (it
    # calls it again before every mount attempt) must then still find one device, the same one
    wait_spawned_gone
    node_call_success a waitforattach "" "$options"
    assert_loop_count "$pv" 1
    assert_equal "$loop_devices" "$device"
    assert_equal "$(reply_field device)" "$device"
    assert_ledger "$pv" ".status.nodes[\"node-a\"].phase == \"attached\" and .status.nodes[\"node-a\"].device == \"$device\""
    run find "$LATCH_POOL_DIR" -mindepth 1 -name "*$pv*" ! -name "$pv.img"
    assert_output ""

    # and the rest of the lifecycle still works
    path=$(node_global_path a "$pv")
    node_call_success a mountdevice "$path" "$device" "$options"
    assert_mounted "$path" "$device" ext4
    volume_stop a "$pv"
    assert_loop_count "$pv" 0
    assert_ledger "$pv" '.status.state == "detached"'
  done
}

# mountdevice_killed PV DELAY_MS|mkfs -- a blank 2Gi volume attached on node-a; mountdevice killed after DELAY_MS,
# or (mkfs) while a slow mkfs.ext4 runs; then the repeated call must mount it, and what the killed call left
# running must not harm the filesystem.
mountdevice_killed() {
  local pv=$1 when=$2 options device path sum
  options=$(flex_options "$pv" size 2Gi)
  volume_attach a "$pv" size 2Gi
  device=$volume_device
  path=$(node_global_path a "$pv")

  if [[ $when == mkfs ]]; then
    # mkfs of a sparse image takes milliseconds: a slow wrapper first on PATH makes the window long enough to hit.
    spawn_and_kill_during mkfs.ext4 a mountdevice "$path" "$device" "$options"
  else
    latch_spawn a mountdevice "$path" "$device" "$options"
    sleep_ms "$when"
    kill_spawned
  fi

  node_call_success a mountdevice "$path" "$device" "$options"
  assert_mounted "$path" "$device" ext4 rw
  assert_equal "$(mounts_at "$path")" 1
  head -c 4M /dev/urandom >"$path/after-kill.bin"
  sum=$(sha_of "$path/after-kill.bin")
  sync

  # whatever the killed call left running (a mkfs) finishes or fails; the mounted filesystem must survive it
  wait_spawned_gone 30
  assert_mounted "$path" "$device" ext4 rw
  assert_loop_count "$pv" 1
  assert_ledger "$pv" '.status.nodes["node-a"].phase == "attached" and .status.filesystem == "ext4"'
  assert_equal "$(sha_of "$path/after-kill.bin")" "$sum"
  volume_stop a "$pv"
  assert_loop_count "$pv" 0
  fsck_clean "$LATCH_POOL_DIR/$pv.img"
}

@test "SIGKILL during mountdevice of a blank 2Gi volume (mkfs): the repeated call mounts it, filesystem intact" {
  local delay
  for delay in $(kill_delays 3) mkfs; do
    echo "# mountdevice killed at: $delay"
    mountdevice_killed "$(unique_name pv)" "$delay"
  done
}

@test "SIGKILL during unmountdevice: the repeated call finishes the release" {
  local delay pv path device
  for delay in 0 $(kill_delays 3) umount; do
    pv=$(unique_name pv)
    echo "# unmountdevice of $pv killed at: $delay"
    volume_start a "$pv"
    path=$volume_path
    device=$volume_device
    if [[ $delay == umount ]]; then
      spawn_and_kill_during umount a unmountdevice "$path"
    else
      latch_spawn a unmountdevice "$path"
      sleep_ms "$delay"
      kill_spawned
    fi
    [[ ! -s $spawned_out ]] || echo "#   (the killed call had already replied: $(<"$spawned_out"))"

    node_call_success a unmountdevice "$path"
    wait_spawned_gone
    assert_not_mounted "$path"
    assert_loop_count "$pv" 0
    assert_ledger "$pv" '.status.nodes["node-a"].phase == "granted" and .status.currentNodes == []'
    node_call_success a detach "$pv" node-a
    assert_ledger "$pv" '.status.state == "detached" and .status.nodes == {}'
    fsck_clean "$LATCH_POOL_DIR/$pv.img"
  done
}

@test "SIGKILL during unmountdevice's losetup -d: the orphaned detach does not hit the next volume's device" {
  local pv next path device
  pv=$(unique_name pv)
  next=$(unique_name pv)
  volume_start a "$pv"
  path=$volume_path
  device=$volume_device
  # The mount gone and the device left (a call that died between the two, a reboot's unmount): unmountdevice then
  # detaches the device with losetup -d. With the mount still there, its umount -d frees the device in one child.
  umount "$path"
  spawn_and_kill_during -s 5 losetup a unmountdevice "$path"
  node_call_success a unmountdevice "$path"
  assert_not_mounted "$path"
  assert_loop_count "$pv" 0

  # losetup --find hands out the lowest free number, usually the one just freed. (While the orphan waits, another
  # process on this host could take it instead; then this run proves nothing and says so.)
  volume_start a "$next"
  echo "# $pv had $device; $next got $volume_device"
  [[ $volume_device == "$device" ]] || echo "# (the device number was not reused: this run is inconclusive)"
  wait_spawned_gone 30
  assert_loop_count "$next" 1
  assert_equal "$loop_devices" "$volume_device"
  assert_mounted "$volume_path" "$volume_device" ext4 rw
  assert_equal "$(<"/sys/block/${volume_device#/dev/}/loop/autoclear")" 0
  volume_stop a "$next"
  node_call_success a detach "$pv" node-a
}

@test "unmountdevice frees the loop device in its umount, no losetup; a device still mounted elsewhere stays" {
  local pv path device bind
  pv=$(unique_name pv)
  volume_start a "$pv"
  path=$volume_path
  device=$volume_device
  noting_tool losetup

  PATH="$LATCH_TMP/notebin:$PATH" node_call_success a unmountdevice "$path"
  assert_not_mounted "$path"
  assert_loop_count "$pv" 0
  [[ ! -e $LATCH_TMP/losetup.runs ]] || fail "unmountdevice ran losetup: $(<"$LATCH_TMP/losetup.runs")"
  assert_ledger "$pv" '.status.nodes["node-a"].phase == "granted"'

  # The pod's bind mount still there (kubelet has not removed it): the device and the hold stay, not set to autoclear.
  volume_start a "$pv"
  device=$volume_device
  bind="$LATCH_TMP/bind-$pv"
  mkdir -p "$bind"
  mount --bind "$volume_path" "$bind"
  PATH="$LATCH_TMP/notebin:$PATH" node_call_success a unmountdevice "$volume_path"
  [[ $reply_message == *"still mounted elsewhere"* ]] || fail "unmountdevice should say the device stays: $reply_message"
  assert_not_mounted "$volume_path"
  assert_loop_count "$pv" 1
  assert_equal "$loop_devices" "$device"
  assert_equal "$(<"/sys/block/${device#/dev/}/loop/autoclear")" 0
  assert_ledger "$pv" '.status.nodes["node-a"].phase == "attached"'
  umount "$bind"
  node_call_success a unmountdevice "$volume_path"
  assert_loop_count "$pv" 0
  node_call_success a detach "$pv" node-a
}

@test "self-contained build: a pod's lifecycle starts its children and takes its locks through the native helper of its runtime" {
  local sea="$LATCH_REPO_ROOT/bin/latch-sea" pv
  if [[ ! -x $sea ]]; then
    [[ ${LATCH_REQUIRE_SEA:-} == 1 ]] && fail "$sea is missing: run 'npm run build:sea'"
    skip "$sea is missing: run 'npm run build:sea'"
  fi
  # Where kubelet runs it; the build's RPATH names its runtime directory by absolute path (build.mjs).
  cp "$sea" "$LATCH_EXEC"
  pv=$(unique_name pv)
  volume_start a "$pv"
  assert_mounted "$volume_path" "$volume_device" ext4 rw
  volume_stop a "$pv"
  assert_loop_count "$pv" 0
  # Each of the calls that ran a tool (losetup, mkfs.ext4, mount, umount) or took the volume's lock logs why when it
  # went without the helper.
  run jq -c -s '[.[] | select(.op == "waitforattach" or .op == "mountdevice" or .op == "unmountdevice")]
    | {calls: length, without: [.[] | select(has("nativeHelperUnavailable")) | .nativeHelperUnavailable]}' "$LATCH_TMP/log/latch.log"
  assert_success
  assert_output '{"calls":3,"without":[]}'
}

# ---- data ------------------------------------------------------------------------------------------------

@test "data survives a move from node-a to node-b: 64 MiB checksum, and fsck is clean" {
  local pv sum
  pv=$(unique_name pv)
  volume_start a "$pv" size 256Mi
  head -c 64M /dev/urandom >"$volume_path/data.bin"
  sum=$(sha_of "$volume_path/data.bin")
  volume_stop a "$pv"
  assert_loop_count "$pv" 0
  assert_not_mounted "$(node_global_path a "$pv")"

  volume_start b "$pv" size 256Mi
  assert_mounted "$volume_path" "$volume_device" ext4 rw
  assert_equal "$(stat -c %s "$volume_path/data.bin")" $((64 * 1024 * 1024))
  assert_equal "$(sha_of "$volume_path/data.bin")" "$sum"
  volume_stop b "$pv"
  assert_loop_count "$pv" 0
  fsck_clean "$LATCH_POOL_DIR/$pv.img"
}

@test "read-only: readwrite ro mounts a formatted volume ro, and writing fails with EROFS" {
  local pv ro device path
  pv=$(unique_name pv)
  volume_start a "$pv"
  echo formatted >"$volume_path/file"
  volume_stop a "$pv"

  ro=$(flex_options "$pv" kubernetes.io/readwrite ro)
  node_call_success a attach "$ro" node-a
  node_call_success a waitforattach "" "$ro"
  device=$(reply_field device)
  path=$(node_global_path a "$pv")
  node_call_success a mountdevice "$path" "$device" "$ro"
  assert_mounted "$path" "$device" ext4 ro
  assert_equal "$(<"$path/file")" formatted
  run ! touch "$path/new-file"
  assert_output --partial 'Read-only file system'
  run ! sh -c 'echo x >>"$1"' sh "$path/file"
  assert_output --partial 'Read-only file system'
  assert_equal "$(<"$path/file")" formatted
  volume_stop a "$pv"
  fsck_clean "$LATCH_POOL_DIR/$pv.img"
}

@test "a volume holding xfs asked for as ext4 is refused by mountdevice and left untouched" {
  local pv xfs device path sum asked options
  pv=$(unique_name pv)
  volume_start a "$pv" size 320Mi fsType xfs
  assert_mounted "$volume_path" "$volume_device" xfs
  head -c 1M /dev/urandom >"$volume_path/file.bin"
  sum=$(sha_of "$volume_path/file.bin")
  path=$volume_path
  node_call_success a unmountdevice "$path"

  node_call_success a waitforattach "" "$(flex_options "$pv")"
  device=$(reply_field device)
  for asked in "fsType ext4" "kubernetes.io/fsType ext4"; do
    # shellcheck disable=SC2086
    options=$(flex_options "$pv" $asked)
    node_call a mountdevice "$path" "$device" "$options"
    assert_failure_naming xfs ext4
    assert_not_mounted "$path"
    assert_equal "$(fs_type_of "$device")" xfs
  done

  # still the same xfs with the same data
  node_call_success a mountdevice "$path" "$device" "$(restart_options "$pv")"
  assert_mounted "$path" "$device" xfs
  assert_equal "$(sha_of "$path/file.bin")" "$sum"
  volume_stop a "$pv"
  assert_equal "$(fs_type_of "$LATCH_POOL_DIR/$pv.img")" xfs
}

# ---- arbitration between nodes ---------------------------------------------------------------------------

@test "multi-attach: node-b is refused while node-a holds the volume, and gets it after node-a lets go" {
  local pv options
  pv=$(unique_name pv)
  options=$(flex_options "$pv")
  volume_start a "$pv"

  node_call b attach "$options" node-b
  assert_failure_naming node-a
  node_call b isattached "$options" node-b
  assert_attached_reply false
  node_call a isattached "$options" node-a
  assert_attached_reply true
  assert_mounted "$volume_path" "$volume_device" ext4 rw
  assert_loop_count "$pv" 1

  volume_stop a "$pv"
  node_call_success b attach "$options" node-b
  node_call b isattached "$options" node-b
  assert_attached_reply true
  volume_start b "$pv"
  volume_stop b "$pv"
}

# fence_setup PV -- node-a has PV mounted, and the controller force-detaches it from node-a (its 6-minute timeout).
fence_setup() {
  local pv=$1 options
  options=$(flex_options "$pv")
  volume_start a "$pv"
  echo "from node-a" >"$volume_path/file"
  node_call_success a detach "$pv" node-a
  # node-a still has it: nothing on the node changed, and the ledger keeps it fenced to node-a
  assert_mounted "$volume_path" "$volume_device" ext4 rw
  assert_loop_count "$pv" 1
  assert_ledger "$pv" '.status.nodes["node-a"].phase == "detaching" and .status.state == "detaching"'

  node_call b attach "$options" node-b
  assert_failure_naming node-a
  [[ $reply_message == *detaching* || $reply_message == *waiting* ]] ||
    fail "node-b's attach should say it waits for node-a to detach: $reply_message"
  node_call b isattached "$options" node-b
  assert_attached_reply false
}

@test "force-detach fence: node-b waits until node-a really unmounts" {
  local pv options started elapsed_ms path_a
  pv=$(unique_name pv)
  options=$(flex_options "$pv")
  fence_setup "$pv"
  path_a=$volume_path

  started=${EPOCHREALTIME/./}
  node_call b waitforattach "" "$options"
  elapsed_ms=$(((${EPOCHREALTIME/./} - started) / 1000))
  assert_failure_naming node-a
  ((elapsed_ms >= 2000)) || fail "waitforattach on node-b gave up after ${elapsed_ms} ms, before its 2 s timeout"
  assert_mounted "$path_a" "$volume_device" ext4 rw
  assert_loop_count "$pv" 1

  node_call_success a unmountdevice "$path_a"
  assert_not_mounted "$path_a"
  assert_loop_count "$pv" 0
  node_call_success b attach "$options" node-b
  node_call b isattached "$options" node-b
  assert_attached_reply true
  volume_start b "$pv"
  assert_equal "$(<"$volume_path/file")" "from node-a"
  volume_stop b "$pv"
}

@test "force-detach fence: the admin's 'volume release --node node-a --node-is-down' lets node-b attach" {
  local pv options path_a
  pv=$(unique_name pv)
  options=$(flex_options "$pv")
  fence_setup "$pv"
  path_a=$volume_path

  # without the confirmation nothing happens
  run --separate-stderr "$LATCH_EXEC" volume release "$pv" --node node-a
  assert_failure
  node_call b attach "$options" node-b
  assert_failure_naming node-a

  run --separate-stderr "$LATCH_EXEC" volume release "$pv" --node node-a --node-is-down
  assert_success
  node_call_success b attach "$options" node-b
  node_call b isattached "$options" node-b
  assert_attached_reply true
  assert_ledger "$pv" '(.status.nodes | keys) == ["node-b"]'

  # node-a comes back and cleans up: node-b keeps the volume
  node_call_success a unmountdevice "$path_a"
  assert_not_mounted "$path_a"
  assert_loop_count "$pv" 0
  node_call b isattached "$options" node-b
  assert_attached_reply true
  volume_start b "$pv"
  assert_equal "$(<"$volume_path/file")" "from node-a"
  volume_stop b "$pv"
}

# ---- bad input: a clean Failure, and nothing changed ------------------------------------------------------

# bystander -- a volume mounted on node-a that no bad call may disturb; sets $bystander_device.
bystander() {
  bystander_pv=$(unique_name bystander)
  volume_start a "$bystander_pv"
  bystander_device=$volume_device
}

# refused NODE ARGS... -- the call is a Failure with a message that is not an internal error.
refused() {
  node_call "$@"
  assert_reply Failure
  refute_internal_error
}

@test "bad volume names (/, .., spaces, 300 characters, shell metacharacters) are refused, nothing changed" {
  local before name pv path marker
  bystander
  marker="/tmp/pwned-$$-$RANDOM"
  path=$(node_global_path a "$(unique_name pv)")
  before=$(kernel_state)
  local names=(
    "a/b" "../escape" ".." "has space" "$(printf 'a%.0s' {1..300})"
    "\$(touch $marker-dollar)" "x;touch $marker-semi" "\`touch $marker-tick\`" "Upper" ""
  )
  for name in "${names[@]}"; do
    pv=$(unique_name pv)
    # as the PV name and as the user's volume option, controller side and node side, and as detach's argument
    refused a attach "$(flex_options "$name")" node-a
    refused a attach "$(flex_options "$pv" volume "$name")" node-a
    refused a mountdevice "$path" "$bystander_device" "$(flex_options "$pv" volume "$name")"
    refused a detach "$name" node-a
  done
  assert_kernel_state_unchanged "$before" "the calls with bad names"
  assert_mounted "$volume_path" "$bystander_device" ext4 rw
  run compgen -G "$marker*"
  assert_output ""
}

@test "bad sizes (-1, abc, 0, above maxSize) are refused, nothing created" {
  local before size pv
  bystander
  before=$(kernel_state)
  for size in -1 abc 0 5Gi "1Gi; rm -rf /" ""; do
    pv=$(unique_name pv)
    refused a attach "$(flex_options "$pv" size "$size")" node-a
    [[ $size != 5Gi ]] || [[ $reply_message == *maxSize* || $reply_message == *limit* ]] ||
      fail "the refusal of size 5Gi should name maxSize: $reply_message"
    [[ ! -e $LATCH_POOL_DIR/$pv.img ]] || fail "an image was created for size '$size'"
  done
  # node side too: waitforattach creates a missing image
  refused a waitforattach "" "$(flex_options "$pv" size 5Gi)"
  assert_kernel_state_unchanged "$before" "the calls with bad sizes"
}

@test "a bad fsType ('ext4; rm -rf /', ntfs...) is refused by attach and mountdevice; the device stays blank" {
  local pv before fs key path
  pv=$(unique_name pv)
  volume_attach a "$pv"
  path=$(node_global_path a "$pv")
  before=$(kernel_state)
  for fs in "ext4; rm -rf /" "ntfs" "ext4,exec"; do
    for key in fsType kubernetes.io/fsType; do
      refused a attach "$(flex_options "$(unique_name pv)" "$key" "$fs")" node-a
      refused a mountdevice "$path" "$volume_device" "$(flex_options "$pv" "$key" "$fs")"
    done
  done
  assert_kernel_state_unchanged "$before" "the calls with bad fsTypes"
  assert_not_mounted "$path"
  assert_equal "$(fs_type_of "$volume_device")" ""
}

@test "mountOptions outside the allowlist are refused and the device is not touched; allowed ones work" {
  local pv before opts path
  pv=$(unique_name pv)
  volume_attach a "$pv"
  path=$(node_global_path a "$pv")
  before=$(kernel_state)
  refused a attach "$(flex_options "$(unique_name pv)" mountOptions "exec,suid=0")" node-a
  for opts in "exec,suid=0" "suid" "nosuid,exec" "remount" "bind" "rw,dev" "uid=0" "x-mount.mkdir" \
    "noatime;reboot" "noatime -o exec" "context=system_u:object_r:etc_t:s0"; do
    refused a mountdevice "$path" "$volume_device" "$(flex_options "$pv" mountOptions "$opts")"
  done
  assert_kernel_state_unchanged "$before" "the calls with bad mountOptions"
  assert_not_mounted "$path"
  assert_equal "$(fs_type_of "$volume_device")" ""

  node_call_success a mountdevice "$path" "$volume_device" "$(flex_options "$pv" mountOptions "noatime,nodev,nosuid")"
  assert_mounted "$path" "$volume_device" ext4 rw
  run findmnt -n -r --mountpoint "$path" -o OPTIONS
  assert_output --regexp '(^|,)noatime(,|$)'
  assert_output --regexp '(^|,)nodev(,|$)'
  assert_output --regexp '(^|,)nosuid(,|$)'
  volume_stop a "$pv"
}

@test "mountdevice refuses another volume's device, /dev/vda and a symlink to another device; nothing changed" {
  local one two dev_one dev_two path before link
  one=$(unique_name pv)
  two=$(unique_name pv)
  volume_attach a "$one"
  dev_one=$volume_device
  volume_attach a "$two"
  dev_two=$volume_device
  path=$(node_global_path a "$one")
  link="$LATCH_TMP/dev-link"
  ln -s "$dev_two" "$link"
  before=$(kernel_state)

  refused a mountdevice "$path" "$dev_two" "$(flex_options "$one")"
  assert_failure_naming "$two"
  refused a mountdevice "$path" "$link" "$(flex_options "$one")"
  assert_failure_naming "$two"
  refused a mountdevice "$path" /dev/vda "$(flex_options "$one")"
  refused a mountdevice "$path" /dev/loop999999 "$(flex_options "$one")"
  refused a mountdevice "$path" /dev/null "$(flex_options "$one")"

  assert_kernel_state_unchanged "$before" "mountdevice with wrong devices"
  assert_not_mounted "$path"
  assert_equal "$(fs_type_of "$dev_one")" ""
  assert_equal "$(fs_type_of "$dev_two")" ""
}

@test "mountdevice refuses a mount path that is a regular file; the file and the device are untouched" {
  local pv path before
  pv=$(unique_name pv)
  volume_attach a "$pv"
  path="$(dirname "$(node_global_path a "$pv")")/$pv-file"
  rmdir "$(node_global_path a "$pv")"
  echo "not a directory" >"$path"
  before=$(kernel_state)

  refused a mountdevice "$path" "$volume_device" "$(flex_options "$pv")"
  assert_kernel_state_unchanged "$before" "mountdevice on a regular file"
  assert_equal "$(<"$path")" "not a directory"
  [[ -f $path ]] || fail "$path is no longer a regular file"
  assert_equal "$(fs_type_of "$volume_device")" ""
}

@test "unmountdevice refuses a path where something that is not a latch volume is mounted" {
  local path before
  bystander
  path=$(node_global_path a "$(unique_name pv)")
  mount -t tmpfs -o size=1m latch-test-tmpfs "$path"
  before=$(kernel_state)
  refused a unmountdevice "$path"
  assert_kernel_state_unchanged "$before" "unmountdevice of a foreign mount"
  assert_mounted "$path" latch-test-tmpfs tmpfs
}

# ---- the demo -------------------------------------------------------------------------------------------

@test "latch demo exits 0 and leaves no loop device, mount or directory behind" {
  local work
  run --separate-stderr "$LATCH_EXEC" demo
  assert_success
  assert_equal "$stderr" ""
  assert_output --partial 'Demo finished'
  refute_output --partial 'NOT AS EXPECTED'
  # The snapshot and backup/restore round trip through job tickets: asked for on node-a, the snapshot (beside the pod:
  # frozen on a pool that reflinks, else crash-consistent, never a whole-image copy under freeze) and the backup done
  # by node-b's agent, which holds the volume; the restore into a new volume by node-a's agent; the file read back on
  # node-a with the checksum it had on node-b.
  assert_output --partial 'asked node node-b for it: ticket snapshot-'
  assert_output --regexp 'the job: succeeded: snapshot demo-snapshot of volume pv-demo created \([^)]*(frozen|never made under freeze)\)'
  assert_output --partial 'asked node node-b for it: ticket backup-'
  assert_output --partial 'the job: succeeded: backup demo-backup of volume pv-demo created'
  assert_output --partial 'asked node node-a for it: ticket restore-'
  assert_output --partial 'the job: succeeded: restored backup demo-backup (volume pv-demo) onto volume pv-restored'
  assert_output --partial 'the restored filesystem: mounted, never reformatted'
  local written restored
  written=$(sed -n 's/^\[pod on node-b\] sha256 of hello.txt: \([0-9a-f]\{64\}\)$/\1/p' <<<"$output")
  restored=$(sed -n 's/^\[pod on node-a\] read hello.txt from the restored volume: sha256 \([0-9a-f]\{64\}\) (the same)$/\1/p' <<<"$output")
  [[ -n $written && $written == "$restored" ]] || fail "the restored hello.txt has sha256 '$restored', not '$written'"
  work=$(grep -o '/tmp/latch-demo-[A-Za-z0-9]*' <<<"$output" | head -n 1)
  [[ -n $work ]] || fail "the demo did not say where it worked"
  [[ ! -e $work ]] || fail "the demo left $work behind"
  run losetup --list --noheadings --raw --output NAME,BACK-FILE
  refute_output --partial "$work"
  run findmnt -r -n -o TARGET
  refute_output --partial "$work"
}
