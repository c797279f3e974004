#!/bin/sh
# The DaemonSet container: write this node's latch configuration, install the driver into kubelet's plugin dir,
# report `latch doctor`, then sleep until stopped. Every start installs again (an unchanged build changes nothing).
# Stopping never removes the driver: kubelet needs it to unmount and detach volumes that are still in use, even
# while this pod is being replaced. `latch uninstall` on a drained node is the only way it goes.
#
# Environment: NODE_NAME (required, from spec.nodeName), LATCH_CONFIG (default /etc/latch/config.json),
# LATCH_CONFIG_TEMPLATE (default /etc/latch-template/config.json; when missing, an existing config is kept and only
# its nodeName is set), LATCH_VOLUME_PLUGIN_DIR (the plugin dir, when the DaemonSet is pinned to one),
# LATCH_HOST_ROOT (where the host's / is mounted, when the DaemonSet detects the plugin dir), LATCH_DRIVER (vendor/driver),
# LATCH_READY_FILE (default /tmp/latch-installed: written once installed, for the readiness probe),
# LATCH_CONFIG_BESIDE_DRIVER (true: also install the configuration beside the driver, for a containerized
# kube-controller-manager; the control-plane DaemonSet sets it), LATCH_ETCD_CLIENT_SECRET (where the Secret with the
# etcd client's ca.crt, tls.crt and tls.key is mounted: copied to <config dir>/etcd/ on the host, 0600),
# LATCH_ETCD_SERVICE (latch's etcd's client Service: its cluster IP, from the pod's environment, becomes the
# configuration's endpoint, since the host that runs the driver has no cluster DNS),
# LATCH (the latch executable, default: latch on PATH).
set -eu

: "${NODE_NAME:?NODE_NAME must be set (the DaemonSet takes it from spec.nodeName)}"
config=${LATCH_CONFIG:-/etc/latch/config.json}
template=${LATCH_CONFIG_TEMPLATE:-/etc/latch-template/config.json}
ready=${LATCH_READY_FILE:-/tmp/latch-installed}
latch=${LATCH:-latch}

log() { printf 'latch-entrypoint: %s\n' "$*"; }

# The configuration: the template (or the config already on the host) with this node's name, replaced by rename
# so a driver call never reads half a file.
mkdir -p "$(dirname "$config")"
if [ -f "$template" ]; then
  base=$template
elif [ -f "$config" ]; then
  base=$config
else
  base=""
fi
# The etcd client's files, before the configuration that names them; each replaced by rename.
if [ -n "${LATCH_ETCD_CLIENT_SECRET:-}" ]; then
  etcd_dir="$(dirname "$config")/etcd"
  mkdir -p "$etcd_dir"
  chmod 0700 "$etcd_dir"
  for f in ca.crt tls.crt tls.key; do
    cp "$LATCH_ETCD_CLIENT_SECRET/$f" "$etcd_dir/.$f.$$"
    chmod 0600 "$etcd_dir/.$f.$$"
    mv -f "$etcd_dir/.$f.$$" "$etcd_dir/$f"
  done
  log "wrote the etcd client's files in $etcd_dir"
fi
endpoints=null
if [ -n "${LATCH_ETCD_SERVICE:-}" ]; then
  prefix=$(printf '%s' "$LATCH_ETCD_SERVICE" | tr 'a-z-' 'A-Z_')
  case $prefix in '' | *[!A-Z0-9_]*) log "LATCH_ETCD_SERVICE must be a Service name"; exit 1 ;; esac
  eval "etcd_host=\${${prefix}_SERVICE_HOST:-} etcd_port=\${${prefix}_SERVICE_PORT:-}"
  if [ -z "$etcd_host" ] || [ -z "$etcd_port" ]; then
    log "the Service $LATCH_ETCD_SERVICE is not in this pod's environment (it did not exist when the pod started); restarting"
    exit 1
  fi
  case $etcd_host in *:*) etcd_host="[$etcd_host]" ;; esac
  endpoints="[\"https://$etcd_host:$etcd_port\"]"
fi
tmp="$(dirname "$config")/.$(basename "$config").$$"
filter='.nodeName = $node | if $endpoints then .store.endpoints = $endpoints else . end'
if [ -n "$base" ]; then
  jq --arg node "$NODE_NAME" --argjson endpoints "$endpoints" "$filter" "$base" >"$tmp"
else
  jq -n --arg node "$NODE_NAME" --argjson endpoints "$endpoints" "{} | $filter" >"$tmp"
fi
chmod 0644 "$tmp"
mv -f "$tmp" "$config"
log "wrote $config for node $NODE_NAME${base:+ (from $base)}"

set -- install -o json
if [ -n "${LATCH_DRIVER:-}" ]; then set -- "$@" --driver "$LATCH_DRIVER"; fi
if [ -n "${LATCH_HOST_ROOT:-}" ]; then set -- "$@" --host-root "$LATCH_HOST_ROOT"; fi
if [ "${LATCH_CONFIG_BESIDE_DRIVER:-}" = true ]; then set -- "$@" --config-beside-driver; fi
result=$("$latch" "$@")
: >"$ready"
log "$(printf '%s' "$result" | jq -r '"\(.action) \(.path) (sha256 \(.sha256[0:12])); plugin dir \(.pluginDir): \(.reason)"')"
# The plugin dir as this container reaches it (under the host root when detecting): the driver's grandparent.
plugin_dir=$(dirname "$(dirname "$(printf '%s' "$result" | jq -r .path)")")

# For `kubectl logs`: what doctor sees from inside this container (the tools it checks are the image's; run
# `<plugin dir>/latch~loop/loop doctor` on the host for the host's view). Its findings never stop the pod.
"$latch" doctor --plugin-dir "$plugin_dir" || log "latch doctor reported findings (exit $?); see above"

sleeper=""
trap 'log "stopping; the driver stays installed"; [ -n "$sleeper" ] && kill "$sleeper" 2>/dev/null; exit 0' TERM INT
sleep infinity &
sleeper=$!
wait "$sleeper"
