#!/usr/bin/env bats
# latch install / uninstall / doctor, and the self-contained build (docs/protocol.md, "Discovery and install").
# Installs go to temporary plugin dirs; plugin-dir detection reads a fake /proc (LATCH_PROC_ROOT) and stand-in
# fallback dirs, so nothing here can touch the host's kubelet.

load 'test_helper/common-setup'
load 'test_helper/install-setup'

setup() {
  install_setup
}

teardown() {
  install_teardown
}

# install_with BUILD ARGS... -- runs BUILD's install, which must succeed and print nothing on stderr.
install_with() {
  run --separate-stderr "$@"
  [[ $status == 0 ]] || fail "$* failed ($status): $output $stderr"
  [[ -z $stderr ]] || fail "$* wrote to stderr: $stderr"
}

# only_the_driver_in DIR DRIVER_FILE -- DIR holds nothing but DRIVER_FILE and its directory.
only_the_driver_in() {
  local strays
  strays=$(find "$1" -mindepth 1 ! -path "$(dirname "$2")" ! -path "$2")
  [[ -z $strays ]] || fail "besides the driver, the plugin dir holds: $strays"
}

# ---- install ---------------------------------------------------------------------------------------------------

@test "install: copies the running executable to <dir>/latch~loop/loop, 0755, and nothing else" {
  install_with "$BUILD_A" install --plugin-dir "$PLUGINS"
  assert_output --partial "plugin dir: $PLUGINS (given with --plugin-dir)"
  assert_output --partial "installed $DRIVER from $BUILD_A"
  cmp "$DRIVER" "$BUILD_A"
  [[ $(stat -c %a "$DRIVER") == 755 ]] || fail "mode is $(stat -c %a "$DRIVER")"
  only_the_driver_in "$PLUGINS" "$DRIVER"

  # kubelet can run what was installed.
  run --separate-stderr "$DRIVER" init
  assert_success
  [[ -z $stderr ]] || fail "stderr: $stderr"
  jq -e '.status == "Success" and .capabilities.attach == true' <<<"$output"
}

@test "install: the same content again changes nothing (no rename, no re-probe) and says so; a new build replaces it" {
  install_with "$BUILD_A" install --plugin-dir "$PLUGINS"
  local inode
  inode=$(stat -c %i "$DRIVER")

  install_with "$BUILD_A" install --plugin-dir "$PLUGINS" -o json
  jq -e '.action == "unchanged"' <<<"$output"
  [[ $(stat -c %i "$DRIVER") == "$inode" ]] || fail "the driver was replaced although its content was the same"
  install_with "$BUILD_A" install --plugin-dir "$PLUGINS"
  assert_output --partial 'nothing changed, so kubelet does not re-probe'

  install_with "$BUILD_B" install --plugin-dir "$PLUGINS" -o json
  jq -e --arg sha "$(sha256sum "$BUILD_B" | cut -d' ' -f1)" --arg old "$(sha256sum "$BUILD_A" | cut -d' ' -f1)" \
    '.action == "upgraded" and .sha256 == $sha and .previousSha256 == $old' <<<"$output"
  cmp "$DRIVER" "$BUILD_B"
  [[ $(stat -c %i "$DRIVER") != "$inode" ]] || fail "the upgrade wrote into the old file instead of renaming a new one over it"
  only_the_driver_in "$PLUGINS" "$DRIVER"
}

@test "install: 20 concurrent installs and upgrades never show a watcher anything but complete drivers" {
  install_with "$BUILD_A" install --plugin-dir "$PLUGINS"
  start_watcher "$PLUGINS" "$PLUGINS/latch~loop" loop "$BUILD_A" "$BUILD_B"

  local pids=() i build
  for ((i = 0; i < 20; i++)); do
    build=$BUILD_A
    ((i % 2 == 0)) && build=$BUILD_B
    "$build" install --plugin-dir "$PLUGINS" >"$LATCH_TMP/install.$i.out" 2>"$LATCH_TMP/install.$i.err" &
    pids+=($!)
  done
  local failed=0
  for i in "${!pids[@]}"; do
    wait "${pids[i]}" || { failed=1; echo "install $i failed: $(cat "$LATCH_TMP/install.$i.out" "$LATCH_TMP/install.$i.err")"; }
    [[ ! -s $LATCH_TMP/install.$i.err ]] || { failed=1; echo "install $i wrote to stderr: $(cat "$LATCH_TMP/install.$i.err")"; }
  done
  stop_watcher

  ((failed == 0)) || fail 'some installs failed'
  if grep -q '^BAD' "$WATCH_LOG"; then
    grep '^BAD' "$WATCH_LOG" | batslib_decorate 'the watcher saw something kubelet must never see' | fail
  fi
  local complete
  complete=$(grep -c '^ok complete' "$WATCH_LOG") || true
  ((complete >= 1)) || fail "the watcher saw no driver renamed into place: $(cat "$WATCH_LOG")"
  echo "# $complete renames, each a complete driver" >&3
  only_the_driver_in "$PLUGINS" "$DRIVER"
  cmp -s "$DRIVER" "$BUILD_A" || cmp -s "$DRIVER" "$BUILD_B" || fail 'the driver left in place is neither build'
}

@test "install: a leftover temp file of a killed install is removed by the next install, fresh ones are left alone" {
  install_with "$BUILD_A" install --plugin-dir "$PLUGINS"
  local old="$PLUGINS/latch~loop/.loop.12345.0123abcd.tmp" fresh="$PLUGINS/latch~loop/.loop.12346.4567abcd.tmp"
  head -c 1000 "$BUILD_A" >"$old"
  touch -d '1 hour ago' "$old"
  head -c 1000 "$BUILD_A" >"$fresh"
  install_with "$BUILD_B" install --plugin-dir "$PLUGINS"
  [[ ! -e $old ]] || fail "the stale temp file is still there"
  [[ -e $fresh ]] || fail "a temp file that may belong to a running install was removed"
  rm "$fresh"
  cmp "$DRIVER" "$BUILD_B"
}

@test "install: --driver names the directory and file" {
  install_with "$BUILD_A" install --plugin-dir "$PLUGINS" --driver example.com/disk
  cmp "$PLUGINS/example.com~disk/disk" "$BUILD_A"
  run --separate-stderr "$BUILD_A" install --plugin-dir "$PLUGINS" --driver 'no/../good'
  assert_failure
  [[ $stderr == *'must look like vendor/driver'* ]] || fail "stderr: $stderr"
}

# ---- plugin dir detection ---------------------------------------------------------------------------------------

@test "install: detects the plugin dir from kubelet's --volume-plugin-dir" {
  local dir="$LATCH_TMP/from-flag/volume-plugins"
  plant_kubelet 1 /sbin/init
  plant_kubelet 4242 /usr/bin/kubelet --v=2 "--volume-plugin-dir=$dir" --node-ip=10.0.0.1
  install_with "$BUILD_A" install
  assert_output --partial "plugin dir: $dir (kubelet (pid 4242) runs with --volume-plugin-dir=$dir)"
  cmp "$dir/latch~loop/loop" "$BUILD_A"
  only_the_driver_in "$dir" "$dir/latch~loop/loop"

  # Go's other spelling: the value as the next argument.
  rm -r "$dir"
  plant_kubelet 4242 /usr/bin/kubelet --volume-plugin-dir "$dir"
  install_with "$BUILD_A" install
  assert_output --partial "(kubelet (pid 4242) runs with --volume-plugin-dir=$dir)"
  cmp "$dir/latch~loop/loop" "$BUILD_A"
}

@test "install: detects the plugin dir from volumePluginDir in kubelet's config file (YAML and JSON)" {
  local dir="$LATCH_TMP/from-config/volume-plugins" config="$LATCH_TMP/kubelet-etc/config.yaml"
  mkdir -p "$(dirname "$config")"
  cat >"$config" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  webhook:
    enabled: true
# volumePluginDir: /commented/out
volumePluginDir: "$dir" # where FlexVolume drivers live
cgroupDriver: systemd
EOF
  plant_kubelet 4242 /usr/bin/kubelet "--config=$config" --kubeconfig=/etc/kubernetes/kubelet.conf
  install_with "$BUILD_A" install
  assert_output --partial "plugin dir: $dir (volumePluginDir in $config, the config file of kubelet (pid 4242))"
  cmp "$dir/latch~loop/loop" "$BUILD_A"

  jq -n --arg d "$dir.json" '{kind: "KubeletConfiguration", volumePluginDir: $d}' >"$config.json"
  plant_kubelet 4242 /usr/bin/kubelet --config "$config.json"
  install_with "$BUILD_A" install
  assert_output --partial "plugin dir: $dir.json (volumePluginDir in $config.json"
  cmp "$dir.json/latch~loop/loop" "$BUILD_A"
}

@test "install: without a kubelet setting: the OpenShift 4 dir when it exists, else kubelet's default, saying why" {
  plant_kubelet 4242 /usr/bin/kubelet --v=2
  install_with "$BUILD_A" install
  assert_output --partial "plugin dir: $LATCH_DEFAULT_PLUGIN_DIR (kubelet (pid 4242) has neither --volume-plugin-dir nor --config; using kubelet's default)"
  cmp "$LATCH_DEFAULT_PLUGIN_DIR/latch~loop/loop" "$BUILD_A"

  rm -r "$LATCH_PROC_ROOT/4242"
  mkdir -p "$LATCH_OPENSHIFT_PLUGIN_DIR"
  install_with "$BUILD_A" install
  assert_output --partial "plugin dir: $LATCH_OPENSHIFT_PLUGIN_DIR (no kubelet process found in $LATCH_PROC_ROOT; $LATCH_OPENSHIFT_PLUGIN_DIR exists (OpenShift 4))"
  cmp "$LATCH_OPENSHIFT_PLUGIN_DIR/latch~loop/loop" "$BUILD_A"

  # $LATCH_VOLUME_PLUGIN_DIR (the DaemonSet sets it) comes before detection.
  LATCH_VOLUME_PLUGIN_DIR="$PLUGINS" install_with "$BUILD_A" install
  assert_output --partial "plugin dir: $PLUGINS (given in \$LATCH_VOLUME_PLUGIN_DIR)"
  cmp "$DRIVER" "$BUILD_A"
}

# ---- uninstall --------------------------------------------------------------------------------------------------

@test "uninstall: refuses while this node holds a volume, removes the driver with --force" {
  install_with "$BUILD_A" install --plugin-dir "$PLUGINS"
  local vol options device
  vol=$(unique_name pv)
  options=$(flex_options "$vol")
  latch_call attach "$options" node-a
  assert_reply Success
  device=$(jq -r '.device // ""' <<<"$output")
  latch_call waitforattach "$device" "$options"
  assert_reply Success
  device=$(jq -r .device <<<"$output")
  [[ $device == /dev/loop* ]] || fail "waitforattach replied no loop device: $output"

  run --separate-stderr "$BUILD_A" uninstall --plugin-dir "$PLUGINS"
  assert_failure 1
  [[ $stderr == *'refusing to uninstall'*"$vol (attached)"*"$device"*'--force'* ]] || fail "stderr: $stderr"
  cmp "$DRIVER" "$BUILD_A"

  run --separate-stderr "$BUILD_A" uninstall --plugin-dir "$PLUGINS" --force
  assert_success
  assert_output --partial "removed $DRIVER"
  [[ ! -e $PLUGINS/latch~loop ]] || fail "the driver's directory is still there: $(ls -la "$PLUGINS/latch~loop")"
}

@test "uninstall: refuses while a loop device of the pool is set up, even unknown to the ledger" {
  install_with "$BUILD_A" install --plugin-dir "$PLUGINS"
  local image="$LATCH_POOL_DIR/$(unique_name stray).img" device
  truncate -s 16M "$image"
  device=$(losetup --find --show "$image")
  run --separate-stderr "$BUILD_A" uninstall --plugin-dir "$PLUGINS"
  assert_failure 1
  [[ $stderr == *"$device ($(basename "$image"))"* ]] || fail "stderr: $stderr"
  losetup -d "$device"
  cmp "$DRIVER" "$BUILD_A"
}

@test "uninstall: with nothing held removes the driver and its directory; again is a no-op" {
  install_with "$BUILD_A" install --plugin-dir "$PLUGINS"
  install_with "$BUILD_A" uninstall --plugin-dir "$PLUGINS"
  assert_output --partial "removed $DRIVER"
  [[ -d $PLUGINS && ! -e $PLUGINS/latch~loop ]] || fail "$(find "$PLUGINS")"
  install_with "$BUILD_A" uninstall --plugin-dir "$PLUGINS"
  assert_output --partial "$DRIVER is not installed; nothing to do"
}

# ---- doctor -----------------------------------------------------------------------------------------------------

@test "doctor: reports a stale ticket, a mount and a loop device unknown to the ledger, and a missing tool, with fixes that work" {
  use_config "$(make_config 'allowedFsTypes=["ext4","xfs"]')"
  export LATCH_VOLUME_PLUGIN_DIR="$LATCH_PLUGIN_ROOT"

  # A stale ticket: the ledger says node-a has the volume attached, but its loop device went away behind latch.
  local vol options stale
  vol=$(unique_name pv)
  options=$(flex_options "$vol")
  latch_call attach "$options" node-a
  assert_reply Success
  latch_call waitforattach "" "$options"
  assert_reply Success
  stale=$(jq -r .device <<<"$output")
  losetup -d "$stale"

  # An orphan: a loop device over a pool image the ledger does not know, mounted.
  local orphan_name orphan mnt="$LATCH_TMP/mnt/orphan"
  orphan_name=$(unique_name orphan)
  truncate -s 32M "$LATCH_POOL_DIR/$orphan_name.img"
  orphan=$(losetup --find --show "$LATCH_POOL_DIR/$orphan_name.img")
  mkfs.ext4 -q "$orphan"
  mkdir -p "$mnt"
  mount "$orphan" "$mnt"

  # A missing tool: mkfs.xfs, while xfs is allowed.
  export LATCH_TOOL_PATH
  LATCH_TOOL_PATH=$(tool_dir_without mkfs.xfs)

  run --separate-stderr "$LATCH_EXEC" doctor -o json
  assert_failure 1
  [[ -z $stderr ]] || fail "stderr: $stderr"
  local report=$output
  jq -e '.healthy == false and .errors >= 3 and .node == "node-a"' <<<"$report"
  jq -e --arg v "$vol" '[.findings[] | select(.check == "ledger" and .severity == "error"
      and (.message | startswith("stale ticket: volume " + $v + " is attached on node node-a"))
      and .fix == "latch volume release " + $v + " --node node-a --node-is-down")] | length == 1' <<<"$report" ||
    fail "no stale-ticket finding with its fix: $report"
  jq -e --arg d "$orphan" --arg m "$mnt" '[.findings[] | select(.check == "mounts" and .severity == "error"
      and (.message | contains($d + " (volume ") and contains("mounted at " + $m)) and .fix == "umount " + $m)] | length == 1' \
    <<<"$report" || fail "no unknown-mount finding with its fix: $report"
  jq -e --arg d "$orphan" '[.findings[] | select(.check == "devices" and .severity == "error"
      and (.message | startswith("orphan loop device: " + $d + " is set up over")) and .fix == "losetup -d " + $d)] | length == 1' \
    <<<"$report" || fail "no orphan-device finding with its fix: $report"
  # The image itself has no volume either: reported, with no fix (whether its data is needed is a person's call).
  jq -e --arg i "$LATCH_POOL_DIR/$orphan_name.img" '[.findings[] | select(.check == "images" and .severity == "warning"
      and (.message | startswith("image " + $i + " has no volume in the ledger")) and .fix == null)] | length == 1' \
    <<<"$report" || fail "no image-without-volume finding: $report"
  jq -e '[.findings[] | select(.check == "tools" and .severity == "warning" and (.message | startswith("mkfs.xfs not found"))
      and .fix == "apt-get install -y xfsprogs" and (.note | contains("dnf install -y xfsprogs")))] | length == 1' \
    <<<"$report" || fail "no missing-tool finding with its fix: $report"
  jq -e '[.findings[] | select(.check == "driver" and .severity == "ok" and (.message | contains("identical")))] | length == 1' \
    <<<"$report" || fail "the installed driver is not reported identical: $report"

  # The same, for people.
  run --separate-stderr "$LATCH_EXEC" doctor
  assert_failure 1
  [[ -z $stderr ]] || fail "stderr: $stderr"
  assert_line --regexp '^STATUS +CHECK +FINDING$'
  assert_line --regexp "^error +ledger +stale ticket: volume $vol is attached on node node-a "
  assert_line --regexp "^ +fix: latch volume release $vol --node node-a --node-is-down   # safe: "
  assert_line --regexp "^error +mounts +$orphan \\(volume $orphan_name\\) is mounted at $mnt"
  assert_line --regexp "^ +fix: umount $mnt   # "
  assert_line --regexp "^error +devices +orphan loop device: $orphan is set up over $LATCH_POOL_DIR/$orphan_name.img"
  assert_line --regexp "^ +fix: losetup -d $orphan   # after unmounting $mnt"
  assert_line --regexp '^warning +tools +mkfs.xfs not found in '
  assert_line --regexp '^ +fix: apt-get install -y xfsprogs   # RHEL, Fedora: dnf install -y xfsprogs'
  assert_line --regexp '^[0-9]+ error\(s\), [0-9]+ warning\(s\)$'

  # Running the fixes, in the order given, makes the node healthy.
  latch() { "$LATCH_EXEC" "$@"; }
  local fix
  while IFS= read -r fix; do
    [[ $fix == apt-get* ]] && continue
    eval "$fix" || fail "fix failed: $fix"
  done < <(jq -r '.findings[] | select(.severity == "error") | .fix' <<<"$report")
  unset LATCH_TOOL_PATH
  rm "$LATCH_POOL_DIR/$orphan_name.img" # as the images warning's note says, once nobody needs its data
  run --separate-stderr "$LATCH_EXEC" doctor
  assert_success
  assert_line 'healthy'
}

@test "doctor: a missing driver and a missing required tool are errors, with the install command as fix" {
  export LATCH_VOLUME_PLUGIN_DIR="$PLUGINS"
  mkdir -p "$PLUGINS"
  export LATCH_TOOL_PATH
  LATCH_TOOL_PATH=$(tool_dir_without losetup)
  run --separate-stderr "$BUILD_A" doctor -o json
  assert_failure 1
  jq -e --arg p "$PLUGINS" '[.findings[] | select(.check == "driver" and .severity == "error")
      | select(.fix == "latch install --plugin-dir " + $p)] | length == 1' <<<"$output" || fail "$output"
  jq -e '[.findings[] | select(.check == "tools" and .severity == "error" and (.message | startswith("losetup not found"))
      and .fix == "apt-get install -y mount")] | length == 1' <<<"$output" || fail "$output"

  # An installed build other than this one is a warning; only warnings: exit 2.
  unset LATCH_TOOL_PATH
  install_with "$BUILD_B" install
  run --separate-stderr "$BUILD_A" doctor -o json
  assert_failure 2
  jq -e '.errors == 0 and .warnings == 1 and ([.findings[] | select(.severity == "warning")][0]
      | .check == "driver" and (.message | contains("differs from")))' <<<"$output" || fail "$output"
}

# ---- the DaemonSet's entrypoint ----------------------------------------------------------------------------------

# start_entrypoint NAME=VALUE... -- runs install/entrypoint.sh with BUILD_A as latch, node-7 as the node, the
# config at $config from $template, and the given environment, output in $out; returns once it sleeps
# (ENTRYPOINT_PID, SLEEPER).
start_entrypoint() {
  env NODE_NAME=node-7 LATCH_CONFIG="$config" LATCH_CONFIG_TEMPLATE="$template" LATCH_READY_FILE="$LATCH_TMP/ready" \
    LATCH="$BUILD_A" "$@" sh "$LATCH_REPO_ROOT/install/entrypoint.sh" >"$out" 2>&1 &
  ENTRYPOINT_PID=$!
  latch_on_teardown "kill $ENTRYPOINT_PID 2>/dev/null; true"
  local i
  SLEEPER=""
  for ((i = 0; i < 300; i++)); do
    SLEEPER=$(ps -o pid= --ppid "$ENTRYPOINT_PID" -o comm= | awk '$2 == "sleep" { print $1 }')
    [[ -n $SLEEPER ]] && return 0
    kill -0 "$ENTRYPOINT_PID" 2>/dev/null || fail "the entrypoint exited: $(cat "$out")"
    sleep 0.1
  done
  fail "the entrypoint did not reach its sleep: $(cat "$out")"
}

@test "entrypoint: writes this node's config, installs, runs doctor, sleeps; on TERM exits 0 and the driver stays" {
  local template="$LATCH_TMP/template/config.json" config="$LATCH_TMP/etc-latch/config.json" out="$LATCH_TMP/entrypoint.out"
  mkdir -p "$(dirname "$template")"
  jq 'del(.nodeName)' "$LATCH_CONFIG" >"$template"
  start_entrypoint LATCH_VOLUME_PLUGIN_DIR="$PLUGINS"
  jq -e --slurpfile t "$template" '. == ($t[0] + {nodeName: "node-7"})' "$config" || fail "config: $(cat "$config")"
  cmp "$DRIVER" "$BUILD_A"
  only_the_driver_in "$PLUGINS" "$DRIVER"
  [[ -f $LATCH_TMP/ready ]] || fail 'no readiness file'
  grep -q "latch-entrypoint: wrote $config for node node-7" "$out"
  grep -q "^latch-entrypoint: installed $DRIVER (sha256 [0-9a-f]\{12\}); plugin dir $PLUGINS: given in \$LATCH_VOLUME_PLUGIN_DIR" "$out" ||
    fail "$(cat "$out")"
  grep -q '^latch doctor on node node-7' "$out" || fail "no doctor report: $(cat "$out")"

  kill -TERM "$ENTRYPOINT_PID"
  local rc=0 i
  wait "$ENTRYPOINT_PID" || rc=$?
  ((rc == 0)) || fail "exit status $rc on TERM: $(cat "$out")"
  grep -q 'stopping; the driver stays installed' "$out"
  local state
  for ((i = 0; i < 50; i++)); do
    state=$(awk '{ print $3 }' "/proc/$SLEEPER/stat" 2>/dev/null) || state=gone
    [[ $state == gone || $state == Z ]] && break
    sleep 0.1
  done
  [[ $state == gone || $state == Z ]] || fail "the sleep was left running (state $state)"
  cmp "$DRIVER" "$BUILD_A"

  # A new pod: installs again, which changes nothing.
  start_entrypoint LATCH_VOLUME_PLUGIN_DIR="$PLUGINS"
  grep -q "^latch-entrypoint: unchanged $DRIVER" "$out" || fail "$(cat "$out")"
  kill -TERM "$ENTRYPOINT_PID"
  wait "$ENTRYPOINT_PID"
}

@test "entrypoint, detecting (no preset): kubelet's plugin dir is found and written under LATCH_HOST_ROOT; doctor checks it there" {
  local template="$LATCH_TMP/template/config.json" config="$LATCH_TMP/etc-latch/config.json" out="$LATCH_TMP/entrypoint.out"
  local host="$LATCH_TMP/host"
  mkdir -p "$(dirname "$template")" "$host/etc/kubernetes"
  jq 'del(.nodeName)' "$LATCH_CONFIG" >"$template"
  plant_kubelet 1 /sbin/init
  plant_kubelet 4242 /usr/bin/kubelet --config /etc/kubernetes/kubelet.yaml
  printf 'kind: KubeletConfiguration\nvolumePluginDir: /var/lib/kubelet/volumeplugins\n' >"$host/etc/kubernetes/kubelet.yaml"
  local installed="$host/var/lib/kubelet/volumeplugins/latch~loop/loop"

  start_entrypoint LATCH_HOST_ROOT="$host"
  cmp "$installed" "$BUILD_A"
  grep -q "^latch-entrypoint: installed $installed (sha256 [0-9a-f]\{12\}); plugin dir /var/lib/kubelet/volumeplugins: volumePluginDir in /etc/kubernetes/kubelet.yaml, the config file of kubelet (pid 4242)" "$out" ||
    fail "$(cat "$out")"
  grep -q "plugin dir $host/var/lib/kubelet/volumeplugins (given with --plugin-dir)" "$out" || fail "doctor looked elsewhere: $(cat "$out")"
  [[ ! -e $LATCH_DEFAULT_PLUGIN_DIR && ! -e /var/lib/kubelet/volumeplugins/latch~loop ]] || fail 'installed outside the host root'
  kill -TERM "$ENTRYPOINT_PID"
  wait "$ENTRYPOINT_PID"
}

@test "entrypoint, control plane with latch's etcd: the client's files and the Service's address in the config, and the config beside the driver" {
  local template="$LATCH_TMP/template/config.json" config="$LATCH_TMP/etc-latch/config.json" out="$LATCH_TMP/entrypoint.out"
  local secret="$LATCH_TMP/secret" etcd_dir="$LATCH_TMP/etc-latch/etcd"
  mkdir -p "$(dirname "$template")" "$secret"
  # The Secret latch-etcd-client as the pod sees it: a CA and a client certificate that matches its key.
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$secret/tls.key" -out "$secret/tls.crt" -days 1 -subj /CN=latch 2>/dev/null
  cp "$secret/tls.crt" "$secret/ca.crt"
  # The generated ConfigMap's store, its files where the entrypoint puts them here; this test's paths otherwise.
  run --separate-stderr "$BUILD_A" install --print-manifests -o json
  assert_success
  local store
  store=$(jq -c --arg d "$etcd_dir" '.items[] | select(.kind == "ConfigMap") | .data["config.json"] | fromjson | .store
      | .tls = {ca: "\($d)/ca.crt", cert: "\($d)/tls.crt", key: "\($d)/tls.key"}' <<<"$output")
  jq --argjson store "$store" 'del(.nodeName) + {store: $store}' "$LATCH_CONFIG" >"$template"
  # What the control-plane DaemonSet sets, and what Kubernetes puts in the pod's environment for the Service.
  start_entrypoint LATCH_VOLUME_PLUGIN_DIR="$PLUGINS" LATCH_CONFIG_BESIDE_DRIVER=true LATCH_ETCD_CLIENT_SECRET="$secret" \
    LATCH_ETCD_SERVICE=latch-etcd-client LATCH_ETCD_CLIENT_SERVICE_HOST=10.96.7.8 LATCH_ETCD_CLIENT_SERVICE_PORT=2379
  jq -e '.nodeName == "node-7" and .store.endpoints == ["https://10.96.7.8:2379"]' "$config" || fail "config: $(cat "$config")"
  local f
  for f in ca.crt tls.crt tls.key; do
    cmp "$secret/$f" "$etcd_dir/$f"
    [[ $(stat -c %a "$etcd_dir/$f") == 600 ]] || fail "$etcd_dir/$f is not 0600"
  done
  [[ $(stat -c %a "$etcd_dir") == 700 ]] || fail "$etcd_dir is not 0700"
  # Beside the driver, for a kube-controller-manager in a container: the configuration and the client's files.
  local beside="$PLUGINS/latch~loop/.latch"
  jq -e '.store.endpoints == ["https://10.96.7.8:2379"] and .store.tls == {ca: "etcd-ca.pem", cert: "etcd-cert.pem", key: "etcd-key.pem"}' \
    "$beside/config.json" || fail "beside: $(cat "$beside/config.json")"
  cmp "$secret/tls.key" "$beside/etcd-key.pem"
  kill -TERM "$ENTRYPOINT_PID"
  wait "$ENTRYPOINT_PID"

  # Without the Service in its environment (created after the pod), the pod exits, to be restarted with it.
  run env NODE_NAME=node-7 LATCH_CONFIG="$config" LATCH_CONFIG_TEMPLATE="$template" LATCH_READY_FILE="$LATCH_TMP/ready" \
    LATCH="$BUILD_A" LATCH_ETCD_SERVICE=latch-etcd-client sh "$LATCH_REPO_ROOT/install/entrypoint.sh"
  assert_failure 1
  assert_output --partial 'the Service latch-etcd-client is not in this pod'"'"'s environment'
}

@test "install --print-manifests: the built executable prints install/daemonset.yaml; a preset pins its directory" {
  run --separate-stderr "$BUILD_A" install --print-manifests
  assert_success
  [[ -z $stderr ]] || fail "stderr: $stderr"
  diff <(printf '%s\n' "$output") "$LATCH_REPO_ROOT/install/daemonset.yaml" || fail 'install/daemonset.yaml is not the generated output'

  run --separate-stderr "$BUILD_A" install --print-manifests --preset gke --image registry.example/latch:1 -o json
  assert_success
  jq -e '[.items[] | select(.kind == "DaemonSet")][0].spec.template.spec
      | (.volumes[] | select(.name == "plugin-dir") | .hostPath.path) == "/home/kubernetes/flexvolume"
        and .containers[0].image == "registry.example/latch:1"' <<<"$output" || fail "$output"

  run --separate-stderr "$BUILD_A" install --print-manifests --preset eks
  assert_failure 1
  [[ $stderr == *'unknown preset "eks": use one of upstream, openshift, gke, aks, rke, k3s, flatcar'* ]] || fail "stderr: $stderr"
  [[ -z $output ]] || fail "printed: $output"
}

# ---- the self-contained build ------------------------------------------------------------------------------------

@test "sea: the self-contained build keeps the call contract: one JSON object, empty stderr, exit codes" {
  require_sea
  # Installed where kubelet would run it, in place of the bundle common-setup put there.
  cp "$LATCH_SEA" "$LATCH_EXEC"

  latch_call init
  assert_reply Success
  jq -e '.capabilities | [.attach, .selinuxRelabel, .fsGroup, .requiresFSResize, .supportsMetrics] | all(type == "boolean")' <<<"$output"
  latch_call foo
  assert_reply 'Not supported'
  latch_call attach '{"kubernetes.io/fsType":' node-a
  assert_failure_naming JSON
  latch_call attach
  assert_failure_naming '<json>'
  run --separate-stderr "$LATCH_EXEC" version
  assert_success
  assert_output "$("$LATCH_BIN" version)"
}

@test "sea: prints the same manifests (its yaml library is evaluated from the string build.mjs embeds)" {
  require_sea
  run --separate-stderr "$LATCH_SEA" install --print-manifests
  assert_success
  [[ -z $stderr ]] || fail "stderr: $stderr"
  diff <(printf '%s\n' "$output") "$LATCH_REPO_ROOT/install/daemonset.yaml" || fail 'differs from install/daemonset.yaml'
}

@test "sea: installs itself (the executable, not a script), reloads its page cache, and doctor finds it identical" {
  require_sea
  local sea="$LATCH_TMP/builds/sea/latch-sea"
  mkdir -p "$(dirname "$sea")"
  cp "$LATCH_SEA" "$sea"
  install_with "$sea" install --plugin-dir "$PLUGINS" -o json
  jq -e --arg s "$sea" '.selfContained == true and .source == $s and .action == "installed" and .pageCache.reloaded == true' <<<"$output"
  cmp "$DRIVER" "$sea"
  only_the_driver_in "$PLUGINS" "$DRIVER"
  run --separate-stderr "$DRIVER" init
  assert_success
  [[ -z $stderr ]] || fail "stderr: $stderr"
  LATCH_VOLUME_PLUGIN_DIR="$PLUGINS" run --separate-stderr "$sea" doctor -o json
  jq -e '[.findings[] | select(.check == "driver")] | length == 1 and .[0].severity == "ok"
      and (.[0].message | contains("identical"))' <<<"$output" || fail "$output"
}
