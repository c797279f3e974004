#!/usr/bin/env bats
# Issue 15: a node releases by itself a hold its own kernel proves it no longer has, with real loop devices and
# mounts: in the next driver call on that node (the marker a killed waitforattach leaves behind) and in
# `latch agent --once`; and it keeps the hold while a device of the volume is still mounted.
# Needs root; each test skips with a message otherwise.

load 'test_helper/common-setup'
load 'test_helper/volume-setup'

setup() {
  volume_setup
}

teardown() {
  volume_teardown
}

# leave_stale_detaching PV -- attach and waitforattach on node-a, then what a reboot (or a killed call) and the
# controller's detach leave: no loop device, the ledger still says node-a is detaching. node-b waits for the volume.
leave_stale_detaching() {
  local pv=$1 options
  options=$(flex_options "$pv")
  volume_attach a "$pv"
  node_call b attach "$options" node-b
  assert_reply Failure
  losetup -d "$volume_device"
  assert_loop_count "$pv" 0
  node_call_success a detach "$pv" node-a
  assert_ledger "$pv" '.status.nodes["node-a"].phase == "detaching"' 'node-a is detaching'
}

# mark_hold_to_check PV -- the marker waitforattach writes before claiming (a call killed before the device was
# recorded leaves it behind).
mark_hold_to_check() {
  mkdir -p "$LATCH_STATE_DIR/holds-to-check/node-a"
  : >"$LATCH_STATE_DIR/holds-to-check/node-a/$1"
}

@test "the next call on the node releases a marked hold whose device is gone, and node-b gets the volume" {
  local pv other
  pv=$(unique_name pv)
  other=$(unique_name other)
  leave_stale_detaching "$pv"
  mark_hold_to_check "$pv"

  # Any node call on node-a, here an unmountdevice of a path with nothing mounted.
  node_call_success a unmountdevice "$(node_global_path a "$other")"

  assert_ledger "$pv" '.status.nodes["node-a"] == null' 'node-a no longer holds the volume'
  assert_ledger "$pv" '.status.automatic[-1].kind == "released" and .status.automatic[-1].node == "node-a"' 'the release is recorded'
  [[ ! -e $LATCH_STATE_DIR/holds-to-check/node-a/$pv ]] || fail "the marker is still there"
  log_entries | jq -e --arg pv "$pv" 'select(.op == "unmountdevice") | .automatic[]? | select(.kind == "released")' >/dev/null ||
    fail "the call's log line does not record the release"

  node_call_success b attach "$(flex_options "$pv")" node-b
  node_call_success b waitforattach "" "$(flex_options "$pv")"
}

@test "latch agent --once releases a stale detaching hold without any marker; doctor shows it" {
  local pv
  pv=$(unique_name pv)
  leave_stale_detaching "$pv"

  # Without a marker a driver call does not look (it stays as cheap as before); the agent does.
  node_call_success a unmountdevice "$(node_global_path a "$(unique_name other)")"
  assert_ledger "$pv" '.status.nodes["node-a"].phase == "detaching"' 'an unmarked hold is left to the agent'

  run env LATCH_CONFIG="$NODE_B_CONFIG" "$LATCH_EXEC" agent --once
  assert_success
  assert_ledger "$pv" '.status.nodes["node-a"].phase == "detaching"' "node-b's agent never releases node-a's hold"

  run env LATCH_CONFIG="$NODE_A_CONFIG" "$LATCH_EXEC" agent --once
  assert_success
  assert_ledger "$pv" '.status.nodes["node-a"] == null' 'node-a no longer holds the volume'

  run env LATCH_CONFIG="$NODE_A_CONFIG" "$LATCH_EXEC" doctor
  assert_output --regexp "automatic +[^ ]+: volume $pv, node node-a: released"
}

@test "a node whose device is still mounted keeps its hold: in the next call, and in the agent" {
  local pv other
  pv=$(unique_name pv)
  other=$(unique_name other)
  volume_start a "$pv"
  node_call_success a detach "$pv" node-a
  mark_hold_to_check "$pv"

  node_call_success a unmountdevice "$(node_global_path a "$other")"
  assert_ledger "$pv" '.status.nodes["node-a"].phase == "detaching"' 'node-a keeps its hold'
  run env LATCH_CONFIG="$NODE_A_CONFIG" "$LATCH_EXEC" agent --once
  assert_success
  assert_ledger "$pv" '.status.nodes["node-a"].phase == "detaching"' 'node-a keeps its hold'
  assert_mounted "$volume_path" "$volume_device" ext4 rw

  # Also when the ledger's view of the device is gone: a mount of a loop device over the (now deleted) image.
  rm "$LATCH_POOL_DIR/$pv.img"
  run env LATCH_CONFIG="$NODE_A_CONFIG" "$LATCH_EXEC" agent --once
  assert_success
  assert_ledger "$pv" '.status.nodes["node-a"].phase == "detaching"' 'node-a keeps its hold over a deleted image'
  assert_ledger "$pv" '(.status.automatic // []) | length == 0' 'nothing was done automatically'

  node_call_success a unmountdevice "$volume_path"
  assert_ledger "$pv" '.status.nodes["node-a"] == null' 'unmountdevice released it'
}
