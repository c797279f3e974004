// The cluster install as Kubernetes objects, built in code so that nobody edits YAML with sed: the Namespace, the
// ServiceAccount (and, on OpenShift, the Role that lets it use the privileged SCC), the ConfigMap every node's
// /etc/latch/config.json is made from, and the DaemonSet whose pod installs the driver on each node
// (install/entrypoint.sh). `latch install --print-manifests [--preset NAME]` prints them; install/daemonset.yaml is
// the output without a preset, and a test keeps the two equal.
//
// Where the driver goes on each node:
// - no preset, no --plugin-dir: the pod detects kubelet's plugin dir on its node. It shares the host's pid namespace
//   (kubelet's command line, and its config file through /proc/<pid>/root) and mounts the host's / at /host, where
//   `latch install --host-root /host` reads the host's files and writes the driver.
// - a preset or --plugin-dir: the DaemonSet is pinned to that directory, the only host directory of kubelet's it
//   mounts, at the same path (no host root, no host pid namespace).
import { parseConfig, refuseUnsafe } from '../config.js';
import { LatchError } from '../errors.js';
import type { Preset } from './presets.js';

const NAMESPACE = 'latch-system';
const NAME = 'latch';
const LABELS = { 'app.kubernetes.io/name': NAME };
/** Where the detecting DaemonSet mounts the host's /. */
const HOST_ROOT_MOUNT = '/host';
/** kubelet's root dir, where it mounts pod volumes: what a pinned DaemonSet's agent sees of the host's mounts. */
const KUBELET_DIR = '/var/lib/kubelet';

/** What every node gets without --cluster-config: the file store, attach mode unless the control plane is managed. */
export function defaultClusterConfig(preset?: Preset): Record<string, unknown> {
  return {
    driverName: 'latch/loop',
    attach: preset?.managedControlPlane !== true,
    poolDir: '/var/lib/latch/pool',
    stateDir: '/var/lib/latch/state',
    logFile: '/var/log/latch/latch.log',
    defaultSize: '1Gi',
    maxSize: '100Gi',
    defaultFsType: 'ext4',
    allowedFsTypes: ['ext4', 'xfs'],
    store: { type: 'file' },
  };
}

export interface ManifestOptions {
  /** Pins the DaemonSet to the preset's plugin dir, and adds what the distribution needs. */
  preset?: Preset;
  /** Pins the DaemonSet to this plugin dir (with a preset, the preset's own). */
  pluginDir?: string;
  /** The installer image. */
  image: string;
  /** --driver: installs under another vendor/driver name. */
  driver?: string;
  /** The ConfigMap's config.json, without nodeName (each node adds its own); `source` names it in messages. */
  clusterConfig: Record<string, unknown>;
  clusterConfigSource: string;
}

/** One Kubernetes object, with what the YAML says above it. */
export interface Manifest {
  comment: string;
  object: Record<string, unknown>;
}

export function buildManifests(options: ManifestOptions): Manifest[] {
  if ('nodeName' in options.clusterConfig) {
    throw new LatchError(`${options.clusterConfigSource} sets nodeName: every node sets its own; remove it`);
  }
  // The same validation a node applies, with a stand-in node name (the single node's, when there is one): a mistake
  // shows now, not on every node.
  const standIn = options.clusterConfig.singleNode ?? 'node-name';
  const config = refuseUnsafe(parseConfig({ ...options.clusterConfig, nodeName: standIn }, options.clusterConfigSource));
  const pluginDir = options.pluginDir ?? options.preset?.pluginDir;
  const manifests: Manifest[] = [
    {
      comment: 'The installer is privileged and uses hostPath volumes.',
      object: {
        apiVersion: 'v1',
        kind: 'Namespace',
        metadata: {
          name: NAMESPACE,
          labels: {
            ...LABELS,
            'pod-security.kubernetes.io/enforce': 'privileged',
            // OpenShift would otherwise set the pod-security labels from the SCCs, over the one above.
            ...(options.preset?.privilegedScc && { 'security.openshift.io/scc.podSecurityLabelSync': 'false' }),
          },
        },
      },
    },
    {
      comment: 'The pods never call the API server.',
      object: {
        apiVersion: 'v1',
        kind: 'ServiceAccount',
        metadata: { name: NAME, namespace: NAMESPACE, labels: LABELS },
        automountServiceAccountToken: false,
      },
    },
  ];
  if (options.preset?.privilegedScc) manifests.push(...privilegedSccRbac());
  manifests.push({
    comment:
      'Every node\'s /etc/latch/config.json is this plus "nodeName" (from spec.nodeName). Fields: docs/operations.md,\n' +
      '"Configuration". With more than one node in attach mode, the nodes and the control plane must share one\n' +
      'ledger: use the etcd store, or "attach": false.',
    object: {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: `${NAME}-config`, namespace: NAMESPACE, labels: LABELS },
      data: { 'config.json': `${JSON.stringify(options.clusterConfig, null, 2)}\n` },
    },
  });
  manifests.push(daemonSet({ ...options, pluginDir, attach: config.attach }));
  return manifests;
}

/** OpenShift admits a privileged pod only if its ServiceAccount may use the privileged SCC. */
function privilegedSccRbac(): Manifest[] {
  const name = `${NAME}-privileged-scc`;
  return [
    {
      comment: 'OpenShift: the installer pods run privileged, which the privileged SCC allows.',
      object: {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'Role',
        metadata: { name, namespace: NAMESPACE, labels: LABELS },
        rules: [
          {
            apiGroups: ['security.openshift.io'],
            resources: ['securitycontextconstraints'],
            resourceNames: ['privileged'],
            verbs: ['use'],
          },
        ],
      },
    },
    {
      comment: 'Granted to the latch ServiceAccount.',
      object: {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'RoleBinding',
        metadata: { name, namespace: NAMESPACE, labels: LABELS },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name },
        subjects: [{ kind: 'ServiceAccount', name: NAME, namespace: NAMESPACE }],
      },
    },
  ];
}

function daemonSet(options: ManifestOptions & { pluginDir: string | undefined; attach: boolean }): Manifest {
  const { pluginDir } = options;
  const hostDir = (name: string, path: string, type = 'DirectoryOrCreate') => ({ name, hostPath: { path, type } });
  const env: Record<string, unknown>[] = [{ name: 'NODE_NAME', valueFrom: { fieldRef: { fieldPath: 'spec.nodeName' } } }];
  const mounts: Record<string, unknown>[] = [];
  const volumes: Record<string, unknown>[] = [];
  if (pluginDir === undefined) {
    env.push({ name: 'LATCH_HOST_ROOT', value: HOST_ROOT_MOUNT });
    // HostToContainer: the host's later unmounts (kubelet's, of pod volumes) reach this copy of its mounts too;
    // otherwise the pod would keep every filesystem mounted at its start busy, loop devices included.
    mounts.push({ name: 'host-root', mountPath: HOST_ROOT_MOUNT, mountPropagation: 'HostToContainer' });
    volumes.push(hostDir('host-root', '/', 'Directory'));
  } else {
    env.push({ name: 'LATCH_VOLUME_PLUGIN_DIR', value: pluginDir });
    mounts.push({ name: 'plugin-dir', mountPath: pluginDir });
    volumes.push(hostDir('plugin-dir', pluginDir));
  }
  if (options.driver !== undefined) env.push({ name: 'LATCH_DRIVER', value: options.driver });
  env.push(
    { name: 'LATCH_CONFIG', value: '/etc/latch/config.json' },
    { name: 'LATCH_CONFIG_TEMPLATE', value: '/etc/latch-template/config.json' },
  );
  mounts.push(
    { name: 'config', mountPath: '/etc/latch' },
    { name: 'config-template', mountPath: '/etc/latch-template', readOnly: true },
    { name: 'state', mountPath: '/var/lib/latch' },
    { name: 'log', mountPath: '/var/log/latch' },
    { name: 'dev', mountPath: '/dev' },
  );
  volumes.push(
    hostDir('config', '/etc/latch'),
    { name: 'config-template', configMap: { name: `${NAME}-config` } },
    hostDir('state', '/var/lib/latch'),
    hostDir('log', '/var/log/latch'),
    hostDir('dev', '/dev', 'Directory'),
  );
  // The agent (`latch agent`: jobs, reaping, metrics) beside the installer, with the same view of the host: its mounts
  // (the host's / under /host when detecting, HostToContainer: kubelet's mounts of pod volumes are seen, so a busy
  // device is never released and a mounted filesystem can be frozen for a snapshot; kubelet's dir when pinned), /dev
  // for loop devices, the state, config and log. It starts once the installer has written this node's config.
  const agentMounts: Record<string, unknown>[] = mounts
    .filter((m) => m.name !== 'config-template' && m.name !== 'plugin-dir')
    .map((m) => (m.name === 'config' ? { ...m, readOnly: true } : m));
  if (pluginDir !== undefined) {
    agentMounts.push({ name: 'kubelet-dir', mountPath: KUBELET_DIR, mountPropagation: 'HostToContainer' });
    volumes.push(hostDir('kubelet-dir', KUBELET_DIR));
  }
  const agent = {
    name: 'agent',
    image: options.image,
    imagePullPolicy: 'IfNotPresent',
    command: ['/bin/sh', '-c', 'until [ -s "$LATCH_CONFIG" ]; do sleep 1; done; exec latch agent'],
    env: [{ name: 'LATCH_CONFIG', value: '/etc/latch/config.json' }],
    securityContext: { privileged: true },
    resources: { requests: { cpu: '10m', memory: '64Mi' }, limits: { memory: '512Mi' } },
    volumeMounts: agentMounts,
  };
  const where =
    pluginDir === undefined
      ? "The pod finds kubelet's plugin dir on its node: kubelet's --volume-plugin-dir, else volumePluginDir in its\n" +
        "config file, else the OpenShift 4 directory if it exists, else kubelet's default (hostPID for kubelet's\n" +
        "command line, the host's / at /host to read its files and write the driver)."
      : `The plugin dir is ${pluginDir}${options.preset ? ` (preset ${options.preset.name}: ${options.preset.title})` : ''}.`;
  return {
    comment:
      'latch on every node' +
      (options.attach ? ', control-plane nodes included (in attach mode kube-controller-manager runs the driver there)' : '') +
      '.\n' +
      "The install container writes this node's /etc/latch/config.json (the ConfigMap plus nodeName), copies the\n" +
      "self-contained driver into kubelet's plugin dir atomically, prints `latch doctor`, and sleeps. kubelet runs the\n" +
      'driver from the host; stopping or deleting the pod never removes it (`latch uninstall` on a drained node does).\n' +
      'The agent container runs `latch agent`: the jobs of the tickets granted to this node (snapshots, backups, ...;\n' +
      "docs/jobs.md), reaping, and /metrics on the node's 127.0.0.1:9742. hostNetwork: its per-volume locks (abstract\n" +
      "unix sockets) must be the same as the driver's, which kubelet runs in the host's network namespace.\n" +
      where,
    object: {
      apiVersion: 'apps/v1',
      kind: 'DaemonSet',
      metadata: { name: NAME, namespace: NAMESPACE, labels: LABELS },
      spec: {
        selector: { matchLabels: LABELS },
        updateStrategy: { type: 'RollingUpdate', rollingUpdate: { maxUnavailable: 1 } },
        template: {
          metadata: { labels: LABELS },
          spec: {
            serviceAccountName: NAME,
            automountServiceAccountToken: false,
            ...(pluginDir === undefined && { hostPID: true }),
            hostNetwork: true,
            // Attach mode: KCM calls attach, isattached and detach on the control-plane nodes.
            ...(options.attach && {
              tolerations: ['node-role.kubernetes.io/control-plane', 'node-role.kubernetes.io/master'].map((key) => ({
                key,
                operator: 'Exists',
                effect: 'NoSchedule',
              })),
            }),
            terminationGracePeriodSeconds: 5,
            containers: [
              {
                name: 'install',
                image: options.image,
                imagePullPolicy: 'IfNotPresent',
                env,
                securityContext: { privileged: true },
                readinessProbe: { exec: { command: ['cat', '/tmp/latch-installed'] }, periodSeconds: 10 },
                resources: { requests: { cpu: '10m', memory: '32Mi' }, limits: { memory: '256Mi' } },
                volumeMounts: mounts,
              },
              agent,
            ],
            volumes,
          },
        },
      },
    },
  };
}

/** YAML documents with their comments (the yaml library is loaded only here: only this command needs it). */
export async function manifestsYaml(manifests: Manifest[], header: string): Promise<string> {
  const { Document } = await import('yaml');
  const comment = (text: string) => text.replace(/^/gm, ' ');
  const docs = manifests.map((m, i) => {
    const doc = new Document(m.object, { aliasDuplicateObjects: false });
    doc.commentBefore = comment(i === 0 ? `${header}\n\n${m.comment}` : m.comment);
    return doc.toString({ lineWidth: 0 });
  });
  return docs.join('---\n');
}

/** The same objects as one JSON List, which kubectl applies too. */
export function manifestsJson(manifests: Manifest[]): string {
  return `${JSON.stringify({ apiVersion: 'v1', kind: 'List', items: manifests.map((m) => m.object) }, null, 2)}\n`;
}
