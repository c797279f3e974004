// The cluster install's own etcd, brought up here as the manifests describe it: the StatefulSet's etcd flags run as
// three real etcd processes (the pod DNS names and ports replaced by 127.0.0.1 and free ports, the Secret and hostPath
// mounts by temp dirs, every other flag as generated), with the TLS material the Job makes
// (ensureEtcdSecrets, over an in-memory Secrets API); then the built driver, with the node configuration the ConfigMap
// and the entrypoint make, records an attachment in it. Needs etcd (skips without it, saying so) and bin/latch
// (npm run build).
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import * as https from 'node:https';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { CommandIO } from '../../src/cli/io.js';
import { printManifests } from '../../src/cli/manifests.js';
import { clusterDomain, makeEtcdCerts } from '../../src/cli/etcd-certs.js';
import { ETCD, ensureEtcdSecrets, inClusterSecretApi, type SecretApi } from '../../src/host/etcd-secrets.js';
import { freeFixedPort } from '../ceph/cluster.js';
import { etcdBinary, etcdSkipReason, makeTestCertificates } from '../etcd/etcd.js';
import { defined } from '../fixtures/defined.js';
import { trackChild } from '../fixtures/tracked-children.js';

const ROOT = resolve(__dirname, '../..');
const LATCH = join(ROOT, 'bin/latch');
type Doc = Record<string, any>;

/** The Secrets API of one namespace, in memory: what the Job's calls would leave in the cluster. */
class MemorySecrets implements SecretApi {
  readonly secrets = new Map<string, { type: string; data: Record<string, string> }>();
  creates = 0;
  async get(name: string) {
    return this.secrets.get(name)?.data;
  }
  async create(name: string, type: string, data: Record<string, string>) {
    this.creates++;
    if (this.secrets.has(name)) return false;
    this.secrets.set(name, { type, data: { ...data } });
    return true;
  }
}

async function manifests(): Promise<Doc[]> {
  let text = '';
  const io: CommandIO = { out: (t) => (text += t), env: {}, context: () => assert.fail('no context') };
  await printManifests({ image: 'latch:test', output: 'json' }, io);
  return JSON.parse(text).items as Doc[];
}

/** One file of a Secret (which must be there). */
function secretFile(secrets: MemorySecrets, name: string, file: string): string {
  return defined(secrets.secrets.get(name)?.data[file], `${file} in the Secret ${name}`);
}

/** The long flags in `etcd --help` (the etcd the image installs: Debian's, as here). */
function etcdFlags(): Set<string> {
  const help = spawnSync(defined(etcdBinary()), ['--help'], { encoding: 'utf8' });
  return new Set([...`${help.stdout}${help.stderr}`.matchAll(/^\s+--([a-z0-9-]+)/gm)].map((m) => defined(m[1])));
}

const skip = etcdSkipReason() ?? (existsSync(LATCH) ? false : 'bin/latch is not built (npm run build)');

describe("latch's own etcd as the manifests run it", { skip }, () => {
  let dir: string;
  let docs: Doc[];
  let etcdContainer: Doc;
  let secrets: MemorySecrets;
  const procs: ChildProcess[] = [];
  const members = Array.from({ length: ETCD.members }, (_, i) => `${ETCD.name}-${i}`);
  const ports = new Map<string, { client: number; peer: number; metrics: number }>();

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'latch-own-etcd-'));
    docs = await manifests();
    const sts = defined(docs.find((d) => d.kind === 'StatefulSet'));
    etcdContainer = sts.spec.template.spec.containers[0];
    secrets = new MemorySecrets();
    // Ports below the kernel's ephemeral range: they are taken long before the members bind them, and a port of that
    // range may meanwhile become another connection's local port (CI once saw "bind: address already in use").
    const taken: number[] = [];
    const pick = async () => {
      const port = await freeFixedPort(taken);
      taken.push(port);
      return port;
    };
    for (const m of members) ports.set(m, { client: await pick(), peer: await pick(), metrics: await pick() });
  });

  after(async () => {
    for (const p of procs) p.kill('SIGKILL');
    await Promise.all(
      procs.map((p) => (p.exitCode === null && p.signalCode === null ? new Promise((r) => p.on('exit', r)) : Promise.resolve())),
    );
    rmSync(dir, { recursive: true, force: true });
  });

  test('the Job makes the three Secrets once; running it again keeps them as they are', async () => {
    const first = await ensureEtcdSecrets(secrets);
    assert.deepEqual(
      first.map((r) => `${r.action} ${r.secret}`),
      ['created latch-etcd-ca', 'created latch-etcd-member', 'created latch-etcd-client'],
    );
    const before = structuredClone([...secrets.secrets]);
    const again = await ensureEtcdSecrets(secrets, ['10.96.0.10']);
    assert.deepEqual(
      again.map((r) => r.action),
      ['kept', 'kept', 'kept'],
    );
    assert.deepEqual([...secrets.secrets], before, 'nothing replaced');

    // A run killed after the CA: the next one signs what is missing with the CA it finds.
    secrets.secrets.delete(ETCD.secrets.client);
    const resumed = await ensureEtcdSecrets(secrets);
    assert.deepEqual(
      resumed.map((r) => r.action),
      ['kept', 'kept', 'created'],
    );
    const ca = new X509Certificate(secretFile(secrets, ETCD.secrets.ca, 'ca.crt'));
    for (const name of [ETCD.secrets.member, ETCD.secrets.client]) {
      const leaf = new X509Certificate(secretFile(secrets, name, 'tls.crt'));
      assert.ok(leaf.verify(ca.publicKey), `${name} is signed by the CA`);
      assert.equal(defined(secrets.secrets.get(name)).type, 'kubernetes.io/tls');
    }
    const member = new X509Certificate(secretFile(secrets, ETCD.secrets.member, 'tls.crt'));
    assert.match(defined(member.subjectAltName), /DNS:\*\.latch-etcd\.latch-system\.svc\b/);
    assert.match(defined(member.subjectAltName), /IP Address:127\.0\.0\.1/);
  });

  test("every flag of the StatefulSet's etcd is one that etcd --help lists", () => {
    assert.deepEqual(etcdContainer.command, ['etcd']);
    const known = etcdFlags();
    assert.ok(known.has('initial-cluster'), 'etcd --help was read');
    const unknown = (etcdContainer.args as string[])
      .map((a) => defined(/^--([a-z0-9-]+)/.exec(a), a)[1])
      .filter((f) => f === undefined || !known.has(f));
    assert.deepEqual(unknown, []);
  });

  test('three members started with those flags form a cluster over mutual TLS', async () => {
    const tlsDir = join(dir, 'member-tls');
    mkdirSync(tlsDir, { mode: 0o700 });
    for (const [file, text] of Object.entries(defined(secrets.secrets.get(ETCD.secrets.member)).data))
      writeFileSync(join(tlsDir, file), text, { mode: 0o600 });
    const peerName = (m: string) => `https://${m}.${ETCD.name}.latch-system.svc`;
    for (const m of members) {
      const own = defined(ports.get(m));
      const args = (etcdContainer.args as string[]).map((flag) => {
        let f = flag.replaceAll('$(POD_NAME)', m);
        for (const other of members) {
          const p = defined(ports.get(other));
          f = f.replaceAll(`${peerName(other)}:${ETCD.peerPort}`, `https://127.0.0.1:${p.peer}`);
          f = f.replaceAll(`${peerName(other)}:${ETCD.clientPort}`, `https://127.0.0.1:${p.client}`);
        }
        return f
          .replace(`https://0.0.0.0:${ETCD.clientPort}`, `https://127.0.0.1:${own.client}`)
          .replace(`https://0.0.0.0:${ETCD.peerPort}`, `https://127.0.0.1:${own.peer}`)
          .replace(`http://0.0.0.0:${ETCD.metricsPort}`, `http://127.0.0.1:${own.metrics}`)
          .replace('/etc/latch-etcd/', `${tlsDir}/`)
          .replace('/var/lib/latch-etcd/', `${dir}/data/`);
      });
      assert.ok(!args.some((a) => /svc|0\.0\.0\.0|\/etc\/latch-etcd|\/var\/lib\/latch-etcd|\$\(/.test(a)), args.join(' '));
      const log = openSync(join(dir, `${m}.log`), 'a');
      const child = spawn('setpriv', ['--pdeathsig', 'SIGKILL', '--', defined(etcdBinary()), ...args, '--log-level', 'warn'], {
        stdio: ['ignore', log, log],
      });
      closeSync(log);
      trackChild(child);
      procs.push(child);
    }
    // Healthy needs a leader, which needs the peers to accept each other's certificates.
    for (const m of members) {
      const metrics = defined(ports.get(m)).metrics;
      const deadline = Date.now() + 30_000;
      let last = '';
      while (Date.now() < deadline) {
        last = await fetch(`http://127.0.0.1:${metrics}/health`).then(
          (r) => r.text(),
          (e: Error) => e.message,
        );
        if (/"health":"true"/.test(last)) break;
        await new Promise((r) => setTimeout(r, 200));
      }
      assert.match(last, /"health":"true"/, `${m}: ${last}\n${readFileSync(join(dir, `${m}.log`), 'utf8').slice(-2000)}`);
    }
  });

  test('a client without a certificate of the CA is refused', async () => {
    const other = defined(makeTestCertificates(join(dir, 'other')), 'openssl for a foreign certificate');
    const client = defined(ports.get(defined(members[0]))).client;
    const ca = defined(secrets.secrets.get(ETCD.secrets.client)).data['ca.crt'];
    const status = (cert?: { cert: string; key: string }) =>
      new Promise<string>((resolve) => {
        const req = https.request(
          { host: '127.0.0.1', port: client, path: '/v3/kv/range', method: 'POST', ca, ...(cert && { cert: cert.cert, key: cert.key }) },
          (res) => resolve(String(res.statusCode)),
        );
        req.on('error', (e) => resolve(e.message));
        req.end(JSON.stringify({ key: Buffer.from('x').toString('base64') }));
      });
    const foreign = { cert: readFileSync(other.client.cert, 'utf8'), key: readFileSync(other.client.key, 'utf8') };
    assert.notEqual(await status(foreign), '200');
    assert.notEqual(await status(), '200');
    const ours = { cert: secretFile(secrets, ETCD.secrets.client, 'tls.crt'), key: secretFile(secrets, ETCD.secrets.client, 'tls.key') };
    assert.equal(await status(ours), '200');
  });

  test("the built driver, with the ConfigMap's configuration as a node gets it, records an attachment there", () => {
    // What the entrypoint does on a host: the client Secret's files in /etc/latch/etcd, the endpoint replaced by the
    // client Service's address (here, the three members'), nodeName added.
    const etcdDir = join(dir, 'etc-latch/etcd');
    mkdirSync(etcdDir, { recursive: true, mode: 0o700 });
    for (const [file, text] of Object.entries(defined(secrets.secrets.get(ETCD.secrets.client)).data))
      writeFileSync(join(etcdDir, file), text, { mode: 0o600 });
    const configMap = defined(docs.find((d) => d.kind === 'ConfigMap'));
    const template = JSON.parse(configMap.data['config.json']);
    assert.deepEqual(template.store.tls, { ca: '/etc/latch/etcd/ca.crt', cert: '/etc/latch/etcd/tls.crt', key: '/etc/latch/etcd/tls.key' });
    const config = {
      ...template,
      nodeName: 'node-a',
      poolDir: join(dir, 'pool'),
      stateDir: join(dir, 'state'),
      logFile: join(dir, 'latch.log'),
      store: {
        ...template.store,
        endpoints: members.map((m) => `https://127.0.0.1:${defined(ports.get(m)).client}`),
        tls: { ca: join(etcdDir, 'ca.crt'), cert: join(etcdDir, 'tls.crt'), key: join(etcdDir, 'tls.key') },
      },
    };
    const configFile = join(dir, 'etc-latch/config.json');
    writeFileSync(configFile, JSON.stringify(config));
    const call = (...args: string[]) => {
      const r = spawnSync(process.execPath, [LATCH, ...args], {
        encoding: 'utf8',
        env: { ...process.env, LATCH_CONFIG: configFile },
        timeout: 60_000,
      });
      assert.equal(r.stderr, '', `${args[0]}: stderr`);
      return JSON.parse(r.stdout) as Doc;
    };
    const options = JSON.stringify({
      'kubernetes.io/fsType': '',
      'kubernetes.io/pvOrVolumeName': 'pv-own-etcd',
      'kubernetes.io/readwrite': 'rw',
    });
    assert.equal(call('attach', options, 'node-a').status, 'Success');
    assert.deepEqual(call('isattached', options, 'node-a'), { status: 'Success', attached: true });
    assert.deepEqual(call('isattached', options, 'node-b'), { status: 'Success', attached: false });
    // Another node with the same configuration sees the same ledger (volume list -o json through the CLI).
    const list = spawnSync(process.execPath, [LATCH, 'volume', 'list', '-o', 'json'], {
      encoding: 'utf8',
      env: { ...process.env, LATCH_CONFIG: configFile },
      timeout: 60_000,
    });
    assert.equal(list.status, 0, list.stderr);
    assert.match(list.stdout, /pv-own-etcd/);
  });
});

describe("the Job against an API server: the pod's token, the API server's CA, create only what is missing", () => {
  const certs = makeTestCertificates(join(tmpdir(), `latch-fake-api-${process.pid}`));
  let dir: string;
  let server: https.Server;
  let port: number;
  const stored = new Map<string, Doc>();
  const requests: string[] = [];

  before(async () => {
    if (!certs) return;
    dir = mkdtempSync(join(tmpdir(), 'latch-sa-'));
    writeFileSync(join(dir, 'token'), 'the-token\n');
    writeFileSync(join(dir, 'ca.crt'), readFileSync(certs.ca));
    server = https.createServer({ cert: readFileSync(certs.server.cert), key: readFileSync(certs.server.key) }, (req, res) => {
      let body = '';
      req.on('data', (d: Buffer) => (body += d.toString()));
      req.on('end', () => {
        requests.push(`${req.method} ${req.url}`);
        const reply = (status: number, value: unknown) =>
          res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(value));
        if (req.headers.authorization !== 'Bearer the-token') return reply(401, { reason: 'Unauthorized' });
        const base = '/api/v1/namespaces/latch-system/secrets';
        if (req.method === 'GET' && req.url?.startsWith(`${base}/`)) {
          const found = stored.get(req.url.slice(base.length + 1));
          return found ? reply(200, found) : reply(404, { reason: 'NotFound' });
        }
        if (req.method === 'POST' && req.url === base) {
          const secret = JSON.parse(body) as Doc;
          if (stored.has(secret.metadata.name)) return reply(409, { reason: 'AlreadyExists' });
          stored.set(secret.metadata.name, secret);
          return reply(201, secret);
        }
        return reply(405, {});
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    port = (server.address() as { port: number }).port;
  });

  after(async () => {
    if (!certs) return;
    await new Promise((r) => server.close(r));
    rmSync(dir, { recursive: true, force: true });
    rmSync(join(tmpdir(), `latch-fake-api-${process.pid}`), { recursive: true, force: true });
  });

  test(
    'Secrets created through the API, base64 and typed; a second run only reads; a 409 counts as kept',
    { skip: certs ? false : 'no openssl' },
    async () => {
      const env = { KUBERNETES_SERVICE_HOST: '127.0.0.1', KUBERNETES_SERVICE_PORT: String(port) };
      const api = await inClusterSecretApi(env, dir);
      const first = await ensureEtcdSecrets(api, ['10.96.0.20']);
      assert.deepEqual(
        first.map((r) => r.action),
        ['created', 'created', 'created'],
      );
      const member = defined(stored.get(ETCD.secrets.member));
      assert.equal(member.type, 'kubernetes.io/tls');
      assert.equal(member.metadata.namespace, 'latch-system');
      const cert = new X509Certificate(Buffer.from(member.data['tls.crt'], 'base64'));
      assert.match(defined(cert.subjectAltName), /IP Address:10\.96\.0\.20/, "the client Service's cluster IP");
      requests.length = 0;
      const again = await ensureEtcdSecrets(api);
      assert.deepEqual(
        again.map((r) => r.action),
        ['kept', 'kept', 'kept'],
      );
      assert.ok(
        requests.every((r) => r.startsWith('GET ')),
        requests.join(', '),
      );
      assert.equal(await api.create(ETCD.secrets.client, 'kubernetes.io/tls', { 'tls.crt': 'x' }), false, 'made meanwhile by another run');

      const wrongToken = join(dir, 'wrong');
      mkdirSync(wrongToken);
      writeFileSync(join(wrongToken, 'token'), 'other');
      writeFileSync(join(wrongToken, 'ca.crt'), readFileSync(certs!.ca));
      await assert.rejects(
        (await inClusterSecretApi(env, wrongToken)).get(ETCD.secrets.ca),
        /reading the Secret latch-etcd-ca: the API server answered 401/,
      );
    },
  );

  for (const build of ['bin/latch', 'bin/latch-sea']) {
    const missing = !certs ? 'no openssl' : existsSync(join(ROOT, build)) ? false : `${build} is not built`;
    test(
      `${build} install --make-etcd-certs, as the Job runs it: node-forge loads, the three Secrets are created`,
      { skip: missing },
      async () => {
        stored.clear();
        const child = spawn(join(ROOT, build), ['install', '--make-etcd-certs'], {
          env: {
            PATH: process.env.PATH,
            KUBERNETES_SERVICE_HOST: '127.0.0.1',
            KUBERNETES_SERVICE_PORT: String(port),
            LATCH_ETCD_CLIENT_SERVICE_HOST: '10.96.0.30',
            LATCH_SERVICE_ACCOUNT_DIR: dir,
          },
          stdio: ['ignore', 'pipe', 'pipe'],
        });
        trackChild(child);
        let out = '';
        let err = '';
        child.stdout.on('data', (d: Buffer) => (out += d.toString()));
        child.stderr.on('data', (d: Buffer) => (err += d.toString()));
        const code = await new Promise<number | null>((r) => child.on('exit', r));
        assert.equal(code, 0, err);
        assert.equal(out, 'created Secret latch-etcd-ca\ncreated Secret latch-etcd-member\ncreated Secret latch-etcd-client\n');
        assert.deepEqual([...stored.keys()].sort(), Object.values(ETCD.secrets).sort());
        const member = new X509Certificate(Buffer.from(defined(stored.get(ETCD.secrets.member)).data['tls.crt'], 'base64'));
        assert.match(defined(member.subjectAltName), /IP Address:10\.96\.0\.30/);
      },
    );
  }

  test("the cluster's DNS domain, from a pod's resolv.conf, for the members' names in the certificate", () => {
    const pod = 'nameserver 10.96.0.10\nsearch latch-system.svc.corp.example svc.corp.example corp.example\noptions ndots:5\n';
    assert.equal(clusterDomain(pod), 'corp.example');
    assert.equal(clusterDomain('search latch-system.svc.cluster.local svc.cluster.local cluster.local\n'), 'cluster.local');
    assert.equal(clusterDomain('nameserver 1.1.1.1\n'), undefined);
    assert.equal(clusterDomain('search svc.$(reboot)\n'), undefined, 'only a domain name');
  });

  test('outside a pod, or before the client Service exists, it says so', async () => {
    await assert.rejects(inClusterSecretApi({}, '/nonexistent'), /runs in a pod of the cluster install/);
    const io: CommandIO = { out: () => undefined, env: { KUBERNETES_SERVICE_HOST: '127.0.0.1' }, context: () => assert.fail('no context') };
    await assert.rejects(
      makeEtcdCerts(io),
      /\$LATCH_ETCD_CLIENT_SERVICE_HOST is not set: the Service latch-etcd-client did not exist when this pod started/,
    );
  });
});
