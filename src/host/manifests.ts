// The cluster install as Kubernetes objects, built in code so that nobody edits YAML with sed: the Namespace, the
// ServiceAccount (and, on OpenShift, the Role that lets it use the privileged SCC), latch's own etcd (below), the
// ConfigMap every node's /etc/latch/config.json is made from, and the DaemonSets whose pods install the driver on
// each node (install/entrypoint.sh). `latch install --print-manifests [--preset NAME]` prints them;
// install/daemonset.yaml is the output without a preset, and a test keeps the two equal.
//
// The shared ledger: unless --cluster-config names a store or --single-node says there is one node, the nodes and the
// control plane share latch's own etcd, a StatefulSet of 3 members with their data in a hostPath of the node each runs
// on (as Rook keeps its monitors'), so it never depends on latch's own volumes. Its TLS material is made once by a Job
// (`latch install --make-etcd-certs`, host/etcd-secrets.ts) and kept in Secrets. Nodes reach it from the host's
// network, where there is no cluster DNS: the entrypoint writes the client Service's cluster IP into each node's
// configuration.
//
// Attach mode: the pods on control-plane nodes (a DaemonSet of their own) also install the configuration and the
// client certificate beside the driver (--config-beside-driver), where a kube-controller-manager in a container finds
// them, so `kubectl apply` is all the control plane needs.
//
// Where the driver goes on each node:
// - no preset, no --plugin-dir: the pod detects kubelet's plugin dir on its node. It shares the host's pid namespace
//   (kubelet's command line, and its config file through /proc/<pid>/root) and mounts the host's / at /host, where
//   `latch install --host-root /host` reads the host's files and writes the driver.
// - a preset or --plugin-dir: the DaemonSet is pinned to that directory, the only host directory of kubelet's it
//   mounts, at the same path (no host root, no host pid namespace).
import { parseConfig, refuseUnsafe } from '../config.js';
import { LatchError } from '../errors.js';
import { ETCD, LATCH_NAMESPACE } from './etcd-secrets.js';
import type { Preset } from './presets.js';

const NAMESPACE = LATCH_NAMESPACE;
const NAME = 'latch';
const LABELS = { 'app.kubernetes.io/name': NAME };
/** Where the detecting DaemonSet mounts the host's /. */
const HOST_ROOT_MOUNT = '/host';
/** kubelet's root dir, where it mounts pod volumes: what a pinned DaemonSet's agent sees of the host's mounts. */
const KUBELET_DIR = '/var/lib/kubelet';

/** Where the entrypoint puts the etcd client's files on each host (from the Secret latch-etcd-client). */
const ETCD_CLIENT_DIR = '/etc/latch/etcd';
/** Where the install container sees the Secret latch-etcd-client. */
const ETCD_CLIENT_SECRET_MOUNT = '/etc/latch-etcd-client';
/** The control-plane nodes' labels (the older one still on some clusters), and their taints, of the same keys. */
const CONTROL_PLANE_LABELS = ['node-role.kubernetes.io/control-plane', 'node-role.kubernetes.io/master'];

/**
 * What every node gets without --cluster-config: latch's own etcd as the shared ledger, attach mode unless the
 * control plane is managed; with --single-node, that node's file store and non-attach mode (a kube-controller-manager
 * in a container could not reach the file store on its host).
 */
export function defaultClusterConfig(preset?: Preset, singleNode?: string): Record<string, unknown> {
  const store =
    singleNode !== undefined
      ? { type: 'file' }
      : {
          type: 'etcd',
          // The name pods resolve; the entrypoint replaces it with the Service's cluster IP for the host.
          endpoints: [`https://${ETCD.clientService}.${NAMESPACE}.svc:${ETCD.clientPort}`],
          tls: { ca: `${ETCD_CLIENT_DIR}/ca.crt`, cert: `${ETCD_CLIENT_DIR}/tls.crt`, key: `${ETCD_CLIENT_DIR}/tls.key` },
        };
  return {
    driverName: 'latch/loop',
    attach: singleNode === undefined && preset?.managedControlPlane !== true,
    ...(singleNode !== undefined && { singleNode }),
    poolDir: '/var/lib/latch/pool',
    stateDir: '/var/lib/latch/state',
    logFile: '/var/log/latch/latch.log',
    defaultSize: '1Gi',
    maxSize: '100Gi',
    defaultFsType: 'ext4',
    allowedFsTypes: ['ext4', 'xfs'],
    store,
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
  /** latch's own etcd (StatefulSet, Services, the certificates' Job), which clusterConfig's store names. */
  ownEtcd: boolean;
  /** --single-node: every pod of latch runs on this node only. */
  singleNode?: string;
  /** --etcd-nodes: the nodes latch's etcd members are pinned to (default: any three, control-plane nodes first). */
  etcdNodes?: readonly string[];
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
      comment: `The pods of latch's DaemonSets${options.ownEtcd ? ' and of its etcd' : ''} never call the API server.`,
      object: {
        apiVersion: 'v1',
        kind: 'ServiceAccount',
        metadata: { name: NAME, namespace: NAMESPACE, labels: LABELS },
        automountServiceAccountToken: false,
      },
    },
  ];
  if (options.preset?.privilegedScc) manifests.push(...privilegedSccRbac());
  if (options.ownEtcd) manifests.push(...latchEtcd(options.image, options.etcdNodes));
  const ledger = options.ownEtcd
    ? "The ledger is latch's own etcd (latch-etcd above): on each host the entrypoint replaces the endpoint with the\n" +
      "client Service's cluster IP (the host has no cluster DNS) and puts the client certificate in /etc/latch/etcd."
    : config.store.type === 'etcd'
      ? 'The ledger is the etcd named in store: every node needs its TLS files at the paths given.'
      : config.singleNode !== undefined
        ? `The ledger is the file store of the one node ${config.singleNode}.`
        : 'The ledger is a file store: each node has its own, which is safe on one node only.';
  manifests.push({
    comment:
      'Every node\'s /etc/latch/config.json is this plus "nodeName" (from spec.nodeName). Fields: docs/operations.md,\n' +
      `"Configuration".\n${ledger}`,
    object: {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: `${NAME}-config`, namespace: NAMESPACE, labels: LABELS },
      data: { 'config.json': `${JSON.stringify(options.clusterConfig, null, 2)}\n` },
    },
  });
  const common = { ...options, pluginDir, attach: config.attach, manualRoot: config.manualAttach.mountRoot };
  if (options.singleNode !== undefined) {
    manifests.push(daemonSet({ ...common, role: { kind: 'single-node', node: options.singleNode } }));
  } else if (config.attach) {
    manifests.push(daemonSet({ ...common, role: { kind: 'workers' } }), daemonSet({ ...common, role: { kind: 'control-plane' } }));
  } else {
    manifests.push(daemonSet({ ...common, role: { kind: 'all' } }));
  }
  manifests.push(...inlineVolumePolicy(options.driver ?? config.driverName));
  return manifests;
}

/** Which nodes a DaemonSet's pods run on. */
type DaemonSetRole = { kind: 'all' } | { kind: 'workers' } | { kind: 'control-plane' } | { kind: 'single-node'; node: string };

const controlPlaneTolerations = () => CONTROL_PLANE_LABELS.map((key) => ({ key, operator: 'Exists', effect: 'NoSchedule' }));

/** The node affinity of a DaemonSet's pods, by role. */
function nodeAffinity(role: DaemonSetRole): Record<string, unknown> | undefined {
  const terms =
    role.kind === 'workers'
      ? [{ matchExpressions: CONTROL_PLANE_LABELS.map((key) => ({ key, operator: 'DoesNotExist' })) }]
      : role.kind === 'control-plane'
        ? CONTROL_PLANE_LABELS.map((key) => ({ matchExpressions: [{ key, operator: 'Exists' }] }))
        : role.kind === 'single-node'
          ? [{ matchExpressions: [{ key: 'kubernetes.io/hostname', operator: 'In', values: [role.node] }] }]
          : undefined;
  return terms && { nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: { nodeSelectorTerms: terms } } };
}

/**
 * latch's own etcd: the certificates' Job (with the ServiceAccount and Role that let it create Secrets), the headless
 * Service of the members' names, the client Service, and the StatefulSet of members.
 */
function latchEtcd(image: string, etcdNodes: readonly string[] | undefined): Manifest[] {
  const labels = { 'app.kubernetes.io/name': ETCD.name, 'app.kubernetes.io/part-of': NAME };
  const certs = `${ETCD.name}-certs`;
  const secretNames = Object.values(ETCD.secrets);
  const peer = (member: string) => `https://${member}.${ETCD.name}.${NAMESPACE}.svc`;
  const members = Array.from({ length: ETCD.members }, (_, i) => `${ETCD.name}-${i}`);
  const tlsDir = '/etc/latch-etcd';
  const dataDir = '/var/lib/latch-etcd';
  const flags = [
    '--name=$(POD_NAME)',
    // One directory per member name: a member that comes back on this node finds its own data, never another's.
    `--data-dir=${dataDir}/$(POD_NAME)`,
    `--listen-client-urls=https://0.0.0.0:${ETCD.clientPort}`,
    `--advertise-client-urls=${peer('$(POD_NAME)')}:${ETCD.clientPort}`,
    `--listen-peer-urls=https://0.0.0.0:${ETCD.peerPort}`,
    `--initial-advertise-peer-urls=${peer('$(POD_NAME)')}:${ETCD.peerPort}`,
    `--initial-cluster=${members.map((m) => `${m}=${peer(m)}:${ETCD.peerPort}`).join(',')}`,
    '--initial-cluster-state=new',
    `--initial-cluster-token=${ETCD.name}`,
    '--client-cert-auth',
    `--trusted-ca-file=${tlsDir}/ca.crt`,
    `--cert-file=${tlsDir}/tls.crt`,
    `--key-file=${tlsDir}/tls.key`,
    '--peer-client-cert-auth',
    `--peer-trusted-ca-file=${tlsDir}/ca.crt`,
    `--peer-cert-file=${tlsDir}/tls.crt`,
    `--peer-key-file=${tlsDir}/tls.key`,
    // Plain http for the probes only: /health and /metrics, no keys.
    `--listen-metrics-urls=http://0.0.0.0:${ETCD.metricsPort}`,
    // The ledger rewrites the same few keys: keep an hour of history, not all of it.
    '--auto-compaction-mode=periodic',
    '--auto-compaction-retention=1h',
  ];
  const pinned =
    etcdNodes !== undefined
      ? {
          requiredDuringSchedulingIgnoredDuringExecution: {
            nodeSelectorTerms: [{ matchExpressions: [{ key: 'kubernetes.io/hostname', operator: 'In', values: [...etcdNodes] }] }],
          },
        }
      : {
          preferredDuringSchedulingIgnoredDuringExecution: CONTROL_PLANE_LABELS.map((key) => ({
            weight: 50,
            preference: { matchExpressions: [{ key, operator: 'Exists' }] },
          })),
        };
  return [
    {
      comment: "latch's etcd: the Job that makes its certificates creates Secrets in this namespace, as this account.",
      object: {
        apiVersion: 'v1',
        kind: 'ServiceAccount',
        metadata: { name: certs, namespace: NAMESPACE, labels: LABELS },
      },
    },
    {
      comment: 'It may create Secrets (Kubernetes cannot limit a create to names) and read only its own three.',
      object: {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'Role',
        metadata: { name: certs, namespace: NAMESPACE, labels: LABELS },
        rules: [
          { apiGroups: [''], resources: ['secrets'], verbs: ['create'] },
          { apiGroups: [''], resources: ['secrets'], resourceNames: secretNames, verbs: ['get'] },
        ],
      },
    },
    {
      comment: `Granted to ${certs}.`,
      object: {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'RoleBinding',
        metadata: { name: certs, namespace: NAMESPACE, labels: LABELS },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: certs },
        subjects: [{ kind: 'ServiceAccount', name: certs, namespace: NAMESPACE }],
      },
    },
    {
      comment:
        "The members' names (latch-etcd-0.latch-etcd.latch-system.svc, ...), published before they are ready: a member\n" +
        'must reach its peers to become ready at all.',
      object: {
        apiVersion: 'v1',
        kind: 'Service',
        metadata: { name: ETCD.name, namespace: NAMESPACE, labels },
        spec: {
          clusterIP: 'None',
          publishNotReadyAddresses: true,
          selector: labels,
          ports: [
            { name: 'client', port: ETCD.clientPort },
            { name: 'peer', port: ETCD.peerPort },
          ],
        },
      },
    },
    {
      comment:
        "The address nodes and kube-controller-manager reach the ledger at: a cluster IP, which the host's network\n" +
        "reaches too. Create it before the pods that read it from their environment (this file's order does).",
      object: {
        apiVersion: 'v1',
        kind: 'Service',
        metadata: { name: ETCD.clientService, namespace: NAMESPACE, labels },
        spec: { selector: labels, ports: [{ name: 'client', port: ETCD.clientPort }] },
      },
    },
    {
      comment:
        "Makes latch's etcd's CA, its members' certificate and the client certificate, each only if its Secret is\n" +
        'missing (latch-etcd-ca, latch-etcd-member, latch-etcd-client): running it again changes nothing. It removes\n' +
        'itself once done, so that applying these manifests again (a new image) can create it anew.',
      object: {
        apiVersion: 'batch/v1',
        kind: 'Job',
        metadata: { name: certs, namespace: NAMESPACE, labels: LABELS },
        spec: {
          backoffLimit: 10,
          ttlSecondsAfterFinished: 600,
          template: {
            metadata: { labels: LABELS },
            spec: {
              serviceAccountName: certs,
              restartPolicy: 'Never',
              containers: [
                {
                  name: 'make-certs',
                  image,
                  imagePullPolicy: 'IfNotPresent',
                  command: ['latch', 'install', '--make-etcd-certs'],
                  resources: { requests: { cpu: '10m', memory: '64Mi' }, limits: { memory: '256Mi' } },
                },
              ],
            },
          },
        },
      },
    },
    {
      comment:
        `latch's etcd: ${ETCD.members} members, one per node, each keeping its data in ${dataDir}/<member> on its node (a\n` +
        "hostPath, never latch's own volumes). A member that moves to another node finds no data there and cannot\n" +
        'rejoin by itself: pin them with --etcd-nodes (docs/operations.md, "The shared ledger"). Its pods wait for\n' +
        'the Secret latch-etcd-member, which the Job above makes. Peers and clients use TLS with client certificates.',
      object: {
        apiVersion: 'apps/v1',
        kind: 'StatefulSet',
        metadata: { name: ETCD.name, namespace: NAMESPACE, labels },
        spec: {
          serviceName: ETCD.name,
          replicas: ETCD.members,
          // All at once: no member is ready before a quorum of them runs.
          podManagementPolicy: 'Parallel',
          selector: { matchLabels: labels },
          template: {
            metadata: { labels },
            spec: {
              // The latch account: on OpenShift, the one allowed the SCC that admits hostPath volumes.
              serviceAccountName: NAME,
              automountServiceAccountToken: false,
              affinity: {
                nodeAffinity: pinned,
                podAntiAffinity: {
                  requiredDuringSchedulingIgnoredDuringExecution: [
                    { labelSelector: { matchLabels: labels }, topologyKey: 'kubernetes.io/hostname' },
                  ],
                },
              },
              tolerations: controlPlaneTolerations(),
              terminationGracePeriodSeconds: 30,
              containers: [
                {
                  name: 'etcd',
                  image,
                  imagePullPolicy: 'IfNotPresent',
                  command: ['etcd'],
                  args: flags,
                  env: [{ name: 'POD_NAME', valueFrom: { fieldRef: { fieldPath: 'metadata.name' } } }],
                  ports: [
                    { name: 'client', containerPort: ETCD.clientPort },
                    { name: 'peer', containerPort: ETCD.peerPort },
                    { name: 'metrics', containerPort: ETCD.metricsPort },
                  ],
                  readinessProbe: { httpGet: { path: '/health', port: ETCD.metricsPort }, periodSeconds: 10 },
                  resources: { requests: { cpu: '50m', memory: '128Mi' }, limits: { memory: '1Gi' } },
                  volumeMounts: [
                    { name: 'data', mountPath: dataDir },
                    { name: 'tls', mountPath: tlsDir, readOnly: true },
                  ],
                },
              ],
              volumes: [
                { name: 'data', hostPath: { path: dataDir, type: 'DirectoryOrCreate' } },
                { name: 'tls', secret: { secretName: ETCD.secrets.member, defaultMode: 0o400 } },
              ],
            },
          },
        },
      },
    },
  ];
}

/**
 * Pods may not use latch's driver inline (a pod's `flexVolume` with latch's driver name): an inline volume's author
 * writes every option of its calls, the PV name and the pod's namespace included, so only PVs, which only admins
 * create, may name latch volumes (docs/operations.md, "Tenancy"). A ValidatingAdmissionPolicy (Kubernetes 1.30+)
 * and its binding.
 */
function inlineVolumePolicy(driverName: string): Manifest[] {
  const name = `${NAME}-no-inline-volumes`;
  // DRIVER_NAME_PATTERN allows no quote or backslash: the name is a plain CEL string literal.
  const driver = `'${driverName}'`;
  return [
    {
      comment:
        `Pods may not use the ${driverName} FlexVolume driver inline: only PVs (which admins create) name latch volumes.\n` +
        'An inline volume could name any volume and any PV name, and claim any namespace (docs/operations.md, "Tenancy").',
      object: {
        apiVersion: 'admissionregistration.k8s.io/v1',
        kind: 'ValidatingAdmissionPolicy',
        metadata: { name, labels: LABELS },
        spec: {
          failurePolicy: 'Fail',
          matchConstraints: {
            resourceRules: [{ apiGroups: [''], apiVersions: ['v1'], operations: ['CREATE', 'UPDATE'], resources: ['pods'] }],
          },
          validations: [
            {
              expression: `!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.flexVolume) || v.flexVolume.driver != ${driver})`,
              message: `pods may not use the FlexVolume driver ${driverName} inline; use a PersistentVolume an admin made for it`,
              reason: 'Forbidden',
            },
          ],
        },
      },
    },
    {
      comment: 'Binds the policy to every namespace, denying what it rejects.',
      object: {
        apiVersion: 'admissionregistration.k8s.io/v1',
        kind: 'ValidatingAdmissionPolicyBinding',
        metadata: { name, labels: LABELS },
        spec: { policyName: name, validationActions: ['Deny'] },
      },
    },
  ];
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

function daemonSet(
  options: ManifestOptions & { pluginDir: string | undefined; attach: boolean; manualRoot: string; role: DaemonSetRole },
): Manifest {
  const { pluginDir, role } = options;
  // The control plane's pods also write the configuration beside the driver, for a kube-controller-manager in a
  // container (a single node may be the control plane too).
  const besideDriver = options.attach && (role.kind === 'control-plane' || role.kind === 'single-node');
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
  if (besideDriver) env.push({ name: 'LATCH_CONFIG_BESIDE_DRIVER', value: 'true' });
  if (options.ownEtcd) {
    env.push(
      { name: 'LATCH_ETCD_CLIENT_SECRET', value: ETCD_CLIENT_SECRET_MOUNT },
      { name: 'LATCH_ETCD_SERVICE', value: ETCD.clientService },
    );
  }
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
  if (options.ownEtcd) {
    mounts.push({ name: 'etcd-client', mountPath: ETCD_CLIENT_SECRET_MOUNT, readOnly: true });
    volumes.push({ name: 'etcd-client', secret: { secretName: ETCD.secrets.client, defaultMode: 0o400 } });
  }
  // The agent (`latch agent`: jobs, reaping, metrics) beside the installer, with the same view of the host: its mounts
  // (the host's / under /host when detecting, HostToContainer: kubelet's mounts of pod volumes are seen, so a busy
  // device is never released and a mounted filesystem can be frozen for a snapshot; kubelet's dir when pinned), /dev
  // for loop devices, the state, config and log. It starts once the installer has written this node's config.
  const agentMounts: Record<string, unknown>[] = mounts
    .filter((m) => m.name !== 'config-template' && m.name !== 'plugin-dir' && m.name !== 'etcd-client')
    .map((m) => (m.name === 'config' ? { ...m, readOnly: true } : m));
  if (pluginDir !== undefined) {
    agentMounts.push({ name: 'kubelet-dir', mountPath: KUBELET_DIR, mountPropagation: 'HostToContainer' });
    volumes.push(hostDir('kubelet-dir', KUBELET_DIR));
  }
  // A manual attach (`latch volume attach --mount`) mounts under manualAttach.mountRoot: Bidirectional, so that the
  // agent's mount is the host's, not only this container's (docs/jobs.md, "Manual attach").
  agentMounts.push({ name: 'manual-mounts', mountPath: options.manualRoot, mountPropagation: 'Bidirectional' });
  volumes.push(hostDir('manual-mounts', options.manualRoot));
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
  const whichNodes = {
    all: 'latch on every node.\n',
    workers: 'latch on every node but the control plane (the DaemonSet latch-control-plane serves those).\n',
    'control-plane':
      'latch on the control-plane nodes, where kube-controller-manager runs attach, isattached and detach: the pods also\n' +
      'write the configuration and the etcd client certificate beside the driver (--config-beside-driver), where a\n' +
      'kube-controller-manager in a container finds them. The DaemonSet latch serves the other nodes.\n',
    'single-node': `latch on the one node ${role.kind === 'single-node' ? role.node : ''}${besideDriver ? ' (the configuration beside the driver too, for a kube-controller-manager in a container)' : ''}.\n`,
  }[role.kind];
  const name = role.kind === 'control-plane' ? `${NAME}-control-plane` : NAME;
  const podLabels = { ...LABELS, 'app.kubernetes.io/component': role.kind === 'control-plane' ? 'control-plane' : 'node' };
  const affinity = nodeAffinity(role);
  return {
    comment:
      whichNodes +
      "The install container writes this node's /etc/latch/config.json (the ConfigMap plus nodeName), copies the\n" +
      "self-contained driver into kubelet's plugin dir atomically, prints `latch doctor`, and sleeps. kubelet runs the\n" +
      'driver from the host; stopping or deleting the pod never removes it (`latch uninstall` on a drained node does).\n' +
      'The agent container runs `latch agent`: the jobs of the tickets granted to this node (snapshots, backups, ...;\n' +
      "docs/jobs.md), reaping, and /metrics on the node's 127.0.0.1:9742. hostNetwork: the agent reaches the ledger and\n" +
      "the storage as the driver, which kubelet runs in the host's network namespace, does (its locks are files in\n" +
      '/var/lib/latch/locks, which the state mount shares with the host).\n' +
      where,
    object: {
      apiVersion: 'apps/v1',
      kind: 'DaemonSet',
      metadata: { name, namespace: NAMESPACE, labels: LABELS },
      spec: {
        selector: { matchLabels: podLabels },
        updateStrategy: { type: 'RollingUpdate', rollingUpdate: { maxUnavailable: 1 } },
        template: {
          metadata: { labels: podLabels },
          spec: {
            serviceAccountName: NAME,
            automountServiceAccountToken: false,
            ...(pluginDir === undefined && { hostPID: true }),
            hostNetwork: true,
            ...(affinity && { affinity }),
            // KCM calls attach, isattached and detach on the control-plane nodes; a single node may be one.
            ...((role.kind === 'control-plane' || role.kind === 'single-node') && { tolerations: controlPlaneTolerations() }),
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
