// The plugin-dir layouts users hit, one row per distribution: where its kubelet (and KCM) look for FlexVolume
// drivers, and what else differs there. `latch install --preset NAME` installs into the row's directory and
// `latch install --print-manifests --preset NAME` pins the DaemonSet to it; without a preset the DaemonSet detects
// the directory on each node (plugin-dir.ts). Each fact names its source.
import { LatchError } from '../errors.js';
import { DEFAULT_PLUGIN_DIR, OPENSHIFT_PLUGIN_DIR } from './plugin-dir.js';

export interface Preset {
  name: string;
  /** The distribution, for people. */
  title: string;
  /** kubelet's FlexVolume plugin dir there; KCM's --flex-volume-plugin-dir must be the same for attach mode. */
  pluginDir: string;
  /** What else differs on these hosts, for people (`--help`, docs/operations.md). */
  notes: readonly string[];
  /** OpenShift: the pods need the privileged SecurityContextConstraints, granted by a Role in the manifests. */
  privilegedScc?: true;
  /** GKE, AKS: KCM runs where latch cannot install, so attach mode cannot work and the default config turns it off. */
  managedControlPlane?: true;
}

export const PRESETS: readonly Preset[] = [
  {
    // kubelet's and KCM's built-in default (kubernetes/community, contributors/devel/sig-storage/flexvolume.md,
    // "Prerequisites"); kubeadm mounts it into its KCM pod (kubernetes/kubeadm#410, kubernetes/kubernetes#51296).
    name: 'upstream',
    title: 'upstream kubelet default (kubeadm and most package installs)',
    pluginDir: DEFAULT_PLUGIN_DIR,
    notes: ['kubeadm mounts this directory into its kube-controller-manager pod'],
  },
  {
    // The machine-config operator starts kubelet with --volume-plugin-dir=/etc/kubernetes/kubelet-plugins/volume/exec
    // because /usr is read-only on RHCOS (openshift/installer#1681, openshift/machine-config-operator#315).
    // Privileged pods need the privileged SCC (OpenShift docs, "Managing security context constraints").
    name: 'openshift',
    title: 'OpenShift 4 (RHCOS)',
    pluginDir: OPENSHIFT_PLUGIN_DIR,
    notes: ['the pods need the privileged SecurityContextConstraints: the manifests grant it to the latch ServiceAccount'],
    privilegedScc: true,
  },
  {
    // GKE's node set-up passes --volume-plugin-dir=/home/kubernetes/flexvolume and bind-remounts that directory with
    // "exec", since COS mounts /home noexec and /usr read-only (kubernetes cluster/gce/gci/configure-helper.sh,
    // remount-flexvolume-directory; Longhorn's chart, values.yaml "for GKE uses /home/kubernetes/flexvolume").
    name: 'gke',
    title: 'GKE on Container-Optimized OS',
    pluginDir: '/home/kubernetes/flexvolume',
    notes: [
      'the node set-up remounts this directory with exec; the rest of /home is noexec and /usr read-only',
      'the managed control plane cannot run the driver: the default configuration here has "attach": false',
    ],
    managedControlPlane: true,
  },
  {
    // aks-engine starts kubelet with --volume-plugin-dir=/etc/kubernetes/volumeplugins (Azure/acs-engine#1909), where
    // Azure's own FlexVolume drivers install (Azure/kubernetes-volume-drivers, flexvolume/*/deployment).
    name: 'aks',
    title: 'AKS and aks-engine',
    pluginDir: '/etc/kubernetes/volumeplugins',
    notes: ['the managed control plane cannot run the driver: the default configuration here has "attach": false'],
    managedControlPlane: true,
  },
  {
    // RKE runs kubelet in a container with --volume-plugin-dir=/var/lib/kubelet/volumeplugins, a directory it
    // bind-mounts from the host (rancher/rancher-catalog#1117; fstab/cifs#1: "RKE uses /var/lib/kubelet/volumeplugins").
    name: 'rke',
    title: 'Rancher RKE',
    pluginDir: '/var/lib/kubelet/volumeplugins',
    notes: ['kubelet runs in a container; its command line is still visible in the host /proc'],
  },
  {
    // k3s runs kubelet inside the k3s process with kubelet's default plugin dir unless --kubelet-arg
    // volume-plugin-dir=... is given (k3s-io/k3s#1631); its kubelet config drop-ins are in
    // /var/lib/rancher/k3s/agent/etc/kubelet.conf.d (k3s-io/k3s#2116). k3OS has a read-only /usr
    // (rancher/k3os#282): there pass --kubelet-arg and --kube-controller-manager-arg with a writable directory.
    name: 'k3s',
    title: 'k3s',
    pluginDir: DEFAULT_PLUGIN_DIR,
    notes: [
      'kubelet runs inside the k3s process: detection reads its --kubelet-arg volume-plugin-dir=...',
      'a plugin dir set in /etc/rancher/k3s/config.yaml (kubelet-arg) is not on the command line: pass --plugin-dir',
    ],
  },
  {
    // /usr is read-only on Container Linux and Flatcar (coreos/bugs#2201); Typhoon starts kubelet with
    // --volume-plugin-dir=/var/lib/kubelet/volumeplugins (poseidon/typhoon#61, #142), the directory Rook's docs
    // recommend for CoreOS (rook.io/docs/rook/v0.7/flexvolume.html).
    name: 'flatcar',
    title: 'Flatcar and CoreOS (read-only /usr)',
    pluginDir: '/var/lib/kubelet/volumeplugins',
    notes: [
      "kubelet's default is on the read-only /usr: kubelet needs --volume-plugin-dir=/var/lib/kubelet/volumeplugins (Typhoon sets it)",
      'and KCM --flex-volume-plugin-dir with the same directory for attach mode',
    ],
  },
];

export const PRESET_NAMES = PRESETS.map((p) => p.name);

/** The preset of that name; anything else is a mistake that lists the valid names. */
export function presetNamed(name: string): Preset {
  const found = PRESETS.find((p) => p.name === name);
  if (!found) throw new LatchError(`unknown preset ${JSON.stringify(name)}: use one of ${PRESET_NAMES.join(', ')}`);
  return found;
}
