# Helpers for tests that use real loop devices, real filesystems and real mounts. Load after common-setup:
#
#   load 'test_helper/common-setup'
#   load 'test_helper/volume-setup'
#   setup()    { volume_setup; }
#   teardown() { volume_teardown; }
#
# What a test gets on top of common-setup (everything under $LATCH_TMP):
#   two nodes, node-a and node-b: configs $NODE_A_CONFIG / $NODE_B_CONFIG sharing one stateDir and one poolDir
#     (two nodes sharing storage, as in `latch demo`); maxSize 4Gi, waitForAttachTimeout 2 s.
#   node_call NODE ARGS...      latch_call with that node's config (NODE is a, b, node-a or node-b)
#   node_global_path NODE PV    kubelet's global device mount path on that node (created 0750, as kubelet does)
#   node_pod_dir NODE UID PV    a pod volume dir on that node (created)
#   volume_start NODE PV [KEY VALUE]...   attach + waitforattach + mountdevice, each asserted Success; sets
#                                         $volume_device and $volume_path
#   volume_stop NODE PV         unmountdevice + detach, each asserted Success
#   kernel_state                snapshot for before/after comparisons: loop devices of the pool, mounts under
#                               $LATCH_TMP, the ledger (latch volume list -o json), pool and state listings
#   assert_kernel_state_unchanged BEFORE   diff against an earlier kernel_state
#   volume_loops VOLUME / assert_loop_count VOLUME N / assert_mounted PATH DEVICE FSTYPE [ro|rw] /
#   assert_not_mounted PATH / ledger_doc VOLUME / assert_ledger VOLUME JQ [WHAT] / fs_type_of DEVICE_OR_IMAGE
#   latch_spawn NODE ARGS...    the driver in the background (for SIGKILL tests); $spawned_pid, $spawned_out
#   spawned_processes / wait_spawned_gone   the spawned drivers and every child they left (found by an env mark)
#   spawn_and_kill_during [-s S] TOOL NODE ARGS...   SIGKILL the driver while a slowed-down TOOL (a wrapper first on
#                               PATH that sleeps S seconds, then runs the real one) is its running child
# volume_teardown kills what latch_spawn started (and its orphans), unmounts everything under $LATCH_TMP,
# detaches every loop device backed by the pool (or anything under $LATCH_TMP), then runs latch_teardown. It runs
# even when the test failed.

volume_setup() {
  if [[ $(id -u) != 0 || ! -e /dev/loop-control ]]; then
    skip "needs root and loop devices"
  fi
  latch_setup
  NODE_A_CONFIG=$(make_config -o "$LATCH_TMP/configs/node-a.json" nodeName=node-a maxSize=4Gi waitForAttachTimeout=2)
  NODE_B_CONFIG=$(make_config -o "$LATCH_TMP/configs/node-b.json" nodeName=node-b maxSize=4Gi waitForAttachTimeout=2)
  export NODE_A_CONFIG NODE_B_CONFIG
  use_config "$NODE_A_CONFIG"
  LATCH_SPAWN_MARK="LATCH_TEST_SPAWN=$LATCH_TMP"
  spawn_seq=0
  volume_device=""
  volume_path=""
}

volume_teardown() {
  [[ -n ${LATCH_TMP:-} && -d ${LATCH_TMP:-/nonexistent} ]] || return 0
  local problems=()
  _volume_kill_spawned || problems+=("processes started by the test were still running and had to be killed")
  _volume_release_all || problems+=("could not unmount or detach everything under $LATCH_TMP")
  # common-setup's teardown: hooks, its own release pass, and the checks for stray files.
  latch_teardown
  if ((${#problems[@]} > 0)); then
    printf '%s\n' "${problems[@]}" | batslib_decorate 'volume teardown' | fail
  fi
}

# ---- nodes and paths ---------------------------------------------------------------------------------------

# node_config NODE -- the config file of node a|b|node-a|node-b.
node_config() {
  case $1 in
    a | node-a) printf '%s\n' "$NODE_A_CONFIG" ;;
    b | node-b) printf '%s\n' "$NODE_B_CONFIG" ;;
    *) fail "node_config: unknown node '$1' (a or b)" ;;
  esac
}

# node_name NODE -- node-a or node-b.
node_name() {
  case $1 in
    a | node-a) echo node-a ;;
    b | node-b) echo node-b ;;
    *) fail "node_name: unknown node '$1'" ;;
  esac
}

# node_call NODE ARGS... -- latch_call as that node's kubelet (or the controller, which only needs argv).
node_call() {
  local -x LATCH_CONFIG
  LATCH_CONFIG=$(node_config "$1") || return 1
  shift
  latch_call "$@"
}

# node_call_success NODE ARGS... -- node_call, and the reply must be Success.
node_call_success() {
  node_call "$@"
  assert_reply Success
}

# node_global_path NODE PV -- <kubelet root of NODE>/plugins/kubernetes.io/flexvolume/latch/loop/mounts/PV (0750).
node_global_path() {
  local path
  path="$LATCH_TMP/kubelet-$(node_name "$1")/plugins/kubernetes.io/flexvolume/latch/loop/mounts/$2"
  mkdir -p -m 0750 "$path"
  printf '%s\n' "$path"
}

# node_pod_dir NODE UID PV -- <kubelet root of NODE>/pods/UID/volumes/latch~loop/PV (created).
node_pod_dir() {
  local path
  path="$LATCH_TMP/kubelet-$(node_name "$1")/pods/$2/volumes/latch~loop/$3"
  mkdir -p -m 0750 "$path"
  printf '%s\n' "$path"
}

# restart_options PV -- what calls carry after a kubelet restart: the three kubernetes.io keys, nothing else.
restart_options() {
  go_json kubernetes.io/fsType "" kubernetes.io/pvOrVolumeName "$1" kubernetes.io/readwrite rw
}

# volume_attach NODE PV [KEY VALUE]... -- attach + waitforattach (no mountdevice) with flex_options PV plus the
# pairs; each must be Success. Sets $volume_device.
volume_attach() {
  local node=$1 pv=$2 options
  shift 2
  options=$(flex_options "$pv" "$@")
  node_call_success "$node" attach "$options" "$(node_name "$node")"
  node_call_success "$node" waitforattach "" "$options"
  volume_device=$(jq -r '.device // ""' <<<"$output")
  [[ $volume_device == /dev/loop* ]] || fail "waitforattach replied device '$volume_device', not a loop device: $output"
}

# volume_start NODE PV [KEY VALUE]... -- the pod-start calls (attach, waitforattach, mountdevice) with
# flex_options PV plus the pairs; each must be Success. Sets $volume_device and $volume_path.
volume_start() {
  local node=$1 pv=$2
  volume_attach "$@"
  shift 2
  volume_path=$(node_global_path "$node" "$pv")
  node_call_success "$node" mountdevice "$volume_path" "$volume_device" "$(flex_options "$pv" "$@")"
}

# volume_stop NODE PV -- the pod-stop calls: unmountdevice of the node's global path, then detach; both Success.
volume_stop() {
  local node=$1 pv=$2
  node_call_success "$node" unmountdevice "$(node_global_path "$node" "$pv")"
  node_call_success "$node" detach "$pv" "$(node_name "$node")"
}

# ---- the kernel, the pool and the ledger -------------------------------------------------------------------

# volume_loops VOLUME -- the loop devices whose backing file is the volume's image (one per line, sorted).
volume_loops() {
  local image="$LATCH_POOL_DIR/$1.img" backing file dev
  for backing in /sys/block/loop*/loop/backing_file; do
    # a device may be detached between the glob and the read
    { IFS= read -r file <"$backing"; } 2>/dev/null || continue
    file=${file% (deleted)}
    if [[ $file == "$image" ]]; then
      dev=${backing#/sys/block/}
      echo "/dev/${dev%%/*}"
    fi
  done | sort -V
}

# assert_loop_count VOLUME N -- exactly N loop devices are backed by the volume's image; sets $loop_devices.
assert_loop_count() {
  loop_devices=$(volume_loops "$1")
  local count=0
  [[ -z $loop_devices ]] || count=$(wc -l <<<"$loop_devices")
  [[ $count == "$2" ]] ||
    batslib_print_kv_single_or_multi 8 'volume' "$1" 'expected' "$2 loop device(s)" 'actual' "${loop_devices:-(none)}" \
      'losetup' "$(losetup -a)" | batslib_decorate 'wrong number of loop devices for the image' | fail
}

# assert_mounted PATH DEVICE FSTYPE [ro|rw] -- findmnt shows DEVICE at PATH with FSTYPE (and that mode).
assert_mounted() {
  local path=$1 device=$2 fstype=$3 mode=${4:-} found source fs options
  found=$(findmnt -n -r --mountpoint "$path" -o SOURCE,FSTYPE,OPTIONS | tail -n 1)
  read -r source fs options <<<"$found"
  if [[ $source != "$device" || $fs != "$fstype" || (-n $mode && ,$options, != *",$mode,"*) ]]; then
    batslib_print_kv_single_or_multi 8 'path' "$path" 'expected' "$device $fstype ${mode:-}" \
      'findmnt' "${found:-(nothing mounted)}" | batslib_decorate 'not mounted as expected' | fail
  fi
}

# assert_not_mounted PATH -- findmnt shows nothing at PATH.
assert_not_mounted() {
  local found
  found=$(findmnt -n -r --mountpoint "$1" -o SOURCE,FSTYPE,OPTIONS) || true
  [[ -z $found ]] || fail "expected nothing mounted at $1, findmnt shows: $found"
}

# fs_type_of DEVICE_OR_IMAGE -- the filesystem blkid finds by a low-level probe, "" for none.
fs_type_of() {
  blkid -p -o value -s TYPE "$1" 2>/dev/null || true
}

# ledger_doc VOLUME -- the volume's ledger document (latch volume inspect -o json); "null" when it does not exist.
ledger_doc() {
  local doc
  if doc=$(LATCH_CONFIG=$NODE_A_CONFIG "$LATCH_EXEC" volume inspect "$1" -o json 2>/dev/null); then
    printf '%s\n' "$doc"
  else
    echo null
  fi
}

# assert_ledger VOLUME JQ [WHAT] -- the volume's ledger document satisfies the jq filter.
assert_ledger() {
  local doc
  doc=$(ledger_doc "$1")
  jq -e "$2" <<<"$doc" >/dev/null ||
    batslib_print_kv_single_or_multi 8 'volume' "$1" 'expected' "${3:-$2}" 'ledger' "$doc" |
    batslib_decorate 'the ledger is not as expected' | fail
}

# kernel_state -- what a call may change, for before/after comparisons: loop devices backed by the pool, mounts
# under $LATCH_TMP, the ledger as `latch volume list -o json`, the pool and the state dir listings.
kernel_state() {
  echo '# loop devices (losetup) backed by the pool'
  losetup --list --noheadings --raw --output NAME,BACK-FILE,RO |
    awk -v pool="$LATCH_POOL_DIR/" 'index($2, pool) == 1' | sort
  echo "# mounts under the test's temp dir"
  findmnt -r -n -o TARGET,SOURCE,FSTYPE,OPTIONS | awk -v root="$LATCH_TMP/" 'index($1, root) == 1' | sort
  echo '# ledger (latch volume list -o json)'
  LATCH_CONFIG=$NODE_A_CONFIG "$LATCH_EXEC" volume list -o json 2>&1 | jq -S . 2>&1
  echo '# pool'
  find "$LATCH_POOL_DIR" -mindepth 1 -printf '%P %y %m %s\n' 2>/dev/null | sort
  echo '# state'
  find "$LATCH_STATE_DIR" -mindepth 1 -printf '%P %y %m\n' 2>/dev/null | sort
}

# assert_kernel_state_unchanged BEFORE [WHAT] -- kernel_state now equals BEFORE.
assert_kernel_state_unchanged() {
  local now diff_text
  now=$(kernel_state)
  diff_text=$(diff <(printf '%s\n' "$1") <(printf '%s\n' "$now")) && return 0
  batslib_print_kv_single_or_multi 6 'after' "${2:-${latch_last_call:-}}" 'diff' "$diff_text" |
    batslib_decorate 'the kernel state or the ledger changed' | fail
}

# ---- background calls and SIGKILL --------------------------------------------------------------------------

# latch_spawn NODE ARGS... -- starts the driver in the background as NODE, stdout/stderr to files; marks it
# (and every child it starts) with LATCH_TEST_SPAWN in the environment. Sets $spawned_pid and $spawned_out
# (stdout file; stderr is $spawned_out.err).
latch_spawn() {
  local config
  config=$(node_config "$1") || return 1
  shift
  _latch_remember_call "$@"
  spawn_seq=$((spawn_seq + 1))
  spawned_out="$BATS_TEST_TMPDIR/spawn-$spawn_seq.out"
  LATCH_CONFIG=$config LATCH_TEST_SPAWN=$LATCH_TMP "$LATCH_EXEC" "$@" >"$spawned_out" 2>"$spawned_out.err" 3>&- &
  spawned_pid=$!
}

# kill_spawned -- SIGKILL for the spawned driver (only the driver: its children live on, as after kubelet's kill),
# and reaps it.
kill_spawned() {
  kill -KILL "$spawned_pid" 2>/dev/null || true
  wait "$spawned_pid" 2>/dev/null || true
}

# spawned_processes -- pids of live processes carrying this test's spawn mark (spawned drivers and their orphans).
# One grep over every environ: the mark is only in the environment of what latch_spawn started (and its children),
# never in this shell's, since it is passed as a command prefix.
spawned_processes() {
  grep -lszxF -e "$LATCH_SPAWN_MARK" /proc/[0-9]*/environ | sed -e 's|^/proc/||' -e 's|/environ$||' || true
}

# spawned_commands -- "pid comm" of each spawned_processes entry (for messages and for finding a child by name).
spawned_commands() {
  local pid comm
  for pid in $(spawned_processes); do
    { IFS= read -r comm <"/proc/$pid/comm"; } 2>/dev/null || continue
    echo "$pid $comm"
  done
}

# wait_spawned_gone [SECONDS] -- waits until no spawned process (or orphan of one) is left; fails otherwise.
wait_spawned_gone() {
  local until=$((SECONDS + ${1:-20})) left
  while :; do
    left=$(spawned_commands)
    [[ -z $left ]] && return 0
    ((SECONDS < until)) || fail "processes left by a killed driver are still running: $left"
    sleep 0.1
  done
}

# slow_tool TOOL SECONDS -- puts a wrapper for TOOL (e.g. mkfs.ext4, losetup, umount) in $LATCH_TMP/slowbin that
# sleeps SECONDS and then runs the real one: a window in which a kill hits the driver while its child is running.
slow_tool() {
  _wrap_tool slowbin "$1" "sleep $2"
}

# noting_tool TOOL -- puts a wrapper for TOOL in $LATCH_TMP/notebin that appends each run's arguments to
# $LATCH_TMP/TOOL.runs and then runs the real one: with that dir first on PATH, a test sees whether a call ran TOOL.
noting_tool() {
  _wrap_tool notebin "$1" "echo \"\$*\" >>$(printf %q "$LATCH_TMP/$1.runs")"
}

# _wrap_tool DIR TOOL LINE -- writes $LATCH_TMP/DIR/TOOL, a script that runs LINE and then execs the real TOOL.
_wrap_tool() {
  local real
  real=$(PATH=/usr/local/sbin:/usr/sbin:/sbin:$PATH command -v "$2") || fail "no $2 to wrap"
  mkdir -p "$LATCH_TMP/$1"
  printf '#!/bin/bash\n%s\nexec %q "$@"\n' "$3" "$real" >"$LATCH_TMP/$1/$2"
  chmod +x "$LATCH_TMP/$1/$2"
}

# spawn_and_kill_during [-s SECONDS] TOOL NODE ARGS... -- latch_spawn with a slow TOOL (slow_tool TOOL SECONDS,
# default 2) first on PATH, waits until the driver runs TOOL, and SIGKILLs the driver: TOOL lives on as an orphan,
# as after kubelet's kill.
spawn_and_kill_during() {
  local seconds=2 seen="" until tool
  if [[ $1 == -s ]]; then
    seconds=$2
    shift 2
  fi
  tool=$1
  shift
  slow_tool "$tool" "$seconds"
  PATH="$LATCH_TMP/slowbin:$PATH" latch_spawn "$@"
  until=$((SECONDS + 20))
  while [[ -z $seen ]] && ((SECONDS < until)); do
    seen=$(spawned_commands | awk -v tool="$tool" '$2 == tool')
    [[ -n $seen ]] || sleep 0.02
  done
  [[ -n $seen ]] || fail "the spawned call never ran $tool: $latch_last_call (output: $(cat "$spawned_out"))"
  kill_spawned
}

# sleep_ms MS
sleep_ms() {
  sleep "$(printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)))"
}

# ---- teardown internals -----------------------------------------------------------------------------------

# Kills (by pid) whatever latch_spawn started and is still running, orphans included. Returns 1 if any was found.
_volume_kill_spawned() {
  [[ -n ${LATCH_SPAWN_MARK:-} ]] || return 0
  local pids found=0 tries
  for tries in 1 2 3 4 5 6 7 8 9 10; do
    pids=$(spawned_processes)
    [[ -z $pids ]] && break
    found=1
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.2
  done
  wait 2>/dev/null || true
  return "$found"
}

# Unmounts everything at or below $LATCH_TMP (deepest first, retried, lazily as a last resort), then detaches
# every loop device backed by a file below $LATCH_TMP (the pool, deleted images included).
_volume_release_all() {
  local ok=0 target backing file dev attempt
  for attempt in 1 2 3; do
    local targets=()
    mapfile -t targets < <(awk -v root="$LATCH_TMP" '{ p = $5; gsub(/\\040/, " ", p) } p == root || index(p, root "/") == 1 { print p }' \
      /proc/self/mountinfo | awk '{ print length($0) "\t" $0 }' | sort -rn | cut -f2-)
    ((${#targets[@]} == 0)) && break
    for target in "${targets[@]}"; do
      if ((attempt < 3)); then
        umount "$target" 2>/dev/null || true
      else
        umount "$target" 2>/dev/null || umount -l "$target" 2>/dev/null || ok=1
      fi
    done
    sleep 0.1
  done
  for attempt in 1 2 3 4; do
    local left=0
    for backing in /sys/block/loop*/loop/backing_file; do
      { IFS= read -r file <"$backing"; } 2>/dev/null || continue
      [[ $file == "$LATCH_TMP"/* ]] || continue
      left=1
      ((attempt == 4)) && break
      dev=${backing#/sys/block/}
      dev=/dev/${dev%%/*}
      losetup -d "$dev" 2>/dev/null || true
    done
    ((left == 0)) && break
    ((attempt == 4)) && ok=1
    sleep 0.3
  done
  return "$ok"
}
