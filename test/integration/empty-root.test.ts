// The driver where kube-controller-manager really runs it: a distroless container that sees the plugin dir and
// nothing else. `latch install --config-beside-driver` of bin/latch-sea into a temp plugin dir, then a chroot into a
// temp dir that holds only that plugin dir (no /lib, /usr, /bin, /etc or /proc; an empty environment) runs init,
// attach, isattached and detach against an etcd store over TLS, configured only by what is beside the driver.
//
// The empty-root part needs root (chroot), bin/latch-sea (npm run build:sea; LATCH_REQUIRE_SEA=1 makes its absence a
// failure), etcd and openssl; it skips with a message otherwise. The configuration lookup beside the driver is
// tested without any of them.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { loadConfig } from '../../src/config.js';
import { callInEmptyRoot, emptyRootWith, type EmptyRoot } from '../../src/host/empty-root.js';
import { EtcdCluster, etcdSkipReason, makeTestCertificates } from '../etcd/etcd.js';

const REPO = resolve(__dirname, '..', '..');
const SEA = join(REPO, 'bin/latch-sea');

function emptyRootSkipReason(): string | undefined {
  if (process.getuid?.() !== 0) return 'needs root (chroot into the empty root)';
  if (!existsSync(SEA)) {
    if (process.env.LATCH_REQUIRE_SEA === '1') return undefined; // the before() hook fails instead
    return `${SEA} is missing: run 'npm run build:sea'`;
  }
  if (spawnSync('openssl', ['version']).status !== 0) return 'needs openssl (the etcd member serves TLS)';
  return etcdSkipReason();
}

interface Reply {
  status: string;
  message?: string;
  attached?: boolean;
  capabilities?: { attach?: boolean };
}

describe('the installed driver in an empty root, against etcd over TLS', { skip: emptyRootSkipReason(), timeout: 180_000 }, () => {
  let work: string;
  let etcd: EtcdCluster | undefined;
  let config: string;
  let driverDir: string;
  let root: EmptyRoot;
  const VOLUME = 'pv-empty-root';
  const options = JSON.stringify({
    'kubernetes.io/fsType': '',
    'kubernetes.io/pvOrVolumeName': VOLUME,
    'kubernetes.io/readwrite': 'rw',
  });

  /** One call in the empty root: exactly one JSON object on stdout, nothing on stderr, exit 0 for Success. */
  async function call(...args: string[]): Promise<Reply> {
    const result = await callInEmptyRoot(root, args);
    assert.equal(result.stderr, '', `${args[0]} wrote to stderr`);
    const reply = JSON.parse(result.stdout) as Reply;
    assert.equal(result.exitCode, reply.status === 'Failure' ? 1 : 0, `${args[0]}: exit ${result.exitCode} for ${result.stdout}`);
    return reply;
  }

  /** An admin command of bin/latch-sea on the host, with the host's configuration. */
  function latch(...args: string[]): string {
    const r = spawnSync(SEA, args, { encoding: 'utf8', env: { ...process.env, LATCH_CONFIG: config } });
    assert.equal(r.status, 0, `latch ${args.join(' ')}: ${r.stdout}${r.stderr}`);
    return r.stdout;
  }

  before(async () => {
    assert.ok(existsSync(SEA), `${SEA} is missing (LATCH_REQUIRE_SEA=1): run 'npm run build:sea'`);
    work = mkdtempSync(join(tmpdir(), 'latch-empty-root-test-'));
    const certs = makeTestCertificates(join(work, 'certs'));
    assert.ok(certs, 'openssl made no certificates');
    etcd = await EtcdCluster.start({ size: 1, clientTls: { server: certs.server, ca: certs.ca } });
    config = join(work, 'config.json');
    writeFileSync(
      config,
      JSON.stringify({
        attach: true,
        nodeName: 'control-plane-1',
        poolDir: join(work, 'pool'),
        stateDir: join(work, 'state'),
        logFile: join(work, 'log/latch.log'),
        store: { type: 'etcd', endpoints: etcd.endpoints, prefix: '/latch-empty-root/', tls: certs.client },
      }),
    );
    const plugins = join(work, 'plugins');
    const installed = JSON.parse(latch('install', '--plugin-dir', plugins, '--config-beside-driver', '-o', 'json')) as {
      path: string;
      runtime?: string;
      config?: string;
    };
    assert.ok(installed.runtime, 'install shipped no runtime beside the driver');
    driverDir = join(plugins, 'latch~loop');
    root = await emptyRootWith(driverDir, driverDir, installed.path);
  });

  after(async () => {
    await root?.remove();
    await etcd?.stop();
    if (work) rmSync(work, { recursive: true, force: true });
  });

  test('beside the driver: its runtime, and the configuration and etcd files, 0600, named relative to it', () => {
    const beside = join(driverDir, '.latch');
    const names = readdirSync(beside).sort();
    assert.deepEqual(
      names.filter((n) => !n.startsWith('runtime-')),
      ['config.json', 'etcd-ca.pem', 'etcd-cert.pem', 'etcd-key.pem'],
    );
    for (const name of ['config.json', 'etcd-ca.pem', 'etcd-cert.pem', 'etcd-key.pem']) {
      assert.equal(statSync(join(beside, name)).mode & 0o777, 0o600, `${name} mode`);
    }
    const written = JSON.parse(readFileSync(join(beside, 'config.json'), 'utf8'));
    assert.deepEqual(written.store.tls, { ca: 'etcd-ca.pem', cert: 'etcd-cert.pem', key: 'etcd-key.pem' });
  });

  test('the empty root holds the plugin dir and nothing else', () => {
    assert.deepEqual(readdirSync(root.root), [driverDir.split('/')[1]]);
    for (const dir of ['lib', 'lib64', 'usr', 'bin', 'etc', 'proc']) assert.ok(!existsSync(join(root.root, dir)), `${dir} in the root`);
  });

  test('init, attach, isattached, detach, isattached: the replies KCM expects, and the ledger in etcd agrees', async () => {
    const init = await call('init');
    assert.equal(init.status, 'Success');
    assert.equal(init.capabilities?.attach, true);

    assert.equal((await call('attach', options, 'node-a')).status, 'Success');
    const attached = await call('isattached', options, 'node-a');
    assert.deepEqual([attached.status, attached.attached], ['Success', true]);
    // The host sees the grant through its own configuration: the call in the empty root wrote to etcd.
    const tickets = latch('ticket', 'list', VOLUME, '-o', 'json');
    assert.match(tickets, /node-a/);

    assert.equal((await call('detach', VOLUME, 'node-a')).status, 'Success');
    const detached = await call('isattached', options, 'node-a');
    assert.deepEqual([detached.status, detached.attached], ['Success', false]);
  });

  test('a configuration beside the driver readable by others while it names a key is refused, naming the fix', async () => {
    const beside = join(root.root, driverDir, '.latch/config.json');
    chmodSync(beside, 0o644);
    try {
      const reply = await call('isattached', options, 'node-a');
      assert.equal(reply.status, 'Failure');
      assert.match(reply.message ?? '', /readable by others than its owner \(mode 0644\): run chmod 600 .*config\.json/);
    } finally {
      chmodSync(beside, 0o600);
    }
    assert.equal((await call('isattached', options, 'node-a')).status, 'Success');
  });
});

describe('the configuration beside the driver', () => {
  let dir: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'latch-beside-config-'));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  /** A driver dir with .latch/config.json holding `doc` (mode `mode`), and the locations loadConfig reads. */
  function driverWith(name: string, doc: unknown, mode = 0o600) {
    const driverDir = join(dir, name, 'latch~loop');
    mkdirSync(join(driverDir, '.latch'), { recursive: true });
    writeFileSync(join(driverDir, '.latch/config.json'), JSON.stringify(doc), { mode });
    chmodSync(join(driverDir, '.latch/config.json'), mode);
    return { defaultPath: join(dir, 'no-such-etc/config.json'), driverFile: join(driverDir, 'loop') };
  }

  const etcdWithKey = {
    store: { type: 'etcd', endpoints: ['https://127.0.0.1:2379'], tls: { ca: 'etcd-ca.pem', cert: 'etcd-cert.pem', key: 'etcd-key.pem' } },
  };

  test('is read when the default file is absent, and the etcd files are relative to it', () => {
    const where = driverWith('relative', etcdWithKey);
    const c = loadConfig({}, where);
    assert.equal(c.source, join(dir, 'relative/latch~loop/.latch/config.json'));
    assert.ok(c.store.type === 'etcd');
    assert.deepEqual(c.store.tls, {
      ca: join(dir, 'relative/latch~loop/.latch/etcd-ca.pem'),
      cert: join(dir, 'relative/latch~loop/.latch/etcd-cert.pem'),
      key: join(dir, 'relative/latch~loop/.latch/etcd-key.pem'),
    });
  });

  test('is not read when the default file exists, nor when LATCH_CONFIG is set', () => {
    const where = driverWith('shadowed', { driverName: 'beside/driver' });
    writeFileSync(join(dir, 'etc.json'), JSON.stringify({ driverName: 'etc/driver' }));
    assert.equal(loadConfig({}, { ...where, defaultPath: join(dir, 'etc.json') }).driverName, 'etc/driver');
    assert.equal(loadConfig({ LATCH_CONFIG: join(dir, 'etc.json') }, where).driverName, 'etc/driver');
    assert.equal(loadConfig({}, where).driverName, 'beside/driver');
  });

  test('neither there: the built-in defaults', () => {
    const c = loadConfig({}, { defaultPath: join(dir, 'none.json'), driverFile: join(dir, 'nowhere/latch~loop/loop') });
    assert.equal(c.source, 'built-in defaults');
  });

  test('naming a key while group- or world-readable is refused with the chmod that fixes it; so is a readable key', () => {
    const where = driverWith('readable', etcdWithKey, 0o640);
    assert.throws(
      () => loadConfig({}, where),
      /names a key, and it is readable by others than its owner \(mode 0640\): run chmod 600 .*config\.json/,
    );
    chmodSync(join(dir, 'readable/latch~loop/.latch/config.json'), 0o600);
    const key = join(dir, 'readable/latch~loop/.latch/etcd-key.pem');
    writeFileSync(key, 'not really a key', { mode: 0o644 });
    chmodSync(key, 0o644);
    assert.throws(
      () => loadConfig({}, where),
      new RegExp(`the key ${key} is readable by others than its owner \\(mode 0644\\): run chmod 600`),
    );
    chmodSync(key, 0o600);
    assert.doesNotThrow(() => loadConfig({}, where));
    // Without a key, a readable configuration is no secret.
    assert.doesNotThrow(() => loadConfig({}, driverWith('no-key', { attach: true }, 0o644)));
  });
});
