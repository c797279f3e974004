// The kernel rbd client (src/backend/krbd.ts) against a fake kernel: this machine has no rbd module, so a directory
// plays /sys/bus/rbd/devices, laid out as the kernel lays it out (Documentation/ABI/testing/sysfs-bus-rbd), and a
// fake `rbd` on PATH adds and removes mappings there as `rbd device map`/`unmap` do, answers `lock ls` and `status`
// from files, and records every call's arguments. What this checks is latch's side: which mapping it finds, what it
// runs and with which options, what it refuses; not the kernel's.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, afterEach, before, beforeEach, describe, it } from 'node:test';
import { KernelRbdClient } from '../../src/backend/krbd.js';
import { RbdBackend } from '../../src/backend/rbd.js';
import { fakeToolsOnPath, type FakeTools } from '../fixtures/fake-tools.js';

const KEYRING = '/etc/ceph/ceph.client.node-a.keyring';
const identity = { cephConf: '/etc/ceph/ceph.conf', clientId: 'node-a', keyring: KEYRING };
const RW = { readOnly: false };

// The fake rbd: node, so that it parses JSON and argv as the real one would be given them.
const FAKE_RBD = `#!/usr/bin/env node
const fs = require('fs');
const path = require('path');
const state = process.env.FAKE_RBD_STATE;
const devices = path.join(process.env.FAKE_SYS, 'bus/rbd/devices');
const argv = process.argv.slice(2);
fs.appendFileSync(path.join(state, 'calls'), JSON.stringify(argv) + '\\n');
const args = [];
for (let i = 0; i < argv.length; i++) {
  if (['--conf', '--id', '--keyring', '--format', '--device-type', '--options'].includes(argv[i])) i++;
  else args.push(argv[i]);
}
const read = (name, fallback) => { try { return fs.readFileSync(path.join(state, name), 'utf8'); } catch { return fallback; } };
const [a, b] = args;
if (a === 'device' && b === 'map') {
  if (fs.existsSync(path.join(state, 'map-fails'))) { process.stderr.write('rbd: map failed: (110) Connection timed out\\n'); process.exit(110); }
  if (fs.existsSync(path.join(state, 'old-kernel'))) {
    process.stderr.write('rbd: sysfs write failed\\nRBD image feature set mismatch. You can disable features unsupported by the kernel with "rbd feature disable latch/vol-a object-map fast-diff deep-flatten".\\nIn some cases useful info is found in syslog - try "dmesg | tail".\\nrbd: map failed: (6) No such device or address\\n');
    process.exit(6);
  }
  const [pool, name] = args[2].split('/');
  fs.mkdirSync(devices, { recursive: true });
  const taken = fs.readdirSync(devices).map(Number);
  let id = 0;
  while (taken.includes(id)) id++;
  const dir = path.join(devices, String(id));
  fs.mkdirSync(dir);
  const size = read('size', String(1 << 30)).trim();
  const attrs = { pool, pool_ns: '', name, current_snap: '-', size, client_addr: '10.0.0.5:0/' + (4000 + id) };
  for (const [k, v] of Object.entries(attrs)) fs.writeFileSync(path.join(dir, k), v + '\\n');
  process.stdout.write('/dev/rbd' + id + '\\n');
} else if (a === 'device' && b === 'unmap') {
  const id = /^\\/dev\\/rbd([0-9]+)$/.exec(args[2])[1];
  fs.rmSync(path.join(devices, id), { recursive: true });
} else if (a === 'lock' && b === 'ls') {
  if (fs.existsSync(path.join(state, 'status-fails'))) { process.stderr.write('rbd: listing locks failed: (110) Connection timed out\\n'); process.exit(110); }
  process.stdout.write(read('locks', '[]'));
} else if (a === 'status') {
  if (fs.existsSync(path.join(state, 'status-fails'))) { process.stderr.write('rbd: show status failed: (110) Connection timed out\\n'); process.exit(110); }
  process.stdout.write(JSON.stringify({ watchers: JSON.parse(read('watchers', '[]')).map((address) => ({ address })) }));
} else if (a === 'info') {
  process.stdout.write(JSON.stringify({ size: 1 << 30, features: JSON.parse(read('features', '["layering","exclusive-lock"]')) }));
} else if (a === 'lock' && b === 'rm') {
  const locks = JSON.parse(read('locks', '[]')).filter((l) => !(l.id === args[3] && l.locker === args[4]));
  fs.writeFileSync(path.join(state, 'locks'), JSON.stringify(locks));
} else {
  process.stderr.write('fake rbd: unexpected ' + argv.join(' ') + '\\n');
  process.exit(22);
}
`;

describe('KernelRbdClient on a fake /sys/bus/rbd', () => {
  let work: string;
  let sys: string;
  let state: string;
  let tools: FakeTools;
  let client: KernelRbdClient;

  before(() => {
    tools = fakeToolsOnPath('latch-krbd-', { rbd: FAKE_RBD });
    work = tools.work;
  });
  after(() => tools.restore());
  beforeEach(() => {
    sys = join(work, 'sys');
    state = join(work, 'state');
    for (const dir of [sys, state]) rmSync(dir, { recursive: true, force: true });
    mkdirSync(join(sys, 'bus/rbd/devices'), { recursive: true });
    mkdirSync(state);
    process.env.FAKE_SYS = sys;
    process.env.FAKE_RBD_STATE = state;
    client = new KernelRbdClient({ identity, pool: 'latch', timeoutMs: 5_000, sysRoot: sys });
  });
  afterEach(() => {
    delete process.env.FAKE_SYS;
    delete process.env.FAKE_RBD_STATE;
  });

  const calls = (): string[][] =>
    existsSync(join(state, 'calls'))
      ? readFileSync(join(state, 'calls'), 'utf8')
          .trim()
          .split('\n')
          .map((line) => JSON.parse(line) as string[])
      : [];
  /** Each call's command: `device map`, `lock ls`, `status`... */
  const commands = () =>
    calls().map((argv) => {
      const [verb = '', sub = ''] = argv.slice(6);
      return ['device', 'lock'].includes(verb) ? `${verb} ${sub}` : verb;
    });
  /** A mapping made behind latch's back, as another tool or an earlier kernel would leave it. */
  const addMapping = (id: number, attrs: Record<string, string>) => {
    const dir = join(sys, 'bus/rbd/devices', String(id));
    mkdirSync(dir, { recursive: true });
    const all = { pool: 'latch', pool_ns: '', name: 'vol-a', current_snap: '-', size: String(1 << 30), ...attrs };
    for (const [k, v] of Object.entries(all)) writeFileSync(join(dir, k), `${v}\n`);
  };

  it('maps with its own client instance (noshare), as the node identity, the key only by its keyring file', async () => {
    assert.equal(await client.map('vol-a', RW), '/dev/rbd0');
    const map = calls().find((argv) => argv.includes('map'));
    assert.deepEqual(map, [
      '--conf',
      '/etc/ceph/ceph.conf',
      '--id',
      'node-a',
      '--keyring',
      KEYRING,
      'device',
      'map',
      '--device-type',
      'krbd',
      '--options',
      'noshare,exclusive',
      'latch/vol-a',
    ]);
    assert.equal(await client.deviceOf('vol-a'), '/dev/rbd0');
    assert.equal(await client.isMapped('vol-a'), true);
    assert.equal(await client.imageOf('/dev/rbd0'), 'vol-a');
    assert.equal(await client.clientAddress('vol-a'), '10.0.0.5:0/4000');
  });

  it('finds an existing mapping in sysfs and maps nothing again', async () => {
    addMapping(3, { name: 'vol-a' });
    assert.equal(await client.map('vol-a', RW), '/dev/rbd3');
    assert.deepEqual(commands(), [], 'no rbd call: the kernel already maps it');
    assert.equal(await client.map('vol-a', RW), '/dev/rbd3');
  });

  it('tells its own mappings from other pools, namespaces, snapshots and images', async () => {
    addMapping(0, { pool: 'other' });
    addMapping(1, { pool_ns: 'tenant' });
    addMapping(2, { current_snap: 'nightly' });
    addMapping(4, { name: 'vol-b' });
    assert.equal(await client.deviceOf('vol-a'), undefined);
    assert.equal(await client.isMapped('vol-a'), false);
    for (const id of [0, 1, 2]) assert.equal(await client.imageOf(`/dev/rbd${id}`), undefined, `rbd${id} is not latch's`);
    assert.equal(await client.imageOf('/dev/rbd4'), 'vol-b');
    assert.equal(await client.imageOf('/dev/loop4'), undefined);
    assert.equal(await client.imageOf('/dev/rbd9'), undefined, 'not mapped');
    assert.equal(await client.map('vol-a', RW), '/dev/rbd3', 'a new mapping beside the others');
  });

  it('keeps one mapping of an image: duplicates (a crash between two maps) are unmapped', async () => {
    addMapping(2, {});
    addMapping(5, {});
    assert.equal(await client.map('vol-a', RW), '/dev/rbd2');
    assert.deepEqual(readdirSync(join(sys, 'bus/rbd/devices')), ['2']);
    assert.deepEqual(commands(), ['device unmap']);
  });

  it('breaks a lock whose holder has no watch (fenced or dead) before mapping, and no live holder', async () => {
    const dead = { id: 'auto 139', locker: 'client.4157', address: '10.0.0.9:0/77' };
    const live = { id: 'auto 140', locker: 'client.4200', address: '10.0.0.8:0/78' };
    writeFileSync(join(state, 'locks'), JSON.stringify([dead, live]));
    writeFileSync(join(state, 'watchers'), JSON.stringify([live.address]));
    await client.map('vol-a', RW);
    assert.deepEqual(commands(), ['lock ls', 'status', 'lock rm', 'info', 'device map']);
    const rm = calls().find((argv) => argv[6] === 'lock' && argv[7] === 'rm');
    assert.deepEqual(rm?.slice(8), ['latch/vol-a', 'auto 139', 'client.4157']);
    assert.deepEqual(JSON.parse(readFileSync(join(state, 'locks'), 'utf8')), [live]);
  });

  it('on a kernel without the rbd module: a clear error, before anything reaches the cluster', async () => {
    rmSync(join(sys, 'bus'), { recursive: true });
    writeFileSync(join(state, 'locks'), JSON.stringify([{ id: 'auto 1', locker: 'client.9', address: '10.0.0.9:0/77' }]));
    await assert.rejects(client.map('vol-a', RW), /this kernel has no rbd module \(\S+\/bus\/rbd is missing\); load it \(modprobe rbd\)/);
    assert.deepEqual(commands(), [], 'no lock broken, no map tried');
    assert.equal(await client.isMapped('vol-a'), false);
    await client.unmap('vol-a');
  });

  it('a failed map fails the call and leaves no mapping', async () => {
    writeFileSync(join(state, 'map-fails'), '');
    await assert.rejects(client.map('vol-a', RW), /Connection timed out/);
    assert.equal(await client.isMapped('vol-a'), false);
  });

  it('on a kernel older than the image: says which features and what rbd suggests, not only its last line', async () => {
    writeFileSync(join(state, 'old-kernel'), '');
    await assert.rejects(
      client.map('vol-a', RW),
      /^LatchError: this kernel cannot map latch\/vol-a: it does not support some of the image's features; rbd suggests "rbd feature disable latch\/vol-a object-map fast-diff deep-flatten"/,
    );
  });

  it('unmaps every mapping of the image, and nothing of other images', async () => {
    addMapping(0, {});
    addMapping(1, { name: 'vol-b' });
    addMapping(2, {});
    await client.unmap('vol-a');
    assert.deepEqual(readdirSync(join(sys, 'bus/rbd/devices')), ['1']);
    await client.unmap('vol-a');
    assert.deepEqual(commands(), ['device unmap', 'device unmap'], 'the repeat finds nothing to do');
  });

  it('waits for the kernel to show a grown image, and asks it to read the header again when it does not', async () => {
    addMapping(0, { size: String(1 << 30) });
    const sizeFile = join(sys, 'bus/rbd/devices/0/size');
    setTimeout(() => writeFileSync(sizeFile, `${2 ** 31}\n`), 200);
    await client.refreshSize('vol-a', 2 ** 31);
    assert.equal(existsSync(join(sys, 'bus/rbd/devices/0/refresh')), false, 'the watch brought the size: no refresh');
    // The kernel missed the header's update: after a second latch writes to `refresh` (here, only a file).
    const slow = new KernelRbdClient({ identity, pool: 'latch', timeoutMs: 1_500, sysRoot: sys });
    await assert.rejects(
      slow.refreshSize('vol-a', 2 ** 32),
      /rbd0 of latch\/vol-a still shows 2147483648 bytes after the image grew to 4294967296/,
    );
    assert.equal(readFileSync(join(sys, 'bus/rbd/devices/0/refresh'), 'utf8'), '1\n');
  });

  it('as the rbd backend: records the instance the kernel names, and forgets it on release', async () => {
    const mountDir = join(work, 'mnt');
    const backend = new RbdBackend({ ...identity, pool: 'latch', mountDir, maxSize: 2 ** 40, timeoutMs: 5_000, client: 'krbd' });
    // The backend's client reads the real /sys; give it this fake one.
    Object.assign(backend, { client });
    assert.equal(await backend.attach('vol-a'), '/dev/rbd0');
    assert.equal(await backend.clientOf('vol-a'), '10.0.0.5:0/4000');
    assert.equal(commands().includes('status'), false, 'the address comes from sysfs, not from the watchers');
    assert.equal(await backend.findDevice('vol-a'), '/dev/rbd0');
    assert.equal(await backend.volumeOfDevice('/dev/rbd0'), 'vol-a');
    await backend.release('vol-a');
    assert.equal(await backend.hasMapping('vol-a'), false);
    assert.equal(await backend.clientOf('vol-a'), undefined);
  });

  it('a read-only mapping takes no lock (no exclusive, no lock broken); a read-write one of a lock-less image maps without exclusive', async () => {
    writeFileSync(join(state, 'locks'), JSON.stringify([{ id: 'auto 1', locker: 'client.9', address: '10.0.0.9:0/77' }]));
    await client.map('vol-a', { readOnly: true });
    assert.deepEqual(commands(), ['device map']);
    assert.equal(calls()[0]?.[11], 'noshare');
    await client.unmap('vol-a');
    rmSync(join(state, 'calls'));
    writeFileSync(join(state, 'locks'), '[]');
    writeFileSync(join(state, 'features'), JSON.stringify(['layering']));
    await client.map('vol-a', RW);
    assert.deepEqual(commands(), ['lock ls', 'info', 'device map']);
    assert.equal(calls().at(-1)?.[11], 'noshare', 'the kernel refuses exclusive for an image without the exclusive-lock feature');
  });

  describe('as the rbd backend', () => {
    const backendOnFakeSys = () => {
      rmSync(join(work, 'mnt'), { recursive: true, force: true }); // no record left by an earlier test
      const backend = new RbdBackend({
        ...identity,
        pool: 'latch',
        mountDir: join(work, 'mnt'),
        maxSize: 2 ** 40,
        timeoutMs: 5_000,
        client: 'krbd',
      });
      // The backend's client reads the real /sys; give it this fake one.
      Object.assign(backend, { client });
      return backend;
    };
    const readWrite = (knownClients: string[] = []) => ({ readOnly: false, knownClients });

    it('refuses a read-write map while a watcher the ledger does not record for this node has the image open', async () => {
      const backend = backendOnFakeSys();
      writeFileSync(join(state, 'watchers'), JSON.stringify(['10.0.0.7:0/700', '10.0.0.8:0/800']));
      await assert.rejects(
        backend.attach('vol-a', readWrite(['10.0.0.8:0/800'])),
        /^LatchError: refusing to map latch\/vol-a read-write on this node: the image is open or locked by 10\.0\.0\.7:0\/700 \(watcher\), which the ledger does not record for this node/,
      );
      assert.equal(commands().includes('device map'), false, 'nothing mapped');
      assert.equal(await backend.hasMapping('vol-a'), false);
      // Read-only, the same image maps: other nodes may read it at once.
      assert.equal(await backend.attach('vol-a', { readOnly: true, knownClients: [] }), '/dev/rbd0');
    });

    it('refuses a read-write map while an unknown client holds the lock; its own recorded or a fenced holder is fine', async () => {
      const backend = backendOnFakeSys();
      const stale = { id: 'auto 7', locker: 'client.4157', address: '10.0.0.9:0/77' };
      writeFileSync(join(state, 'locks'), JSON.stringify([stale]));
      await assert.rejects(backend.attach('vol-a', readWrite()), /by 10\.0\.0\.9:0\/77 \(lock holder client\.4157\), which the ledger/);
      assert.equal(await backend.hasMapping('vol-a'), false);
      // Known to the ledger (this node's client before a crash, or a fenced one): the dead lock is broken, the map made.
      assert.equal(await backend.attach('vol-a', readWrite([stale.address])), '/dev/rbd0');
      assert.deepEqual(JSON.parse(readFileSync(join(state, 'locks'), 'utf8')), []);
    });

    it("counts this node's own record of its client as known (an attach that crashed before the ledger recorded it)", async () => {
      const backend = backendOnFakeSys();
      const own = { id: 'auto 7', locker: 'client.4157', address: '10.0.0.9:0/77' };
      writeFileSync(join(state, 'locks'), JSON.stringify([own]));
      mkdirSync(join(work, 'mnt', '.clients'), { recursive: true });
      writeFileSync(join(work, 'mnt', '.clients', 'vol-a'), `${own.address}\n`);
      assert.equal(await backend.attach('vol-a', readWrite()), '/dev/rbd0');
      assert.equal(await backend.clientOf('vol-a'), '10.0.0.5:0/4000', 'the new mapping recorded in its place');
      await backend.release('vol-a');
    });

    it('fails the read-write map when the watchers cannot be listed, rather than taking it for nobody', async () => {
      const backend = backendOnFakeSys();
      writeFileSync(join(state, 'status-fails'), '');
      await assert.rejects(backend.attach('vol-a', readWrite()), /Connection timed out/);
      assert.equal(await backend.hasMapping('vol-a'), false);
    });

    it('an attach whose client instance cannot be told fails and leaves no mapping', async () => {
      const backend = backendOnFakeSys();
      // A kernel whose mapping shows no usable client_addr (here: the fake's attribute taken away as soon as it maps).
      const unnamed = Object.assign(Object.create(client) as KernelRbdClient, { clientAddress: async () => undefined });
      Object.assign(backend, { client: unnamed });
      await assert.rejects(
        backend.attach('vol-a', readWrite()),
        /^LatchError: krbd mapped latch\/vol-a, but cannot tell which Ceph client instance serves the mapping: .* it was undone/,
      );
      assert.equal(await client.isMapped('vol-a'), false);
      assert.equal(await backend.clientOf('vol-a'), undefined);
    });

    it("release breaks the lock its own (now gone) client left, and nobody else's", async () => {
      const backend = backendOnFakeSys();
      assert.equal(await backend.attach('vol-a', readWrite()), '/dev/rbd0');
      const own = { id: 'auto 1', locker: 'client.4001', address: '10.0.0.5:0/4000' };
      const other = { id: 'auto 2', locker: 'client.4002', address: '10.0.0.6:0/6000' };
      writeFileSync(join(state, 'locks'), JSON.stringify([own, other]));
      await backend.release('vol-a');
      assert.deepEqual(JSON.parse(readFileSync(join(state, 'locks'), 'utf8')), [other]);
    });
  });

  it(
    'refuses to unmap a mounted device',
    { skip: process.getuid?.() === 0 ? false : 'needs root (a mount whose source is /dev/rbd0)' },
    async () => {
      addMapping(0, {});
      const target = join(work, 'mounted');
      mkdirSync(target, { recursive: true });
      // mountinfo shows a tmpfs's source as given: the mount table then lists /dev/rbd0 as mounted.
      execFileSync('mount', ['-t', 'tmpfs', '/dev/rbd0', target]);
      try {
        await assert.rejects(client.unmap('vol-a'), /\/dev\/rbd0 of latch\/vol-a is still mounted; unmount it first/);
        assert.deepEqual(commands(), []);
      } finally {
        execFileSync('umount', [target]);
      }
    },
  );
});
