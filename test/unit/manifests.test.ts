// install/: the DaemonSet manifest checked offline against the Kubernetes schemas (kubernetes-models: the OpenAPI
// validation of each kind, plus TypeScript's excess-property check of its types, which catches the misspelled
// fields a schema with open objects lets through), then against what latch needs; the Dockerfile and the
// entrypoint checked statically (no Docker engine here).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { describe, test } from 'node:test';
import ts from 'typescript';
import { parseAllDocuments } from 'yaml';
import { DaemonSet } from 'kubernetes-models/apps/v1/DaemonSet';
import { ConfigMap } from 'kubernetes-models/v1/ConfigMap';
import { Namespace } from 'kubernetes-models/v1/Namespace';
import { ServiceAccount } from 'kubernetes-models/v1/ServiceAccount';
import { parseConfig } from '../../src/config.js';
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
};

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

function daemonSet(docs: Doc[]): Doc {
  const found = docs.find((d) => d.kind === 'DaemonSet');
  assert.ok(found, 'no DaemonSet in the manifest');
  return found;
}

describe('install/daemonset.yaml against the Kubernetes schemas', () => {
  const docs = loadManifest();

  test('every document passes the OpenAPI validation of its kind', () => {
    assert.deepEqual(docs.map(kindOf), ['v1/Namespace', 'v1/ServiceAccount', 'v1/ConfigMap', 'apps/v1/DaemonSet']);
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

  test('one privileged container; hostNetwork is not needed', () => {
    assert.equal(pod.containers.length, 1);
    assert.equal(container.securityContext.privileged, true);
    assert.notEqual(pod.hostNetwork, true);
  });

  test('hostPath mounts for the plugin dir, /var/lib/latch, /var/log/latch and /etc/latch, each at the same path', () => {
    const pluginDir = env.get('LATCH_VOLUME_PLUGIN_DIR')?.value;
    assert.equal(pluginDir, '/usr/libexec/kubernetes/kubelet-plugins/volume/exec');
    for (const path of [pluginDir, '/var/lib/latch', '/var/log/latch', '/etc/latch']) {
      const mount = mountOf(path);
      assert.ok(mount, `nothing is mounted at ${path}`);
      assert.notEqual(mount.readOnly, true, `${path} must be writable`);
      assert.equal(volumes.get(mount.name)?.hostPath?.path, path, `${path} is not the host's ${path}`);
    }
  });

  test('NODE_NAME comes from spec.nodeName', () => {
    assert.deepEqual(env.get('NODE_NAME')?.valueFrom, { fieldRef: { fieldPath: 'spec.nodeName' } });
  });

  test('it tolerates the control-plane taints, so attach mode has the driver where the controller runs', () => {
    for (const key of ['node-role.kubernetes.io/control-plane', 'node-role.kubernetes.io/master']) {
      assert.ok(
        pod.tolerations.some((t: Doc) => t.key === key && t.operator === 'Exists' && (t.effect === undefined || t.effect === 'NoSchedule')),
        `no toleration for ${key}`,
      );
    }
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

  test('all objects live in one namespace, and the pods select their own labels', () => {
    const ns = docs.find((d) => d.kind === 'Namespace')!.metadata.name;
    for (const d of docs.filter((d) => d.kind !== 'Namespace')) assert.equal(d.metadata.namespace, ns, d.kind);
    for (const [k, v] of Object.entries(ds.spec.selector.matchLabels)) assert.equal(ds.spec.template.metadata.labels[k], v);
    assert.equal(pod.serviceAccountName, docs.find((d) => d.kind === 'ServiceAccount')!.metadata.name);
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
    assert.match(readFileSync(join(ROOT, 'build.mjs'), 'utf8'), /buildSea\('bin\/latch-sea'\)/);
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

  test('entrypoint.sh is valid POSIX sh', () => {
    execFileSync('sh', ['-n', join(ROOT, 'install/entrypoint.sh')]);
  });
});
