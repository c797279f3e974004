#!/usr/bin/env bats
# The FlexVolume call contract (docs/protocol.md), for every op in the table and for ops that are not in it.
# Every driver call goes through latch_call, which asserts on each path: nothing on stderr, exactly one JSON
# object on stdout, a known status, exit 0 for Success/Not supported and 1 for Failure.
# Ops that are still being written may answer Success or Failure to valid input; these tests only demand that
# a Failure says something a person can act on.

load 'test_helper/common-setup'

setup() {
  latch_setup
  VOL=$(unique_name pv)
  POD_UID=$(unique_name uid)
}

teardown() {
  latch_teardown
}

# Argument names after the op, as the op definitions in src/ops/*.ts and docs/protocol.md give them.
declare -gA OP_ARGS=(
  [init]=""
  [getvolumename]="json"
  [attach]="json nodeName"
  [isattached]="json nodeName"
  [detach]="pvOrVolumeName nodeName"
  [waitforattach]="devicePath json"
  [mountdevice]="deviceMountPath devicePath json"
  [unmountdevice]="deviceMountPath"
  [mount]="podVolumeDir json"
  [unmount]="podVolumeDir"
  [expandfs]="json devicePath podVolumeDir newBytes oldBytes"
  [expandvolume]="json deviceMountPath newBytes oldBytes"
)
ALL_OPS=(init getvolumename attach isattached detach waitforattach mountdevice unmountdevice mount unmount expandfs
  expandvolume)
JSON_OPS=(getvolumename attach isattached waitforattach mountdevice mount expandfs expandvolume)

# Arguments kubelet may legitimately pass as "" (optionalPath in src/ops/*.ts): the attach reply carries no
# device, and a non-attachable driver has none to give expandfs.
MAY_BE_EMPTY=" waitforattach:devicePath expandfs:devicePath "
# Ops kubelet and the controller only call on an attachable driver (attachModeOnly in src/ops/*.ts).
ATTACH_MODE_OPS=(attach isattached detach waitforattach mountdevice unmountdevice)

# valid_args OP -- sets ARGS to a minimal valid argv for OP (after the op), for volume $VOL on node-a.
# No device exists: a devicePath names a file that is not there, so no op can touch a real device.
valid_args() {
  local device="$LATCH_TMP/dev/no-such-device"
  case $1 in
    init) ARGS=() ;;
    getvolumename) ARGS=("$(flex_options "$VOL")") ;;
    attach | isattached) ARGS=("$(flex_options "$VOL")" node-a) ;;
    detach) ARGS=("$VOL" node-a) ;;
    waitforattach) ARGS=("" "$(flex_options "$VOL")") ;;
    mountdevice) ARGS=("$(global_mount_path "$VOL")" "$device" "$(flex_options "$VOL")") ;;
    unmountdevice) ARGS=("$(global_mount_path "$VOL")") ;;
    mount) ARGS=("$(pod_volume_dir "$POD_UID" "$VOL")" "$(flex_mount_options "$VOL" "$POD_UID")") ;;
    unmount) ARGS=("$(pod_volume_dir "$POD_UID" "$VOL")") ;;
    expandfs) ARGS=("$(flex_options "$VOL")" "$device" "$(pod_volume_dir "$POD_UID" "$VOL")" 2147483648 1073741824) ;;
    expandvolume) ARGS=("$(flex_options "$VOL")" "$(global_mount_path "$VOL")" 2147483648 1073741824) ;;
    *) fail "valid_args: unknown op $1" ;;
  esac
}

# arg_index OP NAME -- prints NAME's position in OP's argv.
arg_index() {
  local names i=0 name
  read -ra names <<<"${OP_ARGS[$1]}"
  for name in "${names[@]}"; do
    [[ $name == "$2" ]] && { echo "$i"; return 0; }
    i=$((i + 1))
  done
  fail "arg_index: $1 has no argument $2"
}

# call_with OP NAME VALUE -- calls OP with valid arguments except NAME, which is VALUE.
call_with() {
  local op=$1 index
  index=$(arg_index "$op" "$2")
  valid_args "$op"
  ARGS[index]=$3
  latch_call "$op" "${ARGS[@]}"
}

# call_with_options OP JSON -- calls OP with valid arguments except the options JSON.
call_with_options() {
  call_with "$1" json "$2"
}

check_valid_minimal_input() {
  valid_args "$1"
  latch_call "$1" "${ARGS[@]}"
  refute_internal_error
}

check_missing_argument() {
  local op=$1 names
  read -ra names <<<"${OP_ARGS[$op]}"
  valid_args "$op"
  local n=${#ARGS[@]}
  latch_call "$op" "${ARGS[@]:0:n-1}"
  assert_failure_naming "<${names[n - 1]}>"
  latch_call "$op"
  assert_failure_naming "<${names[0]}>"
}

check_extra_argument() {
  valid_args "$1"
  latch_call "$1" "${ARGS[@]}" extra
  assert_failure_naming "$1" argument
}

check_empty_arguments() {
  local op=$1 names name
  read -ra names <<<"${OP_ARGS[$op]}"
  for name in "${names[@]}"; do
    call_with "$op" "$name" ""
    if [[ $MAY_BE_EMPTY == *" $op:$name "* ]]; then
      [[ $reply_message != *"<$name>"* ]] || fail "$op refused an empty <$name>, which kubelet may pass: $output"
      refute_internal_error
    else
      assert_failure_naming "<$name>"
    fi
  done
}

# ---- init ------------------------------------------------------------------------------------------------

@test "init: Success with all five capabilities as booleans, supportsMetrics true" {
  latch_call init
  assert_reply Success
  run jq -e '.capabilities
    | (.attach | type) == "boolean" and (.selinuxRelabel | type) == "boolean" and (.fsGroup | type) == "boolean"
      and (.requiresFSResize | type) == "boolean" and .supportsMetrics == true' <<<"$output"
  assert_success
}

@test "init: capabilities.attach follows the config's attach" {
  latch_call init
  assert_reply Success
  assert_equal "$(jq -c '.capabilities.attach' <<<"$output")" true

  use_config "$(make_config attach=false)"
  latch_call init
  assert_reply Success
  assert_equal "$(jq -c '.capabilities.attach' <<<"$output")" false
}

@test "init: creates no file besides its log line" {
  local before after non_attaching
  non_attaching=$(make_config attach=false)
  before=$(find "$LATCH_TMP" ! -path "$LATCH_LOG_FILE" -printf '%y %m %p\n' | sort)
  latch_call init
  assert_reply Success
  use_config "$non_attaching"
  latch_call init
  assert_reply Success
  after=$(find "$LATCH_TMP" ! -path "$LATCH_LOG_FILE" -printf '%y %m %p\n' | sort)
  assert_equal "$after" "$before"
}

@test "init: does not create a missing log directory" {
  use_config "$(make_config logFile="$LATCH_TMP/no-log-dir/latch.log")"
  latch_call init
  assert_reply Success
  refute [ -e "$LATCH_TMP/no-log-dir" ]
}

@test "init: an extra argument is a Failure" {
  check_extra_argument init
}

@test "the op table of these tests matches the op definitions in src/ops" {
  local expected op names
  expected=$(for op in "${ALL_OPS[@]}"; do
    read -ra names <<<"${OP_ARGS[$op]}"
    printf '%s %s\n' "$op" "${names[*]}"
  done | sort)
  # Read in the repository, where tsx resolves; the subshell keeps the test's working directory.
  run --separate-stderr bash -c 'cd "$1" && node --import tsx -e "$2"' _ "$LATCH_REPO_ROOT" '
    import("./src/protocol/ops.ts").then(async (m) => {
      const OPS = m.OPS ?? m.default.OPS;
      for (const [op, load] of Object.entries(OPS)) {
        const definition = await load();
        const args = Object.entries(definition.args);
        console.log(`${op} ${args.map(([name]) => name).join(" ")}`.trimEnd());
        for (const [name, kind] of args) if (kind.mayBeEmpty) console.log(`empty ${op}:${name}`);
        if (definition.attachModeOnly) console.log(`attach-only ${op}`);
      }
    })'
  assert_success
  assert_equal "$(grep -v '^empty \|^attach-only ' <<<"$output" | sed 's/ *$//' | sort)" "$(sed 's/ *$//' <<<"$expected")"
  assert_equal "$(grep '^empty ' <<<"$output" | cut -d' ' -f2 | sort | tr '\n' ' ')" \
    "$(tr ' ' '\n' <<<"$MAY_BE_EMPTY" | grep . | sort | tr '\n' ' ')"
  assert_equal "$(grep '^attach-only ' <<<"$output" | cut -d' ' -f2 | sort)" \
    "$(printf '%s\n' "${ATTACH_MODE_OPS[@]}" | sort)"
}

@test "attach-mode ops answer Not supported (exit 0) when the config says attach: false" {
  use_config "$(make_config attach=false)"
  local op
  for op in "${ATTACH_MODE_OPS[@]}"; do
    valid_args "$op"
    latch_call "$op" "${ARGS[@]}"
    assert_reply "Not supported"
  done
}

# ---- ops that are not in the table -----------------------------------------------------------------------

@test "unknown op foo: Not supported, exit 0" {
  latch_call foo
  assert_reply "Not supported"
}

@test "unknown op waitfordetach: Not supported, exit 0" {
  latch_call waitfordetach "$LATCH_TMP/dev/no-such-device" "$(flex_options "$VOL")"
  assert_reply "Not supported"
}

@test "unknown op getdevicemountpath: Not supported, exit 0" {
  latch_call getdevicemountpath "$(flex_options "$VOL")"
  assert_reply "Not supported"
}

@test "unknown op: logged to the configured log file, nowhere else" {
  latch_call foo
  assert_reply "Not supported"
  run jq -e -s 'map(select(.op == "foo")) | length == 1' "$LATCH_LOG_FILE"
  assert_success
}

# ---- valid minimal input: the contract holds whatever the op answers today ---------------------------------

@test "getvolumename: valid minimal input keeps the contract" {
  check_valid_minimal_input getvolumename
}

@test "attach: valid minimal input keeps the contract" {
  check_valid_minimal_input attach
}

@test "attach: an inline volume named like a PV cannot point the PV's alias at another volume (Failure, alias kept)" {
  local data evil
  data=$(unique_name data)
  evil=$(unique_name evil)
  latch_call attach "$(flex_options "$VOL" volume "$data")" node-a
  assert_success
  latch_call attach "$(flex_options "$VOL" volume "$evil")" node-b
  assert_failure
  assert_equal "$(jq -r .message <<<"$output")" "PV name $VOL already stands for volume $data; latch never points it at volume $evil"
  # detach still reaches the PV's own volume, and no volume was made for the other name.
  latch_call detach "$VOL" node-a
  assert_success
  assert_equal "$(jq -c '.spec.tickets' <<<"$("$LATCH_EXEC" volume inspect "$data" -o json)")" '{}'
  run "$LATCH_EXEC" volume inspect "$evil"
  assert_failure
}

@test "isattached: valid minimal input keeps the contract" {
  check_valid_minimal_input isattached
}

@test "detach: valid minimal input keeps the contract" {
  check_valid_minimal_input detach
}

@test "waitforattach: valid minimal input keeps the contract" {
  check_valid_minimal_input waitforattach
}

@test "mountdevice: valid minimal input keeps the contract" {
  check_valid_minimal_input mountdevice
}

@test "unmountdevice: valid minimal input keeps the contract" {
  check_valid_minimal_input unmountdevice
}

@test "mount: valid minimal input keeps the contract" {
  check_valid_minimal_input mount
}

@test "unmount: valid minimal input keeps the contract" {
  check_valid_minimal_input unmount
}

@test "expandfs: valid minimal input keeps the contract" {
  check_valid_minimal_input expandfs
}

@test "expandvolume: valid minimal input keeps the contract" {
  check_valid_minimal_input expandvolume
}

# ---- argument count ----------------------------------------------------------------------------------------

@test "getvolumename: a missing argument is a Failure naming it" {
  check_missing_argument getvolumename
}

@test "attach: a missing argument is a Failure naming it" {
  check_missing_argument attach
}

@test "isattached: a missing argument is a Failure naming it" {
  check_missing_argument isattached
}

@test "detach: a missing argument is a Failure naming it" {
  check_missing_argument detach
}

@test "waitforattach: a missing argument is a Failure naming it" {
  check_missing_argument waitforattach
}

@test "mountdevice: a missing argument is a Failure naming it" {
  check_missing_argument mountdevice
}

@test "unmountdevice: a missing argument is a Failure naming it" {
  check_missing_argument unmountdevice
}

@test "mount: a missing argument is a Failure naming it" {
  check_missing_argument mount
}

@test "unmount: a missing argument is a Failure naming it" {
  check_missing_argument unmount
}

@test "expandfs: a missing argument is a Failure naming it" {
  check_missing_argument expandfs
}

@test "expandvolume: a missing argument is a Failure naming it" {
  check_missing_argument expandvolume
}

@test "getvolumename: an extra argument is a Failure" {
  check_extra_argument getvolumename
}

@test "attach: an extra argument is a Failure" {
  check_extra_argument attach
}

@test "isattached: an extra argument is a Failure" {
  check_extra_argument isattached
}

@test "detach: an extra argument is a Failure" {
  check_extra_argument detach
}

@test "waitforattach: an extra argument is a Failure" {
  check_extra_argument waitforattach
}

@test "mountdevice: an extra argument is a Failure" {
  check_extra_argument mountdevice
}

@test "unmountdevice: an extra argument is a Failure" {
  check_extra_argument unmountdevice
}

@test "mount: an extra argument is a Failure" {
  check_extra_argument mount
}

@test "unmount: an extra argument is a Failure" {
  check_extra_argument unmount
}

@test "expandfs: an extra argument is a Failure" {
  check_extra_argument expandfs
}

@test "expandvolume: an extra argument is a Failure" {
  check_extra_argument expandvolume
}

# ---- empty-string arguments ----------------------------------------------------------------------------------

@test "getvolumename: an empty argument is a Failure naming it" {
  check_empty_arguments getvolumename
}

@test "attach: an empty argument is a Failure naming it" {
  check_empty_arguments attach
}

@test "isattached: an empty argument is a Failure naming it" {
  check_empty_arguments isattached
}

@test "detach: an empty argument is a Failure naming it" {
  check_empty_arguments detach
}

@test "waitforattach: an empty <json> is a Failure naming it; an empty <devicePath> is not refused" {
  check_empty_arguments waitforattach
}

@test "mountdevice: an empty argument is a Failure naming it" {
  check_empty_arguments mountdevice
}

@test "unmountdevice: an empty argument is a Failure naming it" {
  check_empty_arguments unmountdevice
}

@test "mount: an empty argument is a Failure naming it" {
  check_empty_arguments mount
}

@test "unmount: an empty argument is a Failure naming it" {
  check_empty_arguments unmount
}

@test "expandfs: an empty argument is a Failure naming it; an empty <devicePath> is not refused" {
  check_empty_arguments expandfs
}

@test "expandvolume: an empty argument is a Failure naming it" {
  check_empty_arguments expandvolume
}

# ---- the options JSON ------------------------------------------------------------------------------------------

@test "options: unparsable JSON is a Failure saying so, for every op that takes JSON" {
  local op
  for op in "${JSON_OPS[@]}"; do
    call_with_options "$op" '{not json'
    assert_failure_naming "not valid JSON"
  done
}

@test "options: a JSON array is a Failure saying an object is expected" {
  call_with_options attach '[]'
  assert_failure_naming "object" "array"
}

@test "options: a JSON string is a Failure saying an object is expected" {
  call_with_options attach '"str"'
  assert_failure_naming "object" "string"
}

@test "options: JSON null is a Failure saying an object is expected, not null" {
  call_with_options attach 'null'
  assert_failure_naming "object" "null"
}

@test "options: {} is a Failure saying how to name the volume" {
  local op
  for op in getvolumename attach mount; do
    call_with_options "$op" '{}'
    assert_failure_naming "kubernetes.io/pvOrVolumeName"
  done
}

@test "options: a number where a string belongs is a Failure naming the field" {
  call_with_options attach '{"kubernetes.io/pvOrVolumeName":"v1","size":5}'
  assert_failure_naming '"size"'
}

@test "options: readOnly must be \"true\" or \"false\"" {
  call_with_options attach "$(flex_options "$VOL" readOnly yes)"
  assert_failure_naming readOnly
  call_with_options attach '{"kubernetes.io/pvOrVolumeName":"v1","readOnly":true}'
  assert_failure_naming readOnly
}

@test "options: kubernetes.io/readwrite other than ro/rw is a Failure naming it" {
  call_with_options getvolumename "$(flex_options "$VOL" kubernetes.io/readwrite maybe)"
  assert_failure_naming kubernetes.io/readwrite
}

@test "options: Go-escaped JSON (\\u003c \\u0026 \\u00e9) parses" {
  local json
  json='{"kubernetes.io/fsType":"","kubernetes.io/pod.name":"caf\u00e9-\u003cweb\u003e-\u0026-\u2028","kubernetes.io/pvOrVolumeName":"v\u0031","kubernetes.io/readwrite":"rw"}'
  latch_call getvolumename "$json"
  assert_reply Success
  assert_equal "$(jq -r '.volumeName' <<<"$output")" v1
  call_with_options mount "$json"
  refute_internal_error
}

@test "options: go_json escapes like Go's json.Marshal" {
  run go_json b '<x>' a 'é & ü'
  assert_success
  assert_output '{"a":"é \u0026 ü","b":"\u003cx\u003e"}'
  latch_call mount "$(pod_volume_dir "$POD_UID" "$VOL")" \
    "$(flex_mount_options "$VOL" "$POD_UID" kubernetes.io/pod.name 'café <web> & co')"
  refute_internal_error
}

@test "options: 100 KB in one argument gives one JSON reply" {
  local pad json
  pad=$(head -c 102400 /dev/zero | tr '\0' x)
  json=$(flex_options "$VOL" kubernetes.io/pod.name "$pad")
  ((${#json} > 102400 && ${#json} < 131072)) || fail "fixture is ${#json} bytes"
  latch_call getvolumename "$json"
  assert_reply Success
  call_with_options mount "$json"
  refute_internal_error
  # The log keeps a bounded line, not the 100 KB.
  run jq -e -s 'all(.[]; tojson | length < 16384)' "$LATCH_LOG_FILE"
  assert_success
}

@test "options: a 100 KB invalid value gives a short Failure" {
  local pad
  pad=$(head -c 102400 /dev/zero | tr '\0' x)
  call_with_options attach "$(flex_options "$VOL" volume "$pad")"
  assert_failure_naming volume
  ((${#output} < 5000)) || fail "the reply is ${#output} bytes long"
}

@test "options: a misspelt option (sise, Size, fstype, readonly) is a Failure with a did-you-mean hint" {
  local op
  for op in getvolumename attach mount; do
    call_with_options "$op" "$(flex_options "$VOL" sise 1Gi)"
    assert_failure_naming 'unknown option "sise": did you mean "size"?'
  done
  call_with_options getvolumename "$(flex_options "$VOL" Size 1Gi)"
  assert_failure_naming 'did you mean "size"?'
  call_with_options getvolumename "$(flex_options "$VOL" fstype xfs)"
  assert_failure_naming 'did you mean "fsType"?'
  call_with_options getvolumename "$(flex_options "$VOL" readonly true)"
  assert_failure_naming 'did you mean "readOnly"?'
}

@test "options: another tool's options (the spec's fooServer) are accepted; the log names them, never their values" {
  local json
  json=$(flex_options "$VOL" fooServer 192.168.0.1:1234 fooVolumeName secret-bar)
  call_with_options getvolumename "$json"
  assert_reply Success
  [[ $(jq -r .volumeName <<<"$output") == "$VOL" ]] || fail "volumeName: $output"
  call_with_options isattached "$json"
  assert_reply Success
  jq -e '.attached == false' <<<"$output" >/dev/null || fail "isattached: $output"
  # One line per call, each naming the keys (sorted) ...
  run jq -s -e --arg vol "$VOL" '[.[] | select(.volume == $vol and (.op == "getvolumename" or .op == "isattached"))]
    | length == 2 and all(.unknownOptions == ["fooServer", "fooVolumeName"])' "$LATCH_LOG_FILE"
  assert_success
  # ... and nothing anywhere holds their values.
  refute_secret_written 192.168.0.1:1234 secret-bar
}

# ---- secrets -----------------------------------------------------------------------------------------------------

@test "secrets: never in a reply or in any file, whatever the op answers" {
  local secret b64
  secret=hunter2
  b64=$(printf %s "$secret" | base64)
  call_with mount json "$(flex_mount_options "$VOL" "$POD_UID" kubernetes.io/secret/password "$b64")"
  refute_internal_error
  refute_secret_written "$secret" "$b64"
  call_with attach json "$(flex_options "$VOL" kubernetes.io/secret/password "$b64")"
  refute_secret_written "$secret" "$b64"
  # ... also when the call fails for another reason, or the JSON cannot be parsed.
  call_with mount json "$(flex_mount_options "$VOL" "$POD_UID" kubernetes.io/secret/password "$b64" sise 1Gi)"
  assert_failure_naming 'did you mean "size"?'
  refute_secret_written "$secret" "$b64"
  call_with mount json "{\"kubernetes.io/secret/password\":\"$b64\" \"kubernetes.io/pvOrVolumeName\":\"$VOL\"}"
  assert_failure_naming "not valid JSON"
  refute_secret_written "$secret" "$b64"
  [[ -s $LATCH_LOG_FILE ]] || fail "no log was written, so the log check proved nothing"
}

@test "secrets: an invalid base64 value is a Failure naming the key, not the value" {
  call_with mount json "$(flex_mount_options "$VOL" "$POD_UID" kubernetes.io/secret/password 'hunter2!')"
  assert_failure_naming kubernetes.io/secret/password
  refute_secret_written hunter2
}

# ---- names -------------------------------------------------------------------------------------------------------

# check_bad_volume_name NAME -- NAME is refused as the PV name, as detach's argument and as the volume option.
check_bad_volume_name() {
  call_with getvolumename json "$(flex_options "$1")"
  assert_failure_naming kubernetes.io/pvOrVolumeName
  call_with attach json "$(flex_options "$1")"
  assert_failure_naming kubernetes.io/pvOrVolumeName
  call_with detach pvOrVolumeName "$1"
  assert_failure_naming "<pvOrVolumeName>"
  call_with getvolumename json "$(flex_options "$VOL" volume "$1")"
  assert_failure_naming volume
}

@test "names: volume name a/b is refused" {
  check_bad_volume_name a/b
}

@test "names: volume name .. is refused" {
  check_bad_volume_name ..
}

@test "names: volume name 'a b' is refused" {
  check_bad_volume_name 'a b'
}

@test "names: a 300-character volume name is refused" {
  check_bad_volume_name "$(printf 'a%.0s' {1..300})"
}

@test "names: volume name \$(touch ...) is refused and runs nothing" {
  check_bad_volume_name "\$(touch $LATCH_TMP/pwned)"
  check_bad_volume_name '$(touch /tmp/pwned)'
  refute [ -e "$LATCH_TMP/pwned" ]
}

@test "names: volume name 'x;rm -rf ...' is refused and runs nothing" {
  mkdir "$LATCH_TMP/canary"
  check_bad_volume_name "x;rm -rf $LATCH_TMP/canary"
  # The literal form only through getvolumename, which parses and answers without touching anything.
  call_with getvolumename json "$(flex_options 'x;rm -rf /')"
  assert_failure_naming kubernetes.io/pvOrVolumeName
  assert [ -d "$LATCH_TMP/canary" ]
}

@test "names: a 253-character PV name (the Kubernetes maximum) works with a shorter volume option" {
  local name
  name=$(printf 'a%.0s' {1..253})
  # Its image file could not be named after it (255-byte file names): the reply says what to do.
  call_with getvolumename json "$(flex_options "$name")"
  assert_failure_naming '"volume" option'
  latch_call getvolumename "$(go_json kubernetes.io/fsType '' kubernetes.io/pvOrVolumeName "$name" kubernetes.io/readwrite rw volume short-name)"
  assert_reply Success
  assert_equal "$(jq -r .volumeName <<<"$output")" "short-name"
  call_with detach pvOrVolumeName "$name"
  assert_reply Success
}

@test "names: bad node names are refused by attach, isattached and detach" {
  local node op
  for node in Node-A a/b .. -node 'node a' node-a. "$(printf 'n%.0s' {1..300})" "\$(touch $LATCH_TMP/pwned)"; do
    for op in attach isattached detach; do
      call_with "$op" nodeName "$node"
      assert_failure_naming "<nodeName>"
    done
  done
  refute [ -e "$LATCH_TMP/pwned" ]
}

# ---- paths and sizes -------------------------------------------------------------------------------------------

@test "paths: relative paths and paths with .. are refused, naming the argument" {
  local spec op name path
  for spec in waitforattach:devicePath mountdevice:deviceMountPath mountdevice:devicePath \
    unmountdevice:deviceMountPath mount:podVolumeDir unmount:podVolumeDir expandfs:devicePath \
    expandfs:podVolumeDir expandvolume:deviceMountPath; do
    op=${spec%%:*}
    name=${spec#*:}
    for path in relative/dir ./dir .. "$LATCH_TMP/a/../b" "../$VOL"; do
      call_with "$op" "$name" "$path"
      assert_failure_naming "<$name>"
    done
  done
}

@test "sizes: newBytes and oldBytes must be decimal byte counts" {
  local op name value
  for op in expandfs expandvolume; do
    for name in newBytes oldBytes; do
      for value in abc -1 1.5 1Gi 0x10 ' 5' 1e9; do
        call_with "$op" "$name" "$value"
        assert_failure_naming "<$name>"
      done
    done
  done
}

# ---- configuration -------------------------------------------------------------------------------------------

# check_config_failure NEEDLE... -- every op in the table answers Failure naming $LATCH_CONFIG and each NEEDLE.
check_config_failure() {
  local op
  for op in "${ALL_OPS[@]}"; do
    valid_args "$op"
    latch_call "$op" "${ARGS[@]}"
    assert_failure_naming "$LATCH_CONFIG" "$@"
  done
}

@test "config: unparsable JSON is a Failure naming the file" {
  local config="$LATCH_TMP/configs/broken.json"
  printf '{"stateDir": "%s",' "$LATCH_STATE_DIR" >"$config"
  use_config "$config"
  check_config_failure JSON
}

@test "config: an unknown field is a Failure naming the file and the field" {
  use_config "$(make_config colour=red)"
  check_config_failure colour
}

@test "config: maxSize \"abc\" is a Failure naming the file and the field" {
  use_config "$(make_config maxSize=abc)"
  check_config_failure maxSize
}

@test "config: attach \"yes\" is a Failure naming the file and the field" {
  use_config "$(make_config attach=yes)"
  check_config_failure attach
}

@test "config: a logFile inside a kubelet plugin dir is a Failure naming the field" {
  use_config "$(make_config logFile="$LATCH_PLUGIN_DIR/latch.log")"
  check_config_failure logFile
}

@test "config: LATCH_CONFIG naming a missing file is a Failure naming it" {
  export LATCH_CONFIG="$LATCH_TMP/configs/missing.json"
  check_config_failure
}

# ---- the call log ----------------------------------------------------------------------------------------------

@test "log: one JSON line per call with op, callId, durationMs and status" {
  local replies=()
  latch_call init
  replies+=("init $reply_status")
  call_with getvolumename json "$(flex_options "$VOL")"
  replies+=("getvolumename $reply_status")
  call_with detach pvOrVolumeName "$VOL"
  replies+=("detach $reply_status")
  call_with_options attach '{not json'
  replies+=("attach $reply_status")

  run jq -e -c '(.callId | type) == "string" and (.callId | length) > 0 and (.durationMs | type) == "number"' \
    "$LATCH_LOG_FILE"
  assert_success
  refute_output --partial false
  run jq -r '"\(.op) \(.status)"' "$LATCH_LOG_FILE"
  assert_success
  assert_output "$(printf '%s\n' "${replies[@]}")"
  run jq -s -e 'map(.callId) | unique | length == 4' "$LATCH_LOG_FILE"
  assert_success
}

@test "log: an unwritable log file does not fail the call" {
  : >"$LATCH_TMP/not-a-dir"
  use_config "$(make_config logFile="$LATCH_TMP/not-a-dir/latch.log")"
  latch_call init
  assert_reply Success
  call_with getvolumename json "$(flex_options "$VOL")"
  assert_reply Success
  call_with detach pvOrVolumeName "$VOL"
  refute_internal_error

  mkdir "$LATCH_TMP/log-is-a-dir"
  use_config "$(make_config logFile="$LATCH_TMP/log-is-a-dir")"
  call_with getvolumename json "$(flex_options "$VOL")"
  assert_reply Success
}

# ---- signals ---------------------------------------------------------------------------------------------------

@test "SIGTERM during a call: one JSON Failure, exit 1, nothing on stderr" {
  # The call is held inside its op on purpose, so that the signal always finds it there: its ledger is an "etcd" (a
  # few lines of node) that accepts the connection and never answers. The driver connects only from inside the op,
  # after its signal handlers are set, so once the fake has seen a connection the SIGTERM is neither too early (Node
  # still starting) nor too late (the call already answered).
  local out="$LATCH_TMP/sigterm.out" err="$LATCH_TMP/sigterm.err" port_file="$LATCH_TMP/fake-etcd.port"
  local seen="$LATCH_TMP/fake-etcd.seen" options pid server port waited=0
  node -e '
    const net = require("node:net"), fs = require("node:fs");
    const held = [];
    const server = net.createServer((socket) => { held.push(socket); fs.appendFileSync(process.argv[2], "connected\n"); });
    server.listen(0, "127.0.0.1", () => fs.writeFileSync(process.argv[1], String(server.address().port)));
  ' "$port_file" "$seen" </dev/null >/dev/null 2>&1 3>&- &
  server=$!
  latch_on_teardown "kill $server 2>/dev/null || true"
  while [[ ! -s $port_file ]] && ((waited < 100)); do
    sleep 0.1
    waited=$((waited + 1))
  done
  [[ -s $port_file ]] || fail "the fake etcd did not start within 10 s"
  port=$(<"$port_file")
  use_config "$(make_config "store={\"type\":\"etcd\",\"endpoints\":[\"http://127.0.0.1:$port\"],\"timeoutMs\":60000}")"
  options=$(flex_options "$VOL")
  _latch_remember_call waitforattach "" "$options"
  _latch_exec waitforattach "" "$options" >"$out" 2>"$err" </dev/null 3>&- &
  pid=$!
  waited=0
  while [[ ! -s $seen ]] && kill -0 "$pid" 2>/dev/null && ((waited < 300)); do
    sleep 0.05
    waited=$((waited + 1))
  done
  if [[ ! -s $seen ]]; then
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" || true
    fail "waitforattach never reached its ledger within 15 s (reply: $(<"$out"))"
  fi
  waited=0
  kill -TERM "$pid"
  while kill -0 "$pid" 2>/dev/null && ((waited < 100)); do
    sleep 0.1
    waited=$((waited + 1))
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid"
    wait "$pid" || true
    fail "the driver was still running 10 s after SIGTERM"
  fi
  status=0
  wait "$pid" || status=$?
  output=$(<"$out")
  stderr=$(<"$err")
  latch_check_reply
  assert_reply Failure
  assert_output --partial 'waitforattach was interrupted by SIGTERM'
  refute_internal_error
}

# ---- the human side ------------------------------------------------------------------------------------------

@test "latch --help prints human text and exits 0" {
  run --separate-stderr "$LATCH_EXEC" --help
  assert_success
  assert_equal "$stderr" ""
  assert_output --partial Usage
  assert_output --partial latch
  run ! jq -e . <<<"$output"
}

@test "latch version prints the package version and exits 0" {
  run --separate-stderr "$LATCH_EXEC" version
  assert_success
  assert_equal "$stderr" ""
  assert_output "$(jq -r .version "$LATCH_REPO_ROOT/package.json")"
}

# A preload that, once the call is under way (after main has taken over the streams), writes the ways a library
# might: console.log/console.error, raw stream writes, a Node warning.
write_stray_preload() {
  cat >"$BATS_TEST_TMPDIR/stray.js" <<'JS'
setImmediate(() => {
  console.log('noise-console-log');
  console.error('noise-console-error');
  process.stdout.write('noise-stdout-write\n');
  process.emitWarning('noise-warning', 'ExperimentalWarning');
});
JS
}

@test "output: console output, stream writes and Node warnings during a call go to the log, never to stdout/stderr" {
  write_stray_preload
  # waitforattach of a volume nobody attached polls until its deadline, so the preload's writes land mid-call.
  NODE_OPTIONS="--require $BATS_TEST_TMPDIR/stray.js" latch_call waitforattach "" "$(flex_options "$(unique_name stray)")"
  assert_reply Failure
  refute_output --partial noise-
  local entry
  entry=$(log_entries | tail -n 1)
  # The single-executable build does not honour NODE_OPTIONS preloads: nothing stray then, which is fine too.
  if [[ ${LATCH_BIN:-} != *latch-sea* ]]; then
    assert_equal "$(jq -r '.strayOutput | contains("noise-console-log") and contains("noise-console-error") and contains("noise-stdout-write") and contains("noise-warning")' <<<"$entry")" true
  fi
}

@test "output: an unhandled rejection during a call is one Failure reply naming an internal error" {
  cat >"$BATS_TEST_TMPDIR/reject.js" <<'JS'
setImmediate(() => { Promise.reject(new Error('noise-rejection')); });
JS
  NODE_OPTIONS="--require $BATS_TEST_TMPDIR/reject.js" latch_call waitforattach "" "$(flex_options "$(unique_name reject)")"
  assert_reply Failure
  if [[ ${LATCH_BIN:-} != *latch-sea* ]]; then
    assert_output --partial 'internal error in waitforattach: noise-rejection'
  fi
}

@test "configuration: a call validates it once; later calls of this build take the validated copy until the file changes" {
  local copy
  copy="$(dirname "$LATCH_CONFIG")/.$(basename "$LATCH_CONFIG").validated"
  latch_call isattached "$(flex_options "$VOL")" node-a
  assert_reply Success
  [ -f "$copy" ]
  assert_equal "$(stat -c %a "$copy")" 600
  # A change to the file is validated, not taken from the copy.
  jq '.waitForAttachTimeout = 900' "$LATCH_CONFIG" >"$LATCH_TMP/bad.json"
  cp "$LATCH_TMP/bad.json" "$LATCH_CONFIG"
  latch_call isattached "$(flex_options "$VOL")" node-a
  assert_reply Failure
  assert_output --partial 'waitForAttachTimeout'
}

@test "single executable: driver calls start from the code cache that V8 took, in both of its driver bundles" {
  [[ $(basename "$LATCH_BIN") == latch-sea ]] || skip "only for bin/latch-sea (LATCH_BIN=$LATCH_BIN)"
  # isattached is answered by the control plane's bundle, unmountdevice by the one with every op (src/sea/main.ts).
  latch_call isattached "$(flex_options "$VOL")" node-a
  assert_reply Success
  valid_args unmountdevice
  latch_call unmountdevice "${ARGS[@]}"
  refute_internal_error
  run jq -e -s '[.[] | select(.op == "isattached" or .op == "unmountdevice")] | length == 2 and all(.[]; has("codeCacheRejected") | not)' "$LATCH_LOG_FILE"
  assert_success
}
