# For install.bats: latch_setup, plus an environment in which install, uninstall and doctor can never reach the
# host's real kubelet or plugin dirs, two distinguishable builds to install, and an inotify watcher that judges
# every event in a plugin dir the moment it happens.
#
#   install_setup / install_teardown   instead of latch_setup / latch_teardown
#   LATCH_PROC_ROOT            a fake /proc (empty unless plant_kubelet puts a kubelet in it)
#   LATCH_DEFAULT_PLUGIN_DIR, LATCH_OPENSHIFT_PLUGIN_DIR   stand-ins for kubelet's default and OpenShift's dir
#   PLUGINS                    a plugin dir for the tests' installs (not created)
#   BUILD_A, BUILD_B           copies of bin/latch; B has a comment appended, so the two differ
#   LATCH_SEA                  the self-contained build (require_sea skips or fails when it is missing)
#
# Load it after common-setup:
#   load 'test_helper/common-setup'
#   load 'test_helper/install-setup'

install_setup() {
  latch_setup
  export LATCH_PROC_ROOT="$LATCH_TMP/proc"
  export LATCH_DEFAULT_PLUGIN_DIR="$LATCH_TMP/default/kubelet-plugins/volume/exec"
  export LATCH_OPENSHIFT_PLUGIN_DIR="$LATCH_TMP/openshift/kubelet-plugins/volume/exec"
  unset LATCH_VOLUME_PLUGIN_DIR LATCH_TOOL_PATH
  mkdir -p "$LATCH_PROC_ROOT"
  PLUGINS="$LATCH_TMP/plugins/volume/exec"
  DRIVER="$PLUGINS/latch~loop/loop"

  mkdir -p "$LATCH_TMP/builds/a" "$LATCH_TMP/builds/b"
  BUILD_A="$LATCH_TMP/builds/a/latch"
  BUILD_B="$LATCH_TMP/builds/b/latch"
  cp "$LATCH_BIN" "$BUILD_A"
  cp "$LATCH_BIN" "$BUILD_B"
  printf '\n// build b\n' >>"$BUILD_B"
  chmod 0755 "$BUILD_A" "$BUILD_B"
  : "${LATCH_SEA:=$LATCH_REPO_ROOT/bin/latch-sea}"
}

install_teardown() {
  latch_teardown
}

# require_sea -- skips the test when the self-contained build is missing, unless LATCH_REQUIRE_SEA=1 (npm test),
# where that is a failure.
require_sea() {
  [[ -x $LATCH_SEA ]] && return 0
  [[ ${LATCH_REQUIRE_SEA:-} == 1 ]] && fail "$LATCH_SEA is missing: run 'npm run build:sea'"
  skip "$LATCH_SEA is missing: run 'npm run build:sea'"
}

# plant_kubelet PID ARGV... -- a process in the fake /proc with that command line (comm = basename of ARGV[0]).
plant_kubelet() {
  local pid=$1
  shift
  mkdir -p "$LATCH_PROC_ROOT/$pid"
  printf '%s\0' "$@" >"$LATCH_PROC_ROOT/$pid/cmdline"
  basename "$1" >"$LATCH_PROC_ROOT/$pid/comm"
}

# start_watcher DIR DRIVER_DIR DRIVER_NAME GOOD_FILE... -- watches DIR recursively (inotifywait -m -r) and judges
# each event as it arrives, one line per event in $WATCH_LOG:
#   ok ...    an event on a dot-file in DRIVER_DIR, or the driver renamed into place as an executable identical
#             to one of the GOOD_FILEs
#   BAD ...   anything else: a file other than the driver appearing, the driver written, chmod-ed or removed in
#             place, or a rename that exposes an incomplete file
# DRIVER_DIR must exist already (a new directory is only watched once inotifywait has seen it).
start_watcher() {
  local dir=$1
  shift
  WATCH_LOG="$LATCH_TMP/watch.log"
  mkfifo "$LATCH_TMP/watch.fifo"
  _judge_events "$@" <"$LATCH_TMP/watch.fifo" >"$WATCH_LOG" &
  JUDGE_PID=$!
  inotifywait -m -r --format '%e|%w|%f' \
    -e create -e modify -e attrib -e close_write -e moved_from -e moved_to -e delete -e delete_self \
    "$dir" >"$LATCH_TMP/watch.fifo" 2>"$LATCH_TMP/watch.err" &
  WATCHER_PID=$!
  latch_on_teardown "kill $WATCHER_PID 2>/dev/null; wait $JUDGE_PID 2>/dev/null; true"
  local i
  for ((i = 0; i < 200; i++)); do
    grep -q 'Watches established' "$LATCH_TMP/watch.err" 2>/dev/null && return 0
    sleep 0.05
  done
  fail "inotifywait did not start: $(cat "$LATCH_TMP/watch.err")"
}

# stop_watcher -- lets the last events arrive, stops inotifywait and waits until every event is judged.
stop_watcher() {
  sleep 0.5
  kill "$WATCHER_PID" 2>/dev/null || true
  wait "$WATCHER_PID" 2>/dev/null || true
  wait "$JUDGE_PID" 2>/dev/null || true
}

_judge_events() {
  local driver_dir=${1%/}/ driver=$2
  shift 2
  # Hashes, not cmp against each build in turn: the file is read once, so a rename between two reads cannot make
  # a complete driver look incomplete.
  local good_sums=() good
  for good in "$@"; do good_sums+=("$(sha256sum <"$good" | cut -d' ' -f1)"); done
  local events dir name path complete sum
  while IFS='|' read -r events dir name; do
    path="$dir$name"
    if [[ $dir != "$driver_dir" ]]; then
      echo "BAD outside the driver's directory: $events $path"
    elif [[ -z $name ]]; then
      echo "BAD on the driver's directory itself: $events $path"
    elif [[ $name == .* ]]; then
      echo "ok dot-file: $events $path"
    elif [[ $name != "$driver" ]]; then
      echo "BAD a file other than the driver: $events $path"
    elif [[ $events != MOVED_TO ]]; then
      echo "BAD the driver itself changed in place (not renamed into place): $events $path"
    else
      complete=no
      if [[ -f $path && -x $path ]] && sum=$(sha256sum <"$path" | cut -d' ' -f1); then
        for good in "${good_sums[@]}"; do
          [[ $sum == "$good" ]] && complete=yes && break
        done
      fi
      if [[ $complete == yes ]]; then
        echo "ok complete: $events $path"
      else
        echo "BAD incomplete or unknown file renamed into place: $events $path ($(stat -c '%s bytes, mode %a' "$path" 2>&1))"
      fi
    fi
  done
}

# tool_dir_without TOOL... -- prints a directory holding links to every tool latch and doctor use except TOOLs
# (for LATCH_TOOL_PATH).
tool_dir_without() {
  local dir="$LATCH_TMP/tools" tool found skip
  mkdir -p "$dir"
  for tool in losetup blkid mount umount findmnt setpriv mkfs.ext4 mkfs.ext3 resize2fs mkfs.xfs xfs_growfs mkfs.btrfs btrfs node; do
    for skip in "$@"; do [[ $tool == "$skip" ]] && continue 2; done
    found=$(PATH="$PATH:/usr/sbin:/sbin" command -v "$tool") || continue
    ln -sf "$found" "$dir/$tool"
  done
  printf '%s\n' "$dir"
}
