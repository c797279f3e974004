# Shared by every bats file: loads bats-support/bats-assert and gives each test a hermetic latch environment.
#
# Use it like this:
#
#   load 'test_helper/common-setup'
#   setup()    { latch_setup; }
#   teardown() { latch_teardown; }
#
# What a test gets (all under $LATCH_TMP, a directory inside BATS_TEST_TMPDIR that bats removes afterwards):
#   LATCH_CONFIG   the config in use (nodeName node-a, attach true, waitForAttachTimeout 2, file store; oneHost: the
#                  simulated nodes share its ledger and pool)
#   LATCH_STATE_DIR, LATCH_POOL_DIR, LATCH_LOG_FILE   where that config points
#   LATCH_KUBELET_ROOT   a stand-in for /var/lib/kubelet, for global mount and pod volume paths
#   LATCH_EXEC     the driver as kubelet runs it: a copy of bin/latch in a plugin dir <...>/latch~loop/loop
#   the working directory is $LATCH_TMP/cwd, which must still be empty at teardown (no relative writes)
#
# Helpers: latch_call, make_config, use_config, go_json, flex_options, flex_mount_options, unique_name,
# global_mount_path, pod_volume_dir, latch_on_teardown, assert_reply, assert_failure_naming, log_entries,
# refute_secret_written; latch_check_reply for a driver started another way (run it through _latch_exec, which
# records its pid). teardown unmounts and detaches whatever a test left under $LATCH_TMP, then checks that nothing
# was written into a plugin dir, relative to the working directory, or to a default path outside the temp dir
# (log lines there from pids this test did not start, e.g. another suite running on the same host, are ignored).

bats_require_minimum_version 1.5.0

LATCH_REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
load "$LATCH_REPO_ROOT/node_modules/bats-support/load.bash"
load "$LATCH_REPO_ROOT/node_modules/bats-assert/load.bash"

: "${LATCH_BIN:=$LATCH_REPO_ROOT/bin/latch}"

# Places a misbehaving driver would write to by default. They must look the same after a test as before it.
LATCH_GUARDED_PATHS=(
  /var/lib/latch
  /var/log/latch
  /etc/latch
  /run/latch
  /usr/libexec/kubernetes/kubelet-plugins/volume/exec
  /etc/kubernetes/kubelet-plugins/volume/exec
)
# Names no test may create in /tmp (the shell-injection probes use them).
LATCH_GUARDED_TMP_GLOB='pwned*'
# The host's lock directory (src/sys/lock.ts): every driver call takes its volume lock and turn there, by design, and
# leaves the lock files in place; not a misbehaving write. Made before the snapshot, so that its parent stays the same.
LATCH_HOST_LOCK_DIR=/var/lib/latch/locks

latch_setup() {
  [[ -x $LATCH_BIN ]] || fail "$LATCH_BIN is missing or not executable: run 'npm run build' in $LATCH_REPO_ROOT"

  LATCH_TMP="$BATS_TEST_TMPDIR/latch"
  LATCH_STATE_DIR="$LATCH_TMP/state"
  LATCH_POOL_DIR="$LATCH_TMP/pool"
  LATCH_LOG_DIR="$LATCH_TMP/log"
  LATCH_KUBELET_ROOT="$LATCH_TMP/kubelet"
  LATCH_PLUGIN_ROOT="$LATCH_TMP/kubelet-plugins/volume/exec"
  LATCH_PLUGIN_DIR="$LATCH_PLUGIN_ROOT/latch~loop"
  LATCH_EXEC="$LATCH_PLUGIN_DIR/loop"
  export LATCH_TMP LATCH_STATE_DIR LATCH_POOL_DIR LATCH_KUBELET_ROOT LATCH_PLUGIN_DIR LATCH_EXEC

  mkdir -p "$LATCH_STATE_DIR" "$LATCH_POOL_DIR" "$LATCH_LOG_DIR" "$LATCH_KUBELET_ROOT" \
    "$LATCH_PLUGIN_DIR" "$LATCH_TMP/home" "$LATCH_TMP/tmp" "$LATCH_TMP/cwd" "$LATCH_TMP/configs"
  # Installed the way kubelet finds it; the copy also keeps a test stable while someone rebuilds bin/latch.
  cp "$LATCH_BIN" "$LATCH_EXEC"

  # Nothing from the developer's shell leaks in, and anything written to ~ or $TMPDIR stays in the test.
  export HOME="$LATCH_TMP/home" TMPDIR="$LATCH_TMP/tmp"
  unset NODE_OPTIONS NODE_DEBUG NODE_V8_COVERAGE
  cd "$LATCH_TMP/cwd" || fail "cannot enter $LATCH_TMP/cwd"

  LATCH_BASE_CONFIG="$LATCH_TMP/config.json"
  jq -n \
    --arg stateDir "$LATCH_STATE_DIR" --arg poolDir "$LATCH_POOL_DIR" --arg logFile "$LATCH_LOG_DIR/latch.log" \
    '{stateDir: $stateDir, poolDir: $poolDir, logFile: $logFile, nodeName: "node-a", driverName: "latch/loop",
      attach: true, oneHost: true, defaultSize: "64Mi", maxSize: "1Gi", defaultFsType: "ext4",
      waitForAttachTimeout: 2, commandTimeout: 20, store: {type: "file"}}' >"$LATCH_BASE_CONFIG"
  use_config "$LATCH_BASE_CONFIG"

  LATCH_TEARDOWN_HOOKS=()
  [[ -d $LATCH_HOST_LOCK_DIR ]] || install -d -m 0700 "$LATCH_HOST_LOCK_DIR"
  _latch_guard_snapshot >"$BATS_TEST_TMPDIR/guarded.before"
  latch_last_call=""
}

latch_teardown() {
  local problems=()
  local i
  for ((i = ${#LATCH_TEARDOWN_HOOKS[@]} - 1; i >= 0; i--)); do
    eval "${LATCH_TEARDOWN_HOOKS[i]}" || problems+=("teardown hook failed: ${LATCH_TEARDOWN_HOOKS[i]}")
  done
  _latch_release_mounts_and_loops || problems+=("could not release every mount or loop device under $LATCH_TMP")

  local strays
  strays=$(find "$LATCH_PLUGIN_ROOT" -mindepth 1 ! -path "$LATCH_PLUGIN_DIR" ! -path "$LATCH_EXEC" 2>/dev/null) || true
  [[ -z $strays ]] || problems+=("files appeared in the plugin dir (kubelet re-probes on every change):"$'\n'"$strays")
  strays=$(find "$LATCH_TMP/cwd" -mindepth 1 2>/dev/null) || true
  [[ -z $strays ]] || problems+=("files were written relative to the working directory:"$'\n'"$strays")
  local changed=""
  if [[ -f $BATS_TEST_TMPDIR/guarded.before ]]; then
    changed=$(_latch_guard_report "$BATS_TEST_TMPDIR/guarded.before")
  fi
  [[ -z $changed ]] || problems+=("this test's driver calls changed files outside its temp dir:"$'\n'"$changed")

  cd "$BATS_TEST_TMPDIR" || true
  if ((${#problems[@]} > 0)); then
    printf '%s\n' "${problems[@]}" | batslib_decorate 'teardown found leftovers' | fail
  fi
}

# Registers a command (a string, eval'd) to run at teardown, last registered first, even when the test fails.
latch_on_teardown() {
  LATCH_TEARDOWN_HOOKS+=("$*")
}

_latch_guard_snapshot() {
  local path
  for path in "${LATCH_GUARDED_PATHS[@]}"; do
    if [[ -e $path ]]; then
      find "$path" -path "$LATCH_HOST_LOCK_DIR" -prune -o -printf '%y %m %s %T@ %p\n' 2>/dev/null | sort -k5
    else
      echo "absent - - - $path"
    fi
  done
  find /tmp -maxdepth 1 -name "$LATCH_GUARDED_TMP_GLOB" -printf '%y %m %s %T@ %p\n' 2>/dev/null | sort -k5
}

# _latch_guard_report BEFORE -- prints what changed in the guarded paths since BEFORE. Other processes on this
# host (someone else's test run, an admin) may append to a default log too: a file that only grew by JSON lines
# whose pid is not one of this test's driver processes is not this test's doing and is not reported.
_latch_guard_report() {
  local before=$1 line type mode size time path old
  local -A old_line=() new_line=()
  while IFS= read -r line; do
    old_line[${line#* * * * }]=$line
  done <"$before"
  while IFS= read -r line; do
    new_line[${line#* * * * }]=$line
  done < <(_latch_guard_snapshot)
  for path in "${!old_line[@]}" "${!new_line[@]}"; do
    [[ ${old_line[$path]-} == "${new_line[$path]-}" ]] && continue
    old=${old_line[$path]-}
    read -r type mode size time _ <<<"${new_line[$path]-x x x x}"
    if [[ $type == f && $old == "f $mode "* ]]; then
      local old_size appended
      old_size=$(cut -d' ' -f3 <<<"$old")
      if ((size > old_size)); then
        appended=$(tail -c "+$((old_size + 1))" "$path" 2>/dev/null | head -c 100000)
        _latch_foreign_lines "$appended" && continue
        printf 'appended to %s:\n%s\n' "$path" "${appended:0:2000}"
        continue
      fi
    fi
    printf 'before: %s\nafter:  %s\n' "${old:-(not there)}" "${new_line[$path]:-(not there)}"
  done | awk '!seen[$0]++'
}

# _latch_foreign_lines TEXT -- true when TEXT is JSON lines that all carry a pid this test did not start.
_latch_foreign_lines() {
  [[ -n $1 ]] || return 1
  local ours="[]"
  [[ -s $BATS_TEST_TMPDIR/driver.pids ]] && ours=$(jq -sc . "$BATS_TEST_TMPDIR/driver.pids")
  jq -se --argjson ours "$ours" 'length > 0 and all(.[]; type == "object" and (.pid | type) == "number"
    and ((.pid as $p | $ours | index([$p])) | not))' <<<"$1" >/dev/null 2>&1
}

# Unmounts everything mounted at or below $LATCH_TMP (deepest first), then detaches loop devices backed by files
# below it. Only ever touches what this test created.
_latch_release_mounts_and_loops() {
  local ok=0 target backing file dev
  [[ -n ${LATCH_TMP:-} && -d $LATCH_TMP ]] || return 0
  while IFS= read -r target; do
    umount "$target" 2>/dev/null || umount -l "$target" 2>/dev/null || ok=1
  done < <(awk -v root="$LATCH_TMP" '{ p = $5; gsub(/\\040/, " ", p) } p == root || index(p, root "/") == 1 { print p }' \
    /proc/self/mountinfo | awk '{ print length($0) "\t" $0 }' | sort -rn | cut -f2-)
  for backing in /sys/block/loop*/loop/backing_file; do
    # a device may be detached between the glob and the read (another suite's, at the same time: CI saw it)
    { IFS= read -r file <"$backing"; } 2>/dev/null || continue
    if [[ $file == "$LATCH_TMP"/* ]]; then
      dev=${backing#/sys/block/}
      dev=/dev/${dev%%/*}
      losetup -d "$dev" 2>/dev/null || ok=1
    fi
  done
  return "$ok"
}

# ---- configuration ---------------------------------------------------------------------------------------

# make_config [-o FILE] KEY=VALUE... -- writes the base config with overrides and prints the file's path.
# VALUE is used as JSON when it parses as JSON (false, 30, "\"abc\"", {"type":"file"}), else as a string.
# KEY may be a dotted path (store.type=file). -KEY removes a key.
make_config() {
  local file=""
  if [[ ${1:-} == -o ]]; then
    file=$2
    shift 2
  fi
  [[ -n $file ]] || file=$(mktemp "$LATCH_TMP/configs/config-XXXXXX")
  local json kv key value
  json=$(<"$LATCH_BASE_CONFIG")
  for kv in "$@"; do
    if [[ $kv == -* ]]; then
      json=$(jq -c --arg k "${kv#-}" 'delpaths([$k | split(".")])' <<<"$json") || return 1
      continue
    fi
    [[ $kv == *=* ]] || { echo "make_config: expected KEY=VALUE, got '$kv'" >&2; return 2; }
    key=${kv%%=*}
    value=${kv#*=}
    if ! jq -n --argjson v "$value" '$v' >/dev/null 2>&1; then
      value=$(jq -n --arg v "$value" '$v')
    fi
    json=$(jq -c --arg k "$key" --argjson v "$value" 'setpath($k | split("."); $v)' <<<"$json") || return 1
  done
  printf '%s\n' "$json" >"$file"
  printf '%s\n' "$file"
}

# use_config FILE -- makes FILE the config of later calls (LATCH_CONFIG) and follows its logFile.
use_config() {
  export LATCH_CONFIG=$1
  local log
  log=$(jq -r '.logFile // empty' "$1" 2>/dev/null) || log=""
  LATCH_LOG_FILE=${log:-$LATCH_LOG_DIR/latch.log}
  export LATCH_LOG_FILE
}

# ---- options JSON as kubelet sends it ----------------------------------------------------------------------

# go_json KEY VALUE... -- prints what Go's json.Marshal(map[string]string) prints: compact, keys sorted,
# <, >, & escaped as \u003c \u003e \u0026 (and U+2028/U+2029 as \u2028/\u2029).
go_json() {
  if (($# % 2 != 0)); then
    echo "go_json: expected KEY VALUE pairs, got $# arguments" >&2
    return 2
  fi
  jq -cnS '$ARGS.positional as $a | reduce range(0; $a | length; 2) as $i ({}; . + {($a[$i]): $a[$i + 1]})' \
    --args "$@" |
    sed -e 's/</\\u003c/g' -e 's/>/\\u003e/g' -e 's/&/\\u0026/g' \
      -e $'s/\xe2\x80\xa8/\\\\u2028/g' -e $'s/\xe2\x80\xa9/\\\\u2029/g'
}

# flex_options VOLUME [KEY VALUE]... -- the options of attach/isattached/waitforattach/mountdevice/expandfs:
# kubernetes.io/fsType "", readwrite rw, pvOrVolumeName VOLUME; extra pairs are added (or override).
flex_options() {
  local volume=$1
  shift
  go_json kubernetes.io/fsType "" kubernetes.io/pvOrVolumeName "$volume" kubernetes.io/readwrite rw "$@"
}

# flex_mount_options VOLUME POD_UID [KEY VALUE]... -- the options of mount: flex_options plus the pod keys.
flex_mount_options() {
  local volume=$1 uid=$2
  shift 2
  flex_options "$volume" kubernetes.io/pod.name "pod-$uid" kubernetes.io/pod.namespace default \
    kubernetes.io/pod.uid "$uid" kubernetes.io/serviceAccount.name default "$@"
}

# ---- names and kubelet paths --------------------------------------------------------------------------------

# unique_name [PREFIX] -- a valid, per-test unique volume/resource name.
unique_name() {
  printf '%s-t%s-%s%s\n' "${1:-vol}" "${BATS_SUITE_TEST_NUMBER:-0}" "$$" "$RANDOM"
}

# global_mount_path VOLUME -- where kubelet asks for the device mount (created, like kubelet does, 0750).
global_mount_path() {
  local path="$LATCH_KUBELET_ROOT/plugins/kubernetes.io/flexvolume/latch/loop/mounts/$1"
  mkdir -p -m 0750 "$path"
  printf '%s\n' "$path"
}

# pod_volume_dir POD_UID VOLUME -- the pod's volume dir kubelet passes to mount/unmount (created).
pod_volume_dir() {
  local path="$LATCH_KUBELET_ROOT/pods/$1/volumes/latch~loop/$2"
  mkdir -p -m 0750 "$path"
  printf '%s\n' "$path"
}

# ---- calling the driver ------------------------------------------------------------------------------------

# latch_call ARGS... -- runs the driver like kubelet does and asserts the FlexVolume output contract:
# nothing on stderr, stdout exactly one JSON object, a known status with well-typed fields, exit 0 for
# Success/Not supported and 1 for Failure. Leaves $output, $stderr, $status; sets $reply_status, $reply_message.
latch_call() {
  _latch_remember_call "$@"
  run --separate-stderr _latch_exec "$@"
  latch_check_reply
}

# _latch_exec ARGS... -- execs the driver, first noting its pid (exec keeps it) so that the teardown can tell this
# test's log lines from another process's.
_latch_exec() {
  echo "$BASHPID" >>"$BATS_TEST_TMPDIR/driver.pids"
  exec "$LATCH_EXEC" "$@"
}

# Keeps a printable form of the call for failure messages ($latch_last_call), long arguments cut.
_latch_remember_call() {
  local shown=() arg
  for arg in "$@"; do
    ((${#arg} > 200)) && arg="${arg:0:200}...(${#arg} bytes)"
    shown+=("$(printf '%q' "$arg")")
  done
  latch_last_call="latch ${shown[*]}"
}

# latch_check_reply -- the contract checks of latch_call, on $output/$stderr/$status already set
# (for a driver run some other way, e.g. in the background; call _latch_remember_call first).
latch_check_reply() {
  reply_status=""
  reply_message=""
  local problem="" verdict
  # One jq pass: line 1 is "ok <status>" or the problem, the lines after it the message.
  if [[ -n ${stderr:-} ]]; then
    problem="stderr is not empty (kubelet parses stdout and stderr together)"
  elif ! verdict=$(jq -rs '
      def typed($k; $t): (has($k) | not) or (.[$k] | type) == $t;
      if length != 1 then "stdout holds \(length) JSON values, not exactly one"
      elif (.[0] | type) != "object" then "stdout is JSON but not an object"
      else .[0]
        | if (.status == "Success" or .status == "Failure" or .status == "Not supported") | not then
            ".status is not \"Success\", \"Failure\" or \"Not supported\""
          elif (typed("message"; "string") and typed("device"; "string") and typed("volumeName"; "string")
              and typed("attached"; "boolean") and typed("capabilities"; "object")
              and typed("volumeNewSize"; "number")) | not then
            "a reply field has the wrong JSON type (kubelet rejects the whole reply)"
          else "ok \(.status)\n\(.message // "")"
          end
      end' <<<"$output" 2>/dev/null); then
    problem="stdout is not JSON"
  elif [[ $verdict != "ok "* ]]; then
    problem=$verdict
  else
    local first=${verdict%%$'\n'*}
    reply_status=${first#ok }
    reply_message=${verdict#*$'\n'}
    local want=0
    [[ $reply_status == Failure ]] && want=1
    [[ $status == "$want" ]] || problem="exit status is $status, but status \"$reply_status\" requires $want"
  fi
  if [[ -n $problem ]]; then
    batslib_print_kv_single_or_multi 8 \
      'call' "${latch_last_call:-}" 'exit' "$status" 'stdout' "$output" 'stderr' "${stderr:-}" |
      batslib_decorate "FlexVolume contract broken: $problem" | fail
  fi
}

# assert_reply STATUS -- after latch_call: the reply's status is STATUS.
assert_reply() {
  [[ $reply_status == "$1" ]] ||
    batslib_print_kv_single_or_multi 8 'call' "$latch_last_call" 'expected' "$1" 'actual' "$reply_status" \
      'stdout' "$output" |
    batslib_decorate 'unexpected reply status' | fail
}

# assert_failure_naming TEXT... -- after latch_call: Failure, and the message contains every TEXT
# (and is not an internal error: the caller's mistake must be reported as such).
assert_failure_naming() {
  assert_reply Failure
  local text
  for text in "$@"; do
    [[ $reply_message == *"$text"* ]] ||
      batslib_print_kv_single_or_multi 9 'call' "$latch_last_call" 'must name' "$text" 'message' "$reply_message" |
      batslib_decorate 'the failure message does not name what is wrong' | fail
  done
  refute_internal_error
}

# refute_internal_error -- after latch_call: a Failure's message is non-empty and not "internal error".
refute_internal_error() {
  if [[ $reply_status == Failure ]]; then
    [[ -n $reply_message ]] || fail "Failure with an empty message: $latch_last_call -> $output"
    [[ $reply_message != *"internal error"* ]] ||
      batslib_print_kv_single_or_multi 7 'call' "$latch_last_call" 'message' "$reply_message" |
      batslib_decorate 'an input error was reported as an internal error' | fail
  fi
}

# ---- the log ------------------------------------------------------------------------------------------------

# log_entries -- prints the call log's lines (nothing when there is no log).
log_entries() {
  [[ -f $LATCH_LOG_FILE ]] && cat "$LATCH_LOG_FILE"
  return 0
}

# refute_secret_written TEXT... -- no TEXT appears in the last reply or in any file of the test environment
# (log, state, pool, configs).
refute_secret_written() {
  local text hits
  for text in "$@"; do
    [[ $output != *"$text"* ]] || fail "secret '$text' appears in the reply: $output"
    hits=$(grep -rlF -- "$text" "$LATCH_TMP" 2>/dev/null) || true
    [[ -z $hits ]] || fail "secret '$text' was written to: $hits"
  done
}
