# Non-attach mode (attach: false) on two simulated nodes, for nonattach.bats and resize.bats. Load after
# common-setup and volume-setup:
#
#   load 'test_helper/common-setup'
#   load 'test_helper/volume-setup'
#   load 'test_helper/nonattach-setup'
#   setup()    { nonattach_setup; }
#   teardown() { volume_teardown; }
#
# What a test gets on top of volume-setup (which it runs first, so everything there works, node_call included):
#   NODE_A_CONFIG / NODE_B_CONFIG   now non-attach configs (attach false, maxSize 1Gi) of node-a and node-b,
#                                   sharing one stateDir (the ledger) and one poolDir, as two nodes sharing storage
#   ATTACH_A_CONFIG / ATTACH_B_CONFIG   volume-setup's attach-mode configs of the same nodes (same ledger and pool)
#   pod_mount NODE UID PV [KEY VALUE]...   kubelet's `mount <podDir> <json>` for pod UID (options as kubelet sends
#                                           them for mount: flex_mount_options); sets $pod_dir. No assertion.
#   pod_mount_ok ... / pod_unmount_ok NODE UID PV   the same, asserting Success
#   pod_unmount NODE UID PV              kubelet's `unmount <podDir>`; sets $pod_dir. No assertion.
#   staging_of NODE PV                   the node-private staging mount path of the volume
#   mount_count PATH                     how many mounts are stacked at PATH (from mountinfo)
#   assert_released PV                   no loop device, no staging mount, and a ledger with no ticket and no node
#   pod_tickets PV                       `latch ticket list PV -o json`
#   has_cap_sys_resource                 true when this process has CAP_SYS_RESOURCE (CapEff bit 24)
#   tree_sum DIR                         one checksum over every file below DIR (names and contents)
#   fs_bytes PATH                        the filesystem size df reports for PATH, in bytes

nonattach_setup() {
  volume_setup
  ATTACH_A_CONFIG=$NODE_A_CONFIG
  ATTACH_B_CONFIG=$NODE_B_CONFIG
  NODE_A_CONFIG=$(make_config -o "$LATCH_TMP/configs/node-a-nonattach.json" nodeName=node-a attach=false maxSize=1Gi \
    waitForAttachTimeout=2)
  NODE_B_CONFIG=$(make_config -o "$LATCH_TMP/configs/node-b-nonattach.json" nodeName=node-b attach=false maxSize=1Gi \
    waitForAttachTimeout=2)
  export ATTACH_A_CONFIG ATTACH_B_CONFIG NODE_A_CONFIG NODE_B_CONFIG
  use_config "$NODE_A_CONFIG"
}

pod_mount() {
  local node=$1 uid=$2 pv=$3
  shift 3
  pod_dir=$(node_pod_dir "$node" "$uid" "$pv")
  node_call "$node" mount "$pod_dir" "$(flex_mount_options "$pv" "$uid" "$@")"
}

pod_mount_ok() {
  pod_mount "$@"
  assert_reply Success
}

pod_unmount() {
  pod_dir="$LATCH_TMP/kubelet-$(node_name "$1")/pods/$2/volumes/latch~loop/$3"
  node_call "$1" unmount "$pod_dir"
}

pod_unmount_ok() {
  pod_unmount "$@"
  assert_reply Success
}

staging_of() {
  printf '%s\n' "$LATCH_STATE_DIR/staging/$(node_name "$1")/$2"
}

mount_count() {
  awk -v p="$1" '{ m = $5; gsub(/\\040/, " ", m) } m == p { n++ } END { print n + 0 }' /proc/self/mountinfo
}

assert_released() {
  local pv=$1 node
  assert_loop_count "$pv" 0
  for node in a b; do
    assert_not_mounted "$(staging_of "$node" "$pv")"
  done
  assert_ledger "$pv" '.spec.tickets == {} and .status.nodes == {} and .status.state == "detached"' \
    'no ticket, no node, state detached'
}

pod_tickets() {
  LATCH_CONFIG=$NODE_A_CONFIG "$LATCH_EXEC" ticket list "$1" -o json
}

has_cap_sys_resource() {
  local capeff
  capeff=$(awk '/^CapEff:/ { print $2 }' /proc/self/status)
  [[ -n $capeff ]] && (((16#$capeff >> 24) & 1))
}

tree_sum() {
  (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
}

fs_bytes() {
  df -B1 --output=size "$1" | tail -n 1 | tr -d ' '
}
