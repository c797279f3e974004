// install/: the manifests `latch install --print-manifests` generates (install/daemonset.yaml, and every preset's)
// checked offline against the Kubernetes schemas (kubernetes-models: the OpenAPI validation of each kind, plus
// TypeScript's excess-property check of its types, which catches the misspelled fields a schema with open objects
// lets through), then against what latch needs; plugin-dir detection through a host root, as the DaemonSet's pod
// runs it, on a fake host; the Dockerfile checked statically (no Docker engine here). A read-only plugin dir (root)
// and the entrypoint's sh -n are in test/integration/manifests-host.test.ts.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readlinkSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { after, before, describe, test } from 'node:test';
import ts from 'typescript';
import { parseAllDocuments } from 'yaml';
import { DaemonSet } from 'kubernetes-models/apps/v1/DaemonSet';
import { ConfigMap } from 'kubernetes-models/v1/ConfigMap';
import { Namespace } from 'kubernetes-models/v1/Namespace';
import { ServiceAccount } from 'kubernetes-models/v1/ServiceAccount';
import { Role } from 'kubernetes-models/rbac.authorization.k8s.io/v1/Role';
import { RoleBinding } from 'kubernetes-models/rbac.authorization.k8s.io/v1/RoleBinding';
import { Job } from 'kubernetes-models/batch/v1/Job';
import { StatefulSet } from 'kubernetes-models/apps/v1/StatefulSet';
import { Service } from 'kubernetes-models/v1/Service';
import { PersistentVolume } from 'kubernetes-models/v1/PersistentVolume';
import { PersistentVolumeClaim } from 'kubernetes-models/v1/PersistentVolumeClaim';
import { Pod } from 'kubernetes-models/v1/Pod';
import { ValidatingAdmissionPolicy } from 'kubernetes-models/admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy';
import { ValidatingAdmissionPolicyBinding } from 'kubernetes-models/admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding';
import { run as runCel } from '@bufbuild/cel';
import { install } from '../../src/cli/install.js';
import type { CommandIO } from '../../src/cli/io.js';
import { installOrPrintManifests, printManifests, type PrintManifestsOptions } from '../../src/cli/manifests.js';
import { parseConfig } from '../../src/config.js';
import { parseOptions } from '../../src/contract/options.js';
import { parseSize } from '../../src/size.js';
import { buildProgram } from '../../src/cli/surface.js';
import { ETCD } from '../../src/host/etcd-secrets.js';
import { choosePluginDir, resolveUnderRoot } from '../../src/host/plugin-dir.js';
import { PRESETS, PRESET_NAMES, presetNamed } from '../../src/host/presets.js';
import { defined } from '../fixtures/defined.js';

const ROOT = resolve(__dirname, '../..');
const MANIFEST = join(ROOT, 'install/daemonset.yaml');

type Doc = Record<string, any>;

/** kind → how to validate it and which TypeScript interface describes it. */
const KINDS: Record<string, { model: new (data: any) => { validate(): void }; type: string; module: string }> = {
  'v1/Namespace': { model: Namespace, type: 'INamespace', module: 'kubernetes-models/v1/Namespace' },
  'v1/ServiceAccount': { model: ServiceAccount, type: 'IServiceAccount', module: 'kubernetes-models/v1/ServiceAccount' },
  'v1/ConfigMap': { model: ConfigMap, type: 'IConfigMap', module: 'kubernetes-models/v1/ConfigMap' },
  'apps/v1/DaemonSet': { model: DaemonSet, type: 'IDaemonSet', module: 'kubernetes-models/apps/v1/DaemonSet' },
  'apps/v1/StatefulSet': { model: StatefulSet, type: 'IStatefulSet', module: 'kubernetes-models/apps/v1/StatefulSet' },
  'v1/Service': { model: Service, type: 'IService', module: 'kubernetes-models/v1/Service' },
  'batch/v1/Job': { model: Job, type: 'IJob', module: 'kubernetes-models/batch/v1/Job' },
  'v1/PersistentVolume': { model: PersistentVolume, type: 'IPersistentVolume', module: 'kubernetes-models/v1/PersistentVolume' },
  'v1/PersistentVolumeClaim': {
    model: PersistentVolumeClaim,
    type: 'IPersistentVolumeClaim',
    module: 'kubernetes-models/v1/PersistentVolumeClaim',
  },
  'v1/Pod': { model: Pod, type: 'IPod', module: 'kubernetes-models/v1/Pod' },
  'rbac.authorization.k8s.io/v1/Role': { model: Role, type: 'IRole', module: 'kubernetes-models/rbac.authorization.k8s.io/v1/Role' },
  'rbac.authorization.k8s.io/v1/RoleBinding': {
    model: RoleBinding,
    type: 'IRoleBinding',
    module: 'kubernetes-models/rbac.authorization.k8s.io/v1/RoleBinding',
  },
  'admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy': {
    model: ValidatingAdmissionPolicy,
    type: 'IValidatingAdmissionPolicy',
    module: 'kubernetes-models/admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy',
  },
  'admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding': {
    model: ValidatingAdmissionPolicyBinding,
    type: 'IValidatingAdmissionPolicyBinding',
    module: 'kubernetes-models/admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding',
  },
};

/** Kinds that live in no namespace. */
const CLUSTER_SCOPED = ['Namespace', 'ValidatingAdmissionPolicy', 'ValidatingAdmissionPolicyBinding'];

/** The package's version: the built executable's default image is latch:<version>, and so is the committed file's. */
const PACKAGE_VERSION = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')).version as string;

/** A CommandIO that keeps what the command prints. */
function captureIO(env: NodeJS.ProcessEnv = {}): CommandIO & { printed: () => string } {
  let text = '';
  return {
    out: (t) => {
      text += t;
    },
    env,
    context: () => assert.fail('--print-manifests needs no context'),
    printed: () => text,
  };
}

/** What `latch install --print-manifests` prints with these options (and the committed file's image). */
async function generated(options: Partial<PrintManifestsOptions> = {}): Promise<string> {
  const io = captureIO();
  await printManifests({ image: `latch:${PACKAGE_VERSION}`, output: 'table', ...options }, io);
  return io.printed();
}

function loadManifest(text = readFileSync(MANIFEST, 'utf8')): Doc[] {
  const docs = parseAllDocuments(text);
  const out: Doc[] = [];
  for (const doc of docs) {
    assert.deepEqual(
      doc.errors.map((e) => e.message),
      [],
      'YAML errors',
    );
    const value = doc.toJS() as Doc | null;
    if (value !== null) out.push(value);
  }
  return out;
}

function kindOf(doc: Doc): string {
  return `${doc.apiVersion}/${doc.kind}`;
}

/** OpenAPI validation of every document; throws with the first schema violation. */
function validateSchemas(docs: Doc[]): void {
  for (const doc of docs) {
    const spec = KINDS[kindOf(doc)];
    assert.ok(spec, `unexpected kind ${kindOf(doc)} (add it to KINDS to validate it)`);
    new spec.model(doc).validate();
  }
}

/** TypeScript diagnostics of `const doc: IKind = <document>` for each document: unknown and mistyped fields. */
function typeErrors(docs: Doc[]): string[] {
  const file = join(ROOT, 'test/unit/__manifest_types__.ts'); // virtual: never written
  const imports = new Set<string>();
  const lines: string[] = [];
  docs.forEach((doc, i) => {
    const spec = defined(KINDS[kindOf(doc)], `a schema for ${kindOf(doc)}`);
    imports.add(`import type { ${spec.type} } from '${spec.module}';`);
    lines.push(`export const doc${i}: ${spec.type} = ${JSON.stringify(doc, null, 2)};`);
  });
  const source = [...imports, ...lines].join('\n');
  const options: ts.CompilerOptions = {
    strict: true,
    noEmit: true,
    skipLibCheck: true,
    module: ts.ModuleKind.CommonJS,
    moduleResolution: ts.ModuleResolutionKind.Node10,
    target: ts.ScriptTarget.ES2022,
    types: [],
  };
  const host = ts.createCompilerHost(options);
  const getSourceFile = host.getSourceFile.bind(host);
  const fileExists = host.fileExists.bind(host);
  const readFile = host.readFile.bind(host);
  host.getSourceFile = (name, lang, ...rest) =>
    name === file ? ts.createSourceFile(name, source, lang) : getSourceFile(name, lang, ...rest);
  host.fileExists = (name) => name === file || fileExists(name);
  host.readFile = (name) => (name === file ? source : readFile(name));
  const program = ts.createProgram([file], options, host);
  return ts.getPreEmitDiagnostics(program, program.getSourceFile(file)).map((d) => {
    const where = d.file && d.start !== undefined ? d.file.getLineAndCharacterOfPosition(d.start) : undefined;
    const text = ts.flattenDiagnosticMessageText(d.messageText, '\n');
    return where ? `line ${where.line + 1}: ${text}` : text;
  });
}

function daemonSet(docs: Doc[], name = 'latch'): Doc {
  const found = docs.find((d) => d.kind === 'DaemonSet' && d.metadata.name === name);
  assert.ok(found, `no DaemonSet ${name} in the manifest`);
  return found;
}

describe('install/daemonset.yaml against the Kubernetes schemas', () => {
  const docs = loadManifest();

  test('every document passes the OpenAPI validation of its kind', () => {
    assert.deepEqual(docs.map(kindOf), [
      'v1/Namespace',
      'v1/ServiceAccount',
      // latch's own etcd: the certificates' Job and its RBAC, the Services, the members
      'v1/ServiceAccount',
      'rbac.authorization.k8s.io/v1/Role',
      'rbac.authorization.k8s.io/v1/RoleBinding',
      'v1/Service',
      'v1/Service',
      'batch/v1/Job',
      'apps/v1/StatefulSet',
      'v1/ConfigMap',
      // the nodes, and the control plane
      'apps/v1/DaemonSet',
      'apps/v1/DaemonSet',
      // pods may not use the driver inline
      'admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy',
      'admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding',
    ]);
    validateSchemas(docs);
  });

  test('no document has a field its kind does not define (TypeScript excess-property check)', () => {
    assert.deepEqual(typeErrors(docs), []);
  });

  test('the checks catch what they must: a mistyped field and a misspelled one', () => {
    const wrongType = structuredClone(docs);
    daemonSet(wrongType).spec.template.spec.containers[0].securityContext.privileged = 'yes';
    assert.throws(() => validateSchemas(wrongType), /privileged must be boolean/);

    const badEnum = structuredClone(docs);
    daemonSet(badEnum).spec.template.spec.volumes[0].hostPath.type = 'DirectoryOrMake';
    assert.throws(() => validateSchemas(badEnum), /hostPath\/type must be equal to one of the allowed values/);

    const misspelled = structuredClone(docs);
    const container = daemonSet(misspelled).spec.template.spec.containers[0];
    container.volumeMount = container.volumeMounts;
    delete container.volumeMounts;
    validateSchemas(misspelled); // the OpenAPI schemas let unknown fields through...
    const errors = typeErrors(misspelled);
    assert.equal(errors.length, 1, errors.join('\n')); // ...the types do not
    assert.match(defined(errors[0]), /'"?volumeMount"?' does not exist in type 'IContainer'/);
  });
});

describe('install/daemonset.yaml gives latch what it needs', () => {
  const docs = loadManifest();
  const ds = daemonSet(docs);
  const pod = ds.spec.template.spec;
  const container = pod.containers[0];
  const env = new Map<string, Doc>(container.env.map((e: Doc) => [e.name, e]));
  const volumes = new Map<string, Doc>(pod.volumes.map((v: Doc) => [v.name, v]));
  const mountOf = (path: string) => container.volumeMounts.find((m: Doc) => m.mountPath === path);

  test('two privileged containers, the installer and the agent; hostNetwork, so that the agent reaches what the driver reaches', () => {
    assert.deepEqual(
      pod.containers.map((c: Doc) => c.name),
      ['install', 'agent'],
    );
    assert.equal(container.securityContext.privileged, true);
    assert.equal(pod.hostNetwork, true);
  });

  test("the agent runs `latch agent` once the config is written, seeing the host's mounts, /dev and the state", () => {
    const agentContainer = pod.containers[1];
    assert.equal(agentContainer.securityContext.privileged, true);
    assert.match(agentContainer.command.join(' '), /until \[ -s "\$LATCH_CONFIG" \].*exec latch agent$/);
    assert.deepEqual(agentContainer.env, [{ name: 'LATCH_CONFIG', value: '/etc/latch/config.json' }]);
    const agentMount = (name: string) => agentContainer.volumeMounts.find((m: Doc) => m.name === name);
    assert.deepEqual(agentMount('host-root'), { name: 'host-root', mountPath: '/host', mountPropagation: 'HostToContainer' });
    assert.deepEqual(agentMount('config'), { name: 'config', mountPath: '/etc/latch', readOnly: true });
    // Its manual-attach mounts reach the host.
    assert.deepEqual(agentMount('manual-mounts'), {
      name: 'manual-mounts',
      mountPath: '/var/lib/latch/manual',
      mountPropagation: 'Bidirectional',
    });
    assert.deepEqual(mountOf('/var/lib/latch/manual'), undefined, 'the installer does not mount it');
    for (const name of ['state', 'log', 'dev']) assert.deepEqual(agentMount(name), mountOf(agentMount(name)?.mountPath));
    assert.equal(agentMount('config-template'), undefined);
  });

  test('install/daemonset.yaml is exactly what `latch install --print-manifests` generates', async () => {
    const expected = await generated();
    assert.ok(
      readFileSync(MANIFEST, 'utf8') === expected,
      'install/daemonset.yaml differs from the generated manifests: npm run build && bin/latch install --print-manifests > install/daemonset.yaml',
    );
  });

  test("it detects the plugin dir on the node: the host's pid namespace and / at /host, and no plugin dir of its own", () => {
    assert.equal(pod.hostPID, true);
    assert.equal(env.get('LATCH_VOLUME_PLUGIN_DIR'), undefined);
    assert.equal(env.get('LATCH_HOST_ROOT')?.value, '/host');
    const mount = mountOf('/host');
    assert.ok(mount, "the host's / is not mounted");
    assert.deepEqual(volumes.get(mount.name)?.hostPath, { path: '/', type: 'Directory' });
    assert.notEqual(mount.readOnly, true, 'the driver is written under it');
    // Without it, the pod's copy of the host's mounts would keep every volume mounted at its start busy after
    // kubelet unmounts it on the host (a loop device that cannot be freed, a filesystem still mounted).
    assert.equal(mount.mountPropagation, 'HostToContainer');
  });

  test('hostPath mounts for /var/lib/latch, /var/log/latch and /etc/latch, each at the same path', () => {
    for (const path of ['/var/lib/latch', '/var/log/latch', '/etc/latch']) {
      const mount = mountOf(path);
      assert.ok(mount, `nothing is mounted at ${path}`);
      assert.notEqual(mount.readOnly, true, `${path} must be writable`);
      assert.equal(volumes.get(mount.name)?.hostPath?.path, path, `${path} is not the host's ${path}`);
    }
  });

  test('NODE_NAME comes from spec.nodeName', () => {
    assert.deepEqual(env.get('NODE_NAME')?.valueFrom, { fieldRef: { fieldPath: 'spec.nodeName' } });
  });

  test('the control-plane DaemonSet tolerates the control-plane taints, so attach mode has the driver where the controller runs', () => {
    const cp = daemonSet(docs, 'latch-control-plane').spec.template.spec;
    for (const key of ['node-role.kubernetes.io/control-plane', 'node-role.kubernetes.io/master']) {
      assert.ok(
        cp.tolerations.some((t: Doc) => t.key === key && t.operator === 'Exists' && (t.effect === undefined || t.effect === 'NoSchedule')),
        `no toleration for ${key}`,
      );
    }
    assert.equal(pod.tolerations, undefined, "the nodes' DaemonSet leaves the control plane to the other");
  });

  test('nothing removes the driver when the pod stops', () => {
    assert.equal(container.lifecycle, undefined, 'no preStop/postStart hooks');
    assert.equal(container.command, undefined, 'the image entrypoint runs (install, then sleep)');
    assert.equal(container.args, undefined);
    const entrypoint = readFileSync(join(ROOT, 'install/entrypoint.sh'), 'utf8');
    const code = entrypoint
      .split('\n')
      .filter((l) => !l.trim().startsWith('#'))
      .join('\n');
    assert.doesNotMatch(code, /uninstall|\brm\b/);
  });

  test('the ConfigMap holds a valid latch configuration once the node name is added', () => {
    const configMap = defined(docs.find((d) => d.kind === 'ConfigMap'));
    assert.equal(volumes.get(mountOf('/etc/latch-template').name)?.configMap?.name, configMap.metadata.name);
    assert.equal(env.get('LATCH_CONFIG_TEMPLATE')?.value, '/etc/latch-template/config.json');
    const raw = JSON.parse(configMap.data['config.json']);
    assert.equal(raw.nodeName, undefined, 'nodeName is per node: the entrypoint sets it');
    const config = parseConfig({ ...raw, nodeName: 'node-1' }, 'ConfigMap latch-config');
    assert.equal(config.nodeName, 'node-1');
    assert.ok(config.poolDir.startsWith('/var/lib/latch/') && config.stateDir.startsWith('/var/lib/latch/'));
    assert.ok(config.logFile.startsWith('/var/log/latch/'));
  });

  test('all namespaced objects live in one namespace, and the pods select their own labels', () => {
    const ns = docs.find((d) => d.kind === 'Namespace')!.metadata.name;
    for (const d of docs.filter((d) => !CLUSTER_SCOPED.includes(d.kind))) assert.equal(d.metadata.namespace, ns, d.kind);
    for (const d of docs.filter((d) => CLUSTER_SCOPED.includes(d.kind))) assert.equal(d.metadata.namespace, undefined, d.kind);
    for (const [k, v] of Object.entries(ds.spec.selector.matchLabels)) assert.equal(ds.spec.template.metadata.labels[k], v);
    assert.equal(pod.serviceAccountName, docs.find((d) => d.kind === 'ServiceAccount')!.metadata.name);
  });
});

/** The long options the CLI declares for `latch <command>` (commander's own surface, as main.ts runs it). */
function declaredOptions(command: string): Set<string> {
  const program = buildProgram(
    { out: () => undefined, err: () => undefined, env: {}, context: () => assert.fail('no context') },
    () => undefined,
  );
  const found = program.commands.find((c) => c.name() === command);
  assert.ok(found, `latch has no command ${command}`);
  return new Set(found.options.map((o) => o.long).filter((l): l is string => l !== undefined));
}

/** Checks a latch command line (argv after `latch`) against the CLI: the command exists and declares each option. */
function assertAcceptedByCli(argv: string[]): void {
  const [command, ...rest] = argv;
  const declared = declaredOptions(defined(command));
  for (const arg of rest.filter((a) => a.startsWith('--'))) {
    assert.ok(declared.has(arg.split('=')[0] ?? arg), `latch ${command} does not accept ${arg}`);
  }
}

const ENTRYPOINT = readFileSync(join(ROOT, 'install/entrypoint.sh'), 'utf8');

describe('every container runs what the binaries accept, with the mounts and environment they read', () => {
  const docs = loadManifest();
  const containers = docs.flatMap((d) =>
    ((d.spec?.template?.spec?.containers ?? []) as Doc[]).map((c) => ({
      owner: `${d.kind}/${d.metadata.name}`,
      container: c,
      pod: d.spec.template.spec,
    })),
  );

  test("each latch command line (the Job, the agent, the entrypoint's install) is one the CLI declares", () => {
    const lines: string[][] = [];
    for (const { container } of containers) {
      const words: string[] = [...(container.command ?? []), ...(container.args ?? [])];
      if (words[0] === 'latch') lines.push(words.slice(1));
      const shell = words[0] === '/bin/sh' ? words.at(-1) : undefined;
      const exec = shell && /exec latch ([^;&|]+)$/.exec(shell);
      if (exec) lines.push(defined(exec[1]).trim().split(/\s+/));
    }
    assert.deepEqual(lines, [['install', '--make-etcd-certs'], ['agent'], ['agent']]);
    // The image's entrypoint builds the install container's command line: `set -- install ...` and `set -- "$@" --x`.
    const installArgs = [...ENTRYPOINT.matchAll(/set -- (?:"\$@" )?(--?[a-z-]+|install)/g)].map((m) => defined(m[1]));
    assert.ok(installArgs.includes('--config-beside-driver') && installArgs.includes('--host-root'), installArgs.join(' '));
    lines.push(['install', ...installArgs.filter((a) => a !== 'install')]);
    for (const argv of lines) assertAcceptedByCli(argv);
    assert.throws(() => assertAcceptedByCli(['install', '--make-etcd-cert']), /does not accept --make-etcd-cert/);
  });

  test('every volume mount names a volume of its pod, and every environment variable of the installer is one the entrypoint reads', () => {
    for (const { owner, container, pod } of containers) {
      const volumes = new Set((pod.volumes ?? []).map((v: Doc) => v.name));
      for (const m of container.volumeMounts ?? []) assert.ok(volumes.has(m.name), `${owner} ${container.name}: no volume ${m.name}`);
      if (container.name !== 'install') continue;
      for (const e of container.env as Doc[])
        assert.match(ENTRYPOINT, new RegExp(`\\$\\{?${e.name}\\b`), `${owner}: the entrypoint never reads ${e.name}`);
    }
  });

  test("the etcd client's files: the Secret mounted where the entrypoint copies from, copied to where the ConfigMap names them", () => {
    const config = JSON.parse(defined(docs.find((d) => d.kind === 'ConfigMap')).data['config.json']);
    for (const name of ['latch', 'latch-control-plane']) {
      const pod = daemonSet(docs, name).spec.template.spec;
      const install = pod.containers[0];
      const env = new Map<string, string>(install.env.map((e: Doc) => [e.name, e.value]));
      const mount = install.volumeMounts.find((m: Doc) => m.mountPath === env.get('LATCH_ETCD_CLIENT_SECRET'));
      assert.ok(mount, `${name}: the Secret is not mounted at $LATCH_ETCD_CLIENT_SECRET`);
      assert.deepEqual(pod.volumes.find((v: Doc) => v.name === mount.name).secret, { secretName: ETCD.secrets.client, defaultMode: 0o400 });
      assert.equal(env.get('LATCH_ETCD_SERVICE'), ETCD.clientService);
      // The entrypoint writes them into <the config's directory>/etcd, a hostPath the driver reads on the host.
      const etcdDir = join(dirname(defined(env.get('LATCH_CONFIG'))), 'etcd');
      assert.match(ENTRYPOINT, /etcd_dir="\$\(dirname "\$config"\)\/etcd"/);
      assert.deepEqual(config.store.tls, { ca: `${etcdDir}/ca.crt`, cert: `${etcdDir}/tls.crt`, key: `${etcdDir}/tls.key` });
      assert.ok(install.volumeMounts.some((m: Doc) => m.mountPath === dirname(etcdDir) && m.readOnly !== true));
    }
    assert.deepEqual(config.store.endpoints, [`https://${ETCD.clientService}.latch-system.svc:${ETCD.clientPort}`]);
  });
});

describe("item 6: the control plane's pods install the configuration beside the driver", () => {
  const docs = loadManifest();
  const cp = daemonSet(docs, 'latch-control-plane');
  const nodes = daemonSet(docs, 'latch');
  const env = (ds: Doc) => new Map<string, string>(ds.spec.template.spec.containers[0].env.map((e: Doc) => [e.name, e.value]));
  const terms = (ds: Doc) =>
    ds.spec.template.spec.affinity?.nodeAffinity?.requiredDuringSchedulingIgnoredDuringExecution?.nodeSelectorTerms;

  test('latch-control-plane runs on control-plane nodes (either label) and asks the entrypoint for --config-beside-driver', () => {
    assert.deepEqual(terms(cp), [
      { matchExpressions: [{ key: 'node-role.kubernetes.io/control-plane', operator: 'Exists' }] },
      { matchExpressions: [{ key: 'node-role.kubernetes.io/master', operator: 'Exists' }] },
    ]);
    assert.equal(env(cp).get('LATCH_CONFIG_BESIDE_DRIVER'), 'true');
    assert.match(ENTRYPOINT, /if \[ "\$\{LATCH_CONFIG_BESIDE_DRIVER:-\}" = true \]; then set -- "\$@" --config-beside-driver; fi/);
    assert.ok(declaredOptions('install').has('--config-beside-driver'));
  });

  test('latch runs everywhere else, without the configuration beside the driver; the two select disjoint pods', () => {
    assert.deepEqual(terms(nodes), [
      {
        matchExpressions: [
          { key: 'node-role.kubernetes.io/control-plane', operator: 'DoesNotExist' },
          { key: 'node-role.kubernetes.io/master', operator: 'DoesNotExist' },
        ],
      },
    ]);
    assert.equal(env(nodes).get('LATCH_CONFIG_BESIDE_DRIVER'), undefined);
    const selects = (ds: Doc, pod: Doc) =>
      Object.entries(ds.spec.selector.matchLabels).every(([k, v]) => pod.spec.template.metadata.labels[k] === v);
    assert.ok(selects(cp, cp) && selects(nodes, nodes));
    assert.ok(!selects(cp, nodes) && !selects(nodes, cp), 'each DaemonSet selects only its own pods');
  });
});

describe("latch's own etcd in the manifests", () => {
  const docs = loadManifest();
  const sts = defined(docs.find((d) => d.kind === 'StatefulSet'));
  const pod = sts.spec.template.spec;

  test('3 members, started together, one per node, data in a hostPath per member, TLS from the Secret the Job makes', () => {
    assert.equal(sts.spec.replicas, 3);
    assert.equal(sts.spec.podManagementPolicy, 'Parallel');
    assert.deepEqual(pod.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution, [
      { labelSelector: { matchLabels: sts.spec.selector.matchLabels }, topologyKey: 'kubernetes.io/hostname' },
    ]);
    assert.deepEqual(pod.volumes.find((v: Doc) => v.name === 'data').hostPath, { path: '/var/lib/latch-etcd', type: 'DirectoryOrCreate' });
    assert.equal(pod.volumes.find((v: Doc) => v.name === 'tls').secret.secretName, ETCD.secrets.member);
    const args: string[] = pod.containers[0].args;
    assert.ok(args.includes('--data-dir=/var/lib/latch-etcd/$(POD_NAME)'));
    for (const flag of ['--client-cert-auth', '--peer-client-cert-auth']) assert.ok(args.includes(flag), flag);
    assert.ok(
      args.every((a) => !a.startsWith('--') || !/http:\/\/0\.0\.0\.0:(2379|2380)/.test(a)),
      'clients and peers over https only',
    );
  });

  test('the headless Service names the members before they are ready; the client Service has a cluster IP', () => {
    const services = docs.filter((d) => d.kind === 'Service');
    const headless = defined(services.find((s) => s.metadata.name === sts.spec.serviceName));
    assert.equal(headless.spec.clusterIP, 'None');
    assert.equal(headless.spec.publishNotReadyAddresses, true);
    const client = defined(services.find((s) => s.metadata.name === ETCD.clientService));
    assert.equal(client.spec.clusterIP, undefined);
    for (const s of [headless, client]) assert.deepEqual(s.spec.selector, sts.spec.selector.matchLabels);
    // Created before the pods that read its address from their environment.
    const index = (d: Doc) => docs.indexOf(d);
    assert.ok(docs.filter((d) => d.kind === 'DaemonSet' || d.kind === 'Job').every((d) => index(d) > index(client)));
  });

  test("the Job's account may create Secrets and read only the three it makes, nothing else", () => {
    const job = defined(docs.find((d) => d.kind === 'Job'));
    const account = job.spec.template.spec.serviceAccountName;
    const binding = defined(docs.find((d) => d.kind === 'RoleBinding' && d.subjects[0].name === account));
    const role = defined(docs.find((d) => d.kind === 'Role' && d.metadata.name === binding.roleRef.name));
    assert.deepEqual(role.rules, [
      { apiGroups: [''], resources: ['secrets'], verbs: ['create'] },
      { apiGroups: [''], resources: ['secrets'], resourceNames: Object.values(ETCD.secrets), verbs: ['get'] },
    ]);
    for (const d of docs.filter((d) => d.kind === 'DaemonSet' || d.kind === 'StatefulSet')) {
      assert.equal(d.spec.template.spec.automountServiceAccountToken, false, `${d.metadata.name} never calls the API server`);
    }
  });

  test('--etcd-nodes pins the members to three nodes; anything else is refused', async () => {
    const text = await generated({ etcdNodes: 'cp-1, cp-2,cp-3' });
    assert.match(text, /^# Generated by `latch install --print-manifests --etcd-nodes cp-1,cp-2,cp-3`/);
    const pinned = loadManifest(text);
    assert.deepEqual(defined(pinned.find((d) => d.kind === 'StatefulSet')).spec.template.spec.affinity.nodeAffinity, {
      requiredDuringSchedulingIgnoredDuringExecution: {
        nodeSelectorTerms: [{ matchExpressions: [{ key: 'kubernetes.io/hostname', operator: 'In', values: ['cp-1', 'cp-2', 'cp-3'] }] }],
      },
    });
    await assert.rejects(generated({ etcdNodes: 'a,b' }), /--etcd-nodes names 3 different nodes, one per etcd member; got 2/);
    await assert.rejects(generated({ etcdNodes: 'a,a,b' }), /3 different nodes/);
    await assert.rejects(generated({ etcdNodes: 'a,B,c' }), /"B" is not a node name/);
    await assert.rejects(generated({ etcdNodes: 'a,b,c', singleNode: 'a' }), /--etcd-nodes pins latch's own etcd/);
  });

  test('nothing suggests the etcd of Kubernetes itself (its client certificate would open every Secret of the cluster)', () => {
    for (const file of ['install/daemonset.yaml', 'docs/operations.md', 'README.md']) {
      const found = /Kubernetes' own etcd works|etcd of Kubernetes works|kube-apiserver's etcd works/i.exec(
        readFileSync(join(ROOT, file), 'utf8'),
      );
      assert.equal(found?.[0], undefined, file);
    }
  });
});

describe('--single-node: a one-node installation is an explicit choice', () => {
  test("that node's file store, non-attach mode, singleNode in the configuration, no etcd, one DaemonSet pinned to it", async () => {
    const text = await generated({ singleNode: 'node-1' });
    assert.match(text, /^# Generated by `latch install --print-manifests --single-node node-1`/);
    const docs = loadManifest(text);
    validateSchemas(docs);
    assert.deepEqual(typeErrors(docs), []);
    const raw = JSON.parse(defined(docs.find((d) => d.kind === 'ConfigMap')).data['config.json']);
    assert.equal(raw.singleNode, 'node-1');
    assert.deepEqual(raw.store, { type: 'file' });
    assert.equal(raw.attach, false);
    assert.equal(parseConfig({ ...raw, nodeName: 'node-1' }, 'ConfigMap').singleNode, 'node-1');
    assert.ok(!docs.some((d) => ['StatefulSet', 'Job', 'Service'].includes(d.kind)));
    assert.deepEqual(
      docs.filter((d) => d.kind === 'DaemonSet').map((d) => d.metadata.name),
      ['latch'],
    );
    const pod = daemonSet(docs).spec.template.spec;
    assert.deepEqual(pod.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms, [
      { matchExpressions: [{ key: 'kubernetes.io/hostname', operator: 'In', values: ['node-1'] }] },
    ]);
    assert.deepEqual(tolerationKeys(docs), CONTROL_PLANE_TOLERATIONS, 'a single node is often its own control plane');
    const env = pod.containers[0].env.map((e: Doc) => e.name);
    assert.ok(!env.includes('LATCH_ETCD_SERVICE') && !env.includes('LATCH_CONFIG_BESIDE_DRIVER'));
  });

  test('with --cluster-config it is added to that configuration; a bad node name or a contradiction is refused', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'latch-single-'));
    try {
      const file = join(dir, 'cluster.json');
      writeFileSync(file, JSON.stringify({ attach: false, maxSize: '10Gi' }));
      const docs = loadManifest(await generated({ clusterConfig: file, singleNode: 'node-2' }));
      assert.deepEqual(JSON.parse(defined(docs.find((d) => d.kind === 'ConfigMap')).data['config.json']), {
        attach: false,
        maxSize: '10Gi',
        singleNode: 'node-2',
      });
      writeFileSync(file, JSON.stringify({ singleNode: 'node-3' }));
      await assert.rejects(
        generated({ clusterConfig: file, singleNode: 'node-2' }),
        /has "singleNode": "node-3", not --single-node node-2/,
      );
      await assert.rejects(generated({ singleNode: 'Node_1' }), /--single-node "Node_1" must be a node name/);
      const io = captureIO();
      await assert.rejects(installOrPrintManifests({ singleNode: 'n', output: 'table' }, io), {
        message: '--single-node only applies with --print-manifests',
      });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

/** The ```yaml blocks of a Markdown file that hold Kubernetes objects. */
function yamlExamples(file: string): { where: string; docs: Doc[] }[] {
  const text = readFileSync(join(ROOT, file), 'utf8');
  return [...text.matchAll(/^```yaml\n([\s\S]*?)^```$/gm)]
    .filter((m) => /^kind: /m.test(defined(m[1])))
    .map((m) => ({ where: `${file}:${text.slice(0, m.index).split('\n').length}`, docs: loadManifest(m[1]) }));
}

describe('the examples in README.md and docs/operations.md are objects a user can apply', () => {
  const examples = ['README.md', 'docs/operations.md'].flatMap(yamlExamples);

  test('each backend: a loop volume with nodeAffinity, and an rbd one without (its pod may move)', () => {
    const pvs = examples.flatMap((e) => e.docs.filter((d) => d.kind === 'PersistentVolume'));
    assert.ok(pvs.filter((pv) => pv.spec.nodeAffinity).length >= 2, 'loop examples in both files');
    assert.ok(
      pvs.some((pv) => !pv.spec.nodeAffinity),
      'an rbd example',
    );
    for (const { where, docs } of examples) {
      assert.deepEqual(
        docs.map((d) => d.kind),
        ['PersistentVolume', 'PersistentVolumeClaim', 'Pod'],
        where,
      );
    }
  });

  for (const { where, docs } of examples) {
    test(`${where}: valid objects; the claim binds the volume, the pod uses the claim, the options are latch's`, () => {
      validateSchemas(docs);
      assert.deepEqual(typeErrors(docs), []);
      const [pv, pvc, pod] = docs as [Doc, Doc, Doc];
      // The claim binds this volume and no other claim can: both ways named, the same (empty) class.
      assert.equal(pvc.spec.volumeName, pv.metadata.name);
      assert.deepEqual(pv.spec.claimRef, { namespace: pvc.metadata.namespace, name: pvc.metadata.name });
      assert.equal(pv.spec.storageClassName, '');
      assert.equal(pvc.spec.storageClassName, '');
      for (const mode of pvc.spec.accessModes) assert.ok(pv.spec.accessModes.includes(mode), mode);
      assert.ok(parseSize(pvc.spec.resources.requests.storage) <= parseSize(pv.spec.capacity.storage));
      assert.equal(pod.metadata.namespace, pvc.metadata.namespace);
      assert.deepEqual(
        pod.spec.volumes.map((v: Doc) => v.persistentVolumeClaim?.claimName),
        [pvc.metadata.name],
      );
      for (const c of pod.spec.containers) {
        for (const m of c.volumeMounts)
          assert.ok(
            pod.spec.volumes.some((v: Doc) => v.name === m.name),
            m.name,
          );
      }
      // The driver of the default configuration; options as kubelet passes them, which latch accepts.
      const config = JSON.parse(defined(loadManifest().find((d) => d.kind === 'ConfigMap')).data['config.json']);
      assert.equal(pv.spec.flexVolume.driver, config.driverName);
      const options = parseOptions(
        JSON.stringify({
          'kubernetes.io/fsType': pv.spec.flexVolume.fsType ?? '',
          'kubernetes.io/pvOrVolumeName': pv.metadata.name,
          'kubernetes.io/readwrite': 'rw',
          ...pv.spec.flexVolume.options,
        }),
        parseConfig({ ...config, nodeName: 'node-1' }, 'ConfigMap'),
      );
      assert.equal(options.size, parseSize(pv.spec.capacity.storage), 'the volume is made of the size the PV says');
    });
  }
});

/** The plugin-dir volume of a pinned DaemonSet: its hostPath, its mount and the env the entrypoint reads. */
function pinnedPluginDir(
  docs: Doc[],
  name?: string,
): { hostPath: Doc | undefined; mountPath: string | undefined; env: string | undefined } {
  const pod = daemonSet(docs, name).spec.template.spec;
  const container = pod.containers[0];
  const volume = pod.volumes.find((v: Doc) => v.name === 'plugin-dir');
  return {
    hostPath: volume?.hostPath,
    mountPath: container.volumeMounts.find((m: Doc) => m.name === 'plugin-dir')?.mountPath,
    env: container.env.find((e: Doc) => e.name === 'LATCH_VOLUME_PLUGIN_DIR')?.value,
  };
}

function tolerationKeys(docs: Doc[], name?: string): string[] {
  return (daemonSet(docs, name).spec.template.spec.tolerations ?? []).map((t: Doc) => `${t.key} ${t.operator} ${t.effect}`);
}

const CONTROL_PLANE_TOLERATIONS = [
  'node-role.kubernetes.io/control-plane Exists NoSchedule',
  'node-role.kubernetes.io/master Exists NoSchedule',
];

describe('every preset generates valid manifests pinned to its plugin dir', () => {
  test('the presets: the layouts the issue names, each an absolute directory, names unique', () => {
    assert.deepEqual(PRESET_NAMES, ['upstream', 'openshift', 'gke', 'aks', 'rke', 'k3s', 'flatcar']);
    const dirs = Object.fromEntries(PRESETS.map((p) => [p.name, p.pluginDir]));
    assert.deepEqual(dirs, {
      upstream: '/usr/libexec/kubernetes/kubelet-plugins/volume/exec',
      openshift: '/etc/kubernetes/kubelet-plugins/volume/exec',
      gke: '/home/kubernetes/flexvolume',
      aks: '/etc/kubernetes/volumeplugins',
      rke: '/var/lib/kubelet/volumeplugins',
      k3s: '/usr/libexec/kubernetes/kubelet-plugins/volume/exec',
      flatcar: '/var/lib/kubelet/volumeplugins',
    });
    for (const preset of PRESETS) assert.ok(preset.notes.length > 0, `${preset.name} says what else differs`);
  });

  for (const preset of PRESETS) {
    test(`--preset ${preset.name}: schemas, types, hostPath ${preset.pluginDir}, tolerations as its attach mode`, async () => {
      const text = await generated({ preset });
      assert.match(text, new RegExp(`^# Generated by \`latch install --print-manifests --preset ${preset.name}\``));
      const docs = loadManifest(text);
      validateSchemas(docs);
      assert.deepEqual(typeErrors(docs), []);

      assert.deepEqual(pinnedPluginDir(docs), {
        hostPath: { path: preset.pluginDir, type: 'DirectoryOrCreate' },
        mountPath: preset.pluginDir,
        env: preset.pluginDir,
      });
      const pod = daemonSet(docs).spec.template.spec;
      assert.equal(pod.hostPID, undefined, 'a pinned DaemonSet needs no host pid namespace');
      assert.ok(!pod.volumes.some((v: Doc) => v.hostPath?.path === '/'), "a pinned DaemonSet does not mount the host's /");
      // Its agent sees kubelet's mounts of pod volumes through kubelet's dir instead.
      assert.deepEqual(
        pod.containers[1].volumeMounts.find((m: Doc) => m.name === 'kubelet-dir'),
        { name: 'kubelet-dir', mountPath: '/var/lib/kubelet', mountPropagation: 'HostToContainer' },
      );

      const config = JSON.parse(defined(docs.find((d) => d.kind === 'ConfigMap')).data['config.json']);
      assert.equal(config.attach, !preset.managedControlPlane, 'managed control planes cannot run the driver: attach is off');
      assert.equal(config.store.type, 'etcd', "every preset shares latch's own etcd as the ledger");
      assert.ok(docs.some((d) => d.kind === 'StatefulSet' && d.metadata.name === 'latch-etcd'));
      assert.deepEqual(tolerationKeys(docs), []);
      const daemonSets = docs.filter((d) => d.kind === 'DaemonSet').map((d) => d.metadata.name);
      if (config.attach) {
        assert.deepEqual(daemonSets, ['latch', 'latch-control-plane']);
        assert.deepEqual(tolerationKeys(docs, 'latch-control-plane'), CONTROL_PLANE_TOLERATIONS);
        assert.deepEqual(pinnedPluginDir(docs, 'latch-control-plane'), pinnedPluginDir(docs));
      } else {
        assert.deepEqual(daemonSets, ['latch'], 'a managed control plane: no DaemonSet of its own');
      }

      const roles = docs.filter((d) => d.kind === 'Role').map((d) => d.metadata.name);
      if (preset.privilegedScc) {
        const role = defined(docs.find((d) => d.kind === 'Role' && d.metadata.name === 'latch-privileged-scc'));
        assert.deepEqual(role.rules, [
          {
            apiGroups: ['security.openshift.io'],
            resources: ['securitycontextconstraints'],
            resourceNames: ['privileged'],
            verbs: ['use'],
          },
        ]);
        const binding = defined(docs.find((d) => d.kind === 'RoleBinding' && d.metadata.name === 'latch-privileged-scc'));
        assert.equal(binding.roleRef.name, role.metadata.name);
        assert.deepEqual(binding.subjects, [{ kind: 'ServiceAccount', name: pod.serviceAccountName, namespace: role.metadata.namespace }]);
      } else {
        assert.deepEqual(roles, ['latch-etcd-certs'], "no RBAC but the certificates Job's where none is needed");
      }
    });
  }

  test('--plugin-dir without a preset pins a custom directory; --driver reaches the entrypoint', async () => {
    const docs = loadManifest(await generated({ pluginDir: '/srv/kubelet/plugins/', driver: 'acme/disk' }));
    validateSchemas(docs);
    assert.deepEqual(pinnedPluginDir(docs).hostPath, { path: '/srv/kubelet/plugins', type: 'DirectoryOrCreate' });
    const env = daemonSet(docs).spec.template.spec.containers[0].env;
    assert.equal(env.find((e: Doc) => e.name === 'LATCH_DRIVER')?.value, 'acme/disk');
  });

  test('--cluster-config: its content goes to every node, no etcd of latch\'s own, and "attach": false drops the control-plane DaemonSet', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'latch-manifests-'));
    try {
      const file = join(dir, 'cluster.json');
      const store = { type: 'etcd', endpoints: ['https://etcd.example:2379'] };
      writeFileSync(file, JSON.stringify({ attach: false, maxSize: '10Gi', store }));
      const docs = loadManifest(await generated({ clusterConfig: file }));
      validateSchemas(docs);
      assert.deepEqual(JSON.parse(defined(docs.find((d) => d.kind === 'ConfigMap')).data['config.json']), {
        attach: false,
        maxSize: '10Gi',
        store,
      });
      assert.deepEqual(
        docs.filter((d) => d.kind === 'DaemonSet').map((d) => d.metadata.name),
        ['latch'],
      );
      assert.deepEqual(tolerationKeys(docs), []);
      assert.ok(!docs.some((d) => d.kind === 'StatefulSet' || d.kind === 'Job'), 'the operator names the ledger: no etcd of our own');
      assert.deepEqual(tolerationKeys(loadManifest(await generated()), 'latch-control-plane'), CONTROL_PLANE_TOLERATIONS);

      writeFileSync(file, JSON.stringify({ nodeName: 'node-1' }));
      await assert.rejects(generated({ clusterConfig: file }), /sets nodeName: every node sets its own/);
      // Non-attach mode on the file store gives every node a ledger of its own (config.ts, unsafeConfigReason).
      writeFileSync(file, JSON.stringify({ attach: false }));
      await assert.rejects(generated({ clusterConfig: file }), /non-attach mode .* a new, empty volume there/);
      writeFileSync(file, JSON.stringify({ attach: 'yes' }));
      await assert.rejects(generated({ clusterConfig: file }), (err: Error) => err.message.includes(file) && /attach/.test(err.message));
      writeFileSync(file, '{"attach":');
      await assert.rejects(generated({ clusterConfig: file }), new RegExp(`--cluster-config ${file}: .*JSON`));
      await assert.rejects(generated({ clusterConfig: join(dir, 'missing.json') }), /--cluster-config .*missing\.json: ENOENT/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('-o json prints the same objects as one List that kubectl applies', async () => {
    const io = captureIO();
    await printManifests({ image: `latch:${PACKAGE_VERSION}`, output: 'json', preset: presetNamed('openshift') }, io);
    const list = JSON.parse(io.printed());
    assert.equal(list.kind, 'List');
    assert.deepEqual(list.items, loadManifest(await generated({ preset: presetNamed('openshift') })));
  });
});

/** A JSON value as CEL sees a Kubernetes object: objects as maps (has() and field selection work on them). */
function celValue(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(celValue);
  if (value !== null && typeof value === 'object') return new Map(Object.entries(value).map(([k, v]) => [k, celValue(v)]));
  return value;
}

describe('the admission policy: pods may not use the driver inline (docs/operations.md, "Tenancy")', () => {
  const policyOf = (docs: Doc[]) => defined(docs.find((d) => d.kind === 'ValidatingAdmissionPolicy'));
  const admits = (policy: Doc, pod: Doc) =>
    policy.spec.validations.every((v: Doc) => runCel(v.expression, { object: celValue(pod) as never }) === true);
  const pod = (...volumes: Doc[]) => ({ apiVersion: 'v1', kind: 'Pod', spec: { containers: [], ...(volumes.length > 0 && { volumes }) } });

  test('a policy on pod creation and update, failing closed, and a binding that denies what it rejects', () => {
    const docs = loadManifest();
    const policy = policyOf(docs);
    assert.deepEqual(policy.spec.matchConstraints.resourceRules, [
      { apiGroups: [''], apiVersions: ['v1'], operations: ['CREATE', 'UPDATE'], resources: ['pods'] },
    ]);
    assert.equal(policy.spec.failurePolicy, 'Fail');
    const binding = defined(docs.find((d) => d.kind === 'ValidatingAdmissionPolicyBinding'));
    assert.deepEqual(binding.spec, { policyName: policy.metadata.name, validationActions: ['Deny'] });
  });

  test("its CEL expression rejects a pod with latch's driver inline, and admits every other pod", () => {
    const policy = policyOf(loadManifest());
    assert.equal(admits(policy, pod()), true, 'no volumes');
    assert.equal(
      admits(policy, pod({ name: 'data', persistentVolumeClaim: { claimName: 'data' } })),
      true,
      'a claim: the PV names the volume',
    );
    assert.equal(
      admits(policy, pod({ name: 'x', flexVolume: { driver: 'acme/other', options: { volume: 'v' } } })),
      true,
      'another driver',
    );
    const inline = { name: 'pv-db', flexVolume: { driver: 'latch/loop', options: { volume: 'db-data' } } };
    assert.equal(admits(policy, pod(inline)), false);
    assert.equal(admits(policy, pod({ name: 'tmp', emptyDir: {} }, inline)), false, 'among other volumes');
    assert.match(policy.spec.validations[0].message, /may not use the FlexVolume driver latch\/loop inline/);
  });

  test("it names the driver installed: --driver, else the configuration's driverName", async () => {
    const inline = (driver: string) => pod({ name: 'v', flexVolume: { driver } });
    const byFlag = policyOf(loadManifest(await generated({ driver: 'acme/disk' })));
    assert.deepEqual([admits(byFlag, inline('acme/disk')), admits(byFlag, inline('latch/loop'))], [false, true]);
    const dir = mkdtempSync(join(tmpdir(), 'latch-manifests-'));
    try {
      const file = join(dir, 'cluster.json');
      writeFileSync(file, JSON.stringify({ driverName: 'corp/vol' }));
      const docs = loadManifest(await generated({ clusterConfig: file }));
      validateSchemas(docs);
      assert.equal(admits(policyOf(docs), inline('corp/vol')), false);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('bad input gets a clear message', () => {
  test('an unknown preset lists the valid ones', () => {
    assert.throws(() => presetNamed('openshfit'), {
      name: 'LatchError',
      message: 'unknown preset "openshfit": use one of upstream, openshift, gke, aks, rke, k3s, flatcar',
    });
  });

  test('a preset and a --plugin-dir that names another directory conflict; the same directory does not', async () => {
    const gke = presetNamed('gke');
    await assert.rejects(generated({ preset: gke, pluginDir: '/var/lib/kubelet/volumeplugins' }), {
      name: 'LatchError',
      message:
        '--plugin-dir /var/lib/kubelet/volumeplugins conflicts with --preset gke, whose plugin dir is /home/kubernetes/flexvolume: give only one of them',
    });
    assert.match(await generated({ preset: gke, pluginDir: '/home/kubernetes/flexvolume/' }), /path: \/home\/kubernetes\/flexvolume\n/);
    await assert.rejects(choosePluginDir('/elsewhere', {}, { preset: gke }), /--plugin-dir \/elsewhere conflicts with --preset gke/);
  });

  test('a relative --plugin-dir, a bad --driver or --image, and options that belong to the other mode', async () => {
    await assert.rejects(generated({ pluginDir: 'plugins' }), /--plugin-dir "plugins" must be an absolute path/);
    await assert.rejects(generated({ driver: 'Latch' }), /--driver "Latch" must be vendor\/driver/);
    await assert.rejects(generated({ image: 'a b' }), /--image "a b" must be an image reference/);
    const io = captureIO();
    await assert.rejects(
      installOrPrintManifests({ printManifests: true, hostRoot: '/host', output: 'table' }, io),
      /--host-root is for installing on a node/,
    );
    await assert.rejects(installOrPrintManifests({ image: 'x', clusterConfig: 'y', output: 'table' }, io), {
      message: '--image and --cluster-config only apply with --print-manifests',
    });
    await assert.rejects(
      choosePluginDir(undefined, {}, { hostRoot: '/nonexistent-host-root' }),
      /--host-root \/nonexistent-host-root is not a directory/,
    );
  });
});

describe("the DaemonSet's detection: latch install --host-root on a fake host", () => {
  let base: string;
  let n = 0;
  before(() => {
    base = mkdtempSync(join(tmpdir(), 'latch-host-root-'));
  });
  after(() => {
    rmSync(base, { recursive: true, force: true });
  });

  /** A host's / with a proc/ holding the given processes, and the files given (path under / to content). */
  function fakeHostRoot(processes: Record<number, string[]>, files: Record<string, string> = {}): { root: string; env: NodeJS.ProcessEnv } {
    const root = join(base, `host-${++n}`);
    for (const [pid, argv] of Object.entries(processes)) {
      mkdirSync(join(root, 'proc', pid), { recursive: true });
      writeFileSync(join(root, 'proc', pid, 'cmdline'), `${argv.join('\0')}\0`);
      writeFileSync(join(root, 'proc', pid, 'comm'), `${(argv[0] ?? '').split('/').pop()}\n`);
    }
    mkdirSync(join(root, 'proc'), { recursive: true });
    for (const [path, text] of Object.entries(files)) {
      mkdirSync(join(root, path, '..'), { recursive: true });
      writeFileSync(join(root, path), text);
    }
    // The pod reads kubelet's command line from the host's pid namespace; here, from the fake proc/.
    return { root, env: { LATCH_PROC_ROOT: join(root, 'proc'), LATCH_CONFIG: join(root, 'etc/latch/config.json') } };
  }

  test("kubelet's config file is read from the host root, and the driver is written to the host's plugin dir there", async () => {
    const { root, env } = fakeHostRoot(
      { 1: ['/sbin/init'], 412: ['/usr/bin/kubelet', '--config=/var/lib/kubelet/config.yaml', '--v=2'] },
      { 'var/lib/kubelet/config.yaml': 'kind: KubeletConfiguration\nvolumePluginDir: /var/lib/kubelet/volumeplugins\n' },
    );
    const choice = await choosePluginDir(undefined, env, { hostRoot: root });
    assert.equal(choice.dir, '/var/lib/kubelet/volumeplugins', 'the host path, as kubelet names it');
    assert.equal(choice.source, 'kubelet-config');
    assert.equal(choice.localDir, join(root, 'var/lib/kubelet/volumeplugins'));

    const io = captureIO(env);
    await install({ hostRoot: root, output: 'json' }, io);
    const result = JSON.parse(io.printed());
    assert.equal(result.pluginDir, '/var/lib/kubelet/volumeplugins');
    assert.equal(result.path, join(root, 'var/lib/kubelet/volumeplugins/latch~loop/loop'));
    assert.equal(statSync(result.path).mode & 0o777, 0o755);
    assert.equal(readFileSync(result.path, 'utf8'), readFileSync(defined(process.argv[1]), 'utf8'), 'the running file was copied');
  });

  test("the flag wins, and the host's absolute symbolic links are followed under the host root, not in the pod", async () => {
    const { root, env } = fakeHostRoot({ 7: ['kubelet', '--volume-plugin-dir', '/home/kubernetes/flexvolume'] });
    mkdirSync(join(root, 'var/home'), { recursive: true });
    symlinkSync('/var/home', join(root, 'home')); // absolute, as on hosts where /home -> /var/home
    const choice = await choosePluginDir(undefined, env, { hostRoot: root });
    assert.equal(choice.dir, '/home/kubernetes/flexvolume');
    assert.equal(choice.source, 'kubelet-flag');
    assert.equal(choice.localDir, join(root, 'var/home/kubernetes/flexvolume'));
    assert.equal(readlinkSync(join(root, 'home')), '/var/home', 'the host is untouched');

    symlinkSync('loop', join(root, 'var/loop'));
    mkdirSync(join(root, 'x'));
    symlinkSync('/var/loop', join(root, 'x/y'));
    await assert.rejects(resolveUnderRoot(root, '/var/loop/a'), /too many levels of symbolic links/);
    assert.equal(await resolveUnderRoot(root, '/../../etc/../etc/kubelet'), join(root, 'etc/kubelet'), 'never above the host root');
  });

  test('k3s: kubelet runs inside the k3s process; its --kubelet-arg volume-plugin-dir is read', async () => {
    const { root, env } = fakeHostRoot({
      88: ['/usr/local/bin/k3s', 'kubectl', 'get', 'pods', '--kubelet-arg=volume-plugin-dir=/not/a/server'],
      90: ['/usr/local/bin/k3s', 'server', '--kubelet-arg', 'max-pods=200', '--kubelet-arg=volume-plugin-dir=/var/lib/rancher/flex'],
    });
    const choice = await choosePluginDir(undefined, env, { hostRoot: root });
    assert.equal(choice.dir, '/var/lib/rancher/flex');
    assert.match(choice.reason, /^k3s \(pid 90\) runs with --volume-plugin-dir=\/var\/lib\/rancher\/flex$/);

    const plain = fakeHostRoot({ 90: ['/usr/local/bin/k3s', 'agent', '--server', 'https://10.0.0.1:6443'] });
    const fallback = await choosePluginDir(undefined, plain.env, { hostRoot: plain.root });
    assert.equal(fallback.source, 'default');
    assert.equal(fallback.dir, presetNamed('k3s').pluginDir);
    assert.match(
      fallback.reason,
      /k3s \(pid 90\) has no --volume-plugin-dir, no --config, and no volumePluginDir in its --config-dir \/var\/lib\/rancher\/k3s\/agent\/etc\/kubelet\.conf\.d/,
    );

    // k3s 1.32+ copies /etc/rancher/k3s/kubelet.conf into its drop-in directory, which it gives kubelet.
    const withConfig = fakeHostRoot(
      { 90: ['/usr/local/bin/k3s', 'server'] },
      {
        'var/lib/rancher/k3s/agent/etc/kubelet.conf.d/00-k3s-defaults.conf': 'kind: KubeletConfiguration\nmaxPods: 110\n',
        'var/lib/rancher/k3s/agent/etc/kubelet.conf.d/10-cli-config.conf': 'volumePluginDir: /var/lib/k3s-flex\n',
      },
    );
    const fromDropIn = await choosePluginDir(undefined, withConfig.env, { hostRoot: withConfig.root });
    assert.equal(fromDropIn.dir, '/var/lib/k3s-flex');
    assert.equal(
      fromDropIn.reason,
      'volumePluginDir in /var/lib/rancher/k3s/agent/etc/kubelet.conf.d/10-cli-config.conf, a drop-in of the --config-dir of k3s (pid 90)',
    );
  });

  test("kubelet's --config-dir drop-ins: *.conf files walked in lexical order, the last setting wins, over --config", async () => {
    const drop = 'etc/kubernetes/kubelet.conf.d';
    const { root, env } = fakeHostRoot(
      { 5: ['/usr/bin/kubelet', '--config=/etc/kubernetes/kubelet.yaml', '--config-dir', '/etc/kubernetes/kubelet.conf.d'] },
      {
        'etc/kubernetes/kubelet.yaml': 'volumePluginDir: /from/config\n',
        [`${drop}/10-a.conf`]: 'volumePluginDir: /from/a\n',
        [`${drop}/20-b/x.conf`]: '{"volumePluginDir": "/from/b"}',
        [`${drop}/30-c.conf`]: 'maxPods: 10\n',
        [`${drop}/99-z.yaml`]: 'volumePluginDir: /not/a/conf/file\n',
      },
    );
    const choice = await choosePluginDir(undefined, env, { hostRoot: root });
    assert.equal(choice.dir, '/from/b');
    assert.equal(
      choice.reason,
      'volumePluginDir in /etc/kubernetes/kubelet.conf.d/20-b/x.conf, a drop-in of the --config-dir of kubelet (pid 5)',
    );

    rmSync(join(root, drop, '20-b'), { recursive: true });
    assert.equal((await choosePluginDir(undefined, env, { hostRoot: root })).dir, '/from/a');
    rmSync(join(root, drop), { recursive: true });
    const fromConfig = await choosePluginDir(undefined, env, { hostRoot: root });
    assert.equal(fromConfig.dir, '/from/config', 'no drop-in directory: the config file');
  });

  test('without a kubelet setting, the OpenShift directory is looked for on the host, not in the pod', async () => {
    const { root, env } = fakeHostRoot({ 3: ['kubelet'] });
    assert.equal((await choosePluginDir(undefined, env, { hostRoot: root })).source, 'default');
    mkdirSync(join(root, 'etc/kubernetes/kubelet-plugins/volume/exec'), { recursive: true });
    const choice = await choosePluginDir(undefined, env, { hostRoot: root });
    assert.equal(choice.source, 'openshift');
    assert.equal(choice.localDir, join(root, 'etc/kubernetes/kubelet-plugins/volume/exec'));
  });

  test('a preset pins the directory under the host root too', async () => {
    const { root, env } = fakeHostRoot({ 7: ['kubelet', '--volume-plugin-dir=/detected'] });
    const choice = await choosePluginDir(undefined, env, { hostRoot: root, preset: presetNamed('aks') });
    assert.deepEqual(choice, {
      dir: '/etc/kubernetes/volumeplugins',
      source: 'preset',
      reason: 'preset aks',
      localDir: join(root, 'etc/kubernetes/volumeplugins'),
    });
  });
});

describe('install/Dockerfile and install/entrypoint.sh (static checks)', () => {
  const dockerfile = readFileSync(join(ROOT, 'install/Dockerfile'), 'utf8');
  // Instructions with their continuation lines joined.
  const instructions = dockerfile
    .replace(/\\\n/g, ' ')
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#'));
  const froms = instructions.filter((l) => /^FROM\s/i.test(l));

  test('two stages: a node 20 build stage and a Debian slim final image', () => {
    assert.equal(froms.length, 2);
    assert.match(defined(froms[0]), /^FROM node:20[\w.-]* AS build$/);
    assert.match(defined(froms[1]), /^FROM debian:[\w.-]*slim$/);
  });

  test('the build stage runs npm ci and build:sea, and the final image takes exactly what build:sea makes', () => {
    const build = instructions.slice(0, instructions.indexOf(defined(froms[1])));
    assert.ok(build.some((l) => /^RUN npm ci\b/.test(l)));
    assert.ok(build.some((l) => /^RUN npm run build:sea\b/.test(l)));
    const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8'));
    assert.equal(pkg.scripts['build:sea'], 'node build.mjs --sea');
    // build:sea writes bin/latch-sea unless --out names another file (the bench's execa build does).
    const buildScript = readFileSync(join(ROOT, 'build.mjs'), 'utf8');
    assert.match(buildScript, /const seaOut = process\.argv\.includes\('--out'\) \? [^:]+ : 'bin\/latch-sea';/);
    assert.match(buildScript, /buildSea\(seaOut\)/);
    assert.ok(instructions.includes('COPY --from=build /src/bin/latch-sea /usr/local/bin/latch'));
  });

  test('every file it copies from the context exists, and the entrypoint is the copied script', () => {
    for (const line of instructions.filter((l) => /^COPY\s/.test(l) && !l.includes('--from='))) {
      const parts = line.split(/\s+/).slice(1, -1);
      for (const part of parts) assert.ok(existsSync(join(ROOT, part)), `COPY source ${part} is missing`);
    }
    const entry = defined(instructions.find((l) => l.startsWith('ENTRYPOINT')));
    const [target] = JSON.parse(entry.slice('ENTRYPOINT'.length));
    assert.ok(instructions.includes(`COPY install/entrypoint.sh ${target}`));
  });

  test('the final image has the tools the installer, doctor and entrypoint run', () => {
    // The last one: the build stage installs patchelf.
    const apt = defined(instructions.filter((l) => l.includes('apt-get install')).at(-1));
    for (const pkg of ['util-linux', 'mount', 'e2fsprogs', 'xfsprogs', 'jq']) assert.match(apt, new RegExp(`\\s${pkg}(\\s|$)`), pkg);
    assert.match(apt, /rm -rf \/var\/lib\/apt\/lists/);
  });
});
