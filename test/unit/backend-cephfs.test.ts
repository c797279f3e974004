// Shared volumes without a cluster: the kernel CephFS client (src/backend/cephfs-kernel.ts) against a fake mount table
// and a fake mount command (this machine has no ceph module), the choice of client, the node identity's caps, and the
// refusals: a hostile subvolume path, a block fsType on a shared volume, ReadWriteMany on a block volume, a bad
// accessMode option. What this checks is latch's side (what it runs, what it finds, what it refuses), not the kernel's.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { chooseCephFsClient } from '../../src/backend/cephfs.js';
import { KernelCephClient } from '../../src/backend/cephfs-kernel.js';
import { parseOptions } from '../../src/contract/options.js';
import { newVolume } from '../../src/ledger/arbitrate.js';
import { parseConfig } from '../../src/config.js';
import { createContext } from '../../src/context.js';
import { setUpDevice } from '../../src/node/device.js';
import { refuseKindMismatch } from '../../src/node/shared.js';
import { MemoryStore } from '../fixtures/memory-store.js';
import { cephfsNodeCaps, isSubvolumePath, parseCloneStatus } from '../../src/sys/cephfs.js';
import type { MountInfo } from '../../src/sys/mounts.js';

const dir = mkdtempSync(join(tmpdir(), 'latch-cephfs-unit-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const KEY = 'AQBfakefakefakefakefakefakefakefakefake==';
const keyring = join(dir, 'ceph.client.latch-node-a.keyring');
writeFileSync(keyring, `[client.latch-node-a]\n\tkey = ${KEY}\n`, { mode: 0o600 });
const identity = { cephConf: '/etc/ceph/ceph.conf', clientId: 'latch-node-a', keyring };
const ROOT = '/volumes/latch/v1/0b4a1c3e-1111-4222-8333-944455556666';

function ceph(mountPoint: string, source: string, name = 'latch-node-a', root = '/'): MountInfo {
  return {
    id: 1,
    parentId: 0,
    majorMinor: '0:77',
    root,
    mountPoint,
    options: ['rw'],
    optionalFields: [],
    fsType: 'ceph',
    source,
    superOptions: ['rw', `name=${name}`, 'secret=<hidden>', 'acl'],
  };
}

function fakeKernel() {
  const table: MountInfo[] = [];
  const calls: string[][] = [];
  let failUmount = false;
  const client = new KernelCephClient({
    identity,
    fsName: 'cephfs',
    mountDir: dir,
    timeoutMs: 5_000,
    mountTable: () => Promise.resolve([...table]),
    exec: (command, args) => {
      calls.push([command, ...args]);
      if (command === 'mount') table.push(ceph(args[3] ?? '', `127.0.0.1:6789:${(args[2] ?? '').slice(1)}`));
      else if (failUmount && !args.includes('-f')) return Promise.reject(new Error('umount: target is busy'));
      else
        table.splice(
          table.findIndex((m) => m.mountPoint === args.at(-1)),
          1,
        );
      return Promise.resolve();
    },
  });
  return { client, table, calls, failUmountOnce: () => (failUmount = true) };
}

describe('the kernel CephFS client, against a fake kernel', () => {
  it('mounts the subvolume with the identity, a secret file and the file system, and never the key on argv', async () => {
    const { client, calls } = fakeKernel();
    await client.mount(ROOT, '/mnt/t1', { readOnly: false });
    const [command, ...args] = calls[0] ?? [];
    assert.equal(command, 'mount');
    assert.deepEqual(args.slice(0, 4), ['-t', 'ceph', `:${ROOT}`, '/mnt/t1']);
    const opts = (args[5] ?? '').split(',');
    assert.ok(opts.includes('name=latch-node-a'));
    assert.ok(opts.includes('mds_namespace=cephfs'));
    assert.ok(opts.includes(`secretfile=${join(dir, '.latch-node-a.secret')}`));
    assert.ok(!calls.flat().some((a) => a.includes(KEY)), 'the key is never on a command line');
    assert.equal(readFileSync(join(dir, '.latch-node-a.secret'), 'utf8').trim(), KEY);
    assert.equal(statSync(join(dir, '.latch-node-a.secret')).mode & 0o777, 0o600);
    await client.mount(ROOT, '/mnt/t2', { readOnly: true });
    assert.ok((calls[1]?.[6] ?? '').split(',').includes('ro'));
  });

  it('finds its own mounts by the identity in the superblock options, and the subvolume from the source', async () => {
    const { client, table } = fakeKernel();
    table.push(ceph('/mnt/a', `127.0.0.1:6789:${ROOT}`), ceph('/mnt/b', `127.0.0.1:6789:${ROOT}`, 'latch-node-b'));
    assert.equal((await client.mountAt('/mnt/a'))?.root, ROOT);
    assert.equal(await client.mountAt('/mnt/b'), undefined, "another node's mount on the same host is not this node's");
    assert.deepEqual(await client.mounts(), [{ target: '/mnt/a', root: ROOT }]);
  });

  it('unmounts, with -f when a plain umount fails (a fenced client), and does nothing where nothing is mounted', async () => {
    const { client, calls, table, failUmountOnce } = fakeKernel();
    await client.unmount('/mnt/none');
    assert.equal(calls.length, 0);
    table.push(ceph('/mnt/a', `127.0.0.1:6789:${ROOT}`));
    failUmountOnce();
    await client.unmount('/mnt/a');
    assert.deepEqual(calls.at(-1), ['umount', '-f', '/mnt/a']);
    assert.equal(table.length, 0);
  });

  it('unmounts a client its caller found hung with -f at once, never a plain umount first', async () => {
    const { client, calls, table } = fakeKernel();
    table.push(ceph('/mnt/a', `127.0.0.1:6789:${ROOT}`));
    await client.unmount('/mnt/a', { hung: true });
    assert.deepEqual(
      calls.filter((c) => c[0] === 'umount'),
      [['umount', '-f', '/mnt/a']],
    );
    assert.equal(table.length, 0);
  });

  it('refuses a keyring without a key', async () => {
    const bad = join(dir, 'empty.keyring');
    writeFileSync(bad, '[client.x]\n', { mode: 0o600 });
    const client = new KernelCephClient({
      identity: { ...identity, keyring: bad },
      fsName: 'cephfs',
      mountDir: dir,
      timeoutMs: 1000,
      exec: () => Promise.resolve(),
    });
    await assert.rejects(client.mount(ROOT, '/mnt/x', { readOnly: false }), /holds no key/);
  });
});

describe('shared volumes: choices, caps and refusals', () => {
  it('"auto" is the kernel client where /proc/filesystems lists ceph, else ceph-fuse; an explicit choice stands', () => {
    const withCeph = join(dir, 'filesystems-ceph');
    const without = join(dir, 'filesystems');
    writeFileSync(withCeph, 'nodev\tsysfs\n\text4\nnodev\tceph\n');
    writeFileSync(without, 'nodev\tsysfs\n\text4\nnodev\tfuse\n');
    assert.equal(chooseCephFsClient('auto', withCeph), 'kernel');
    assert.equal(chooseCephFsClient('auto', without), 'ceph-fuse');
    assert.equal(chooseCephFsClient('auto', join(dir, 'missing')), 'ceph-fuse');
    assert.equal(chooseCephFsClient('ceph-fuse', withCeph), 'ceph-fuse');
  });

  it("a node's caps reach only latch's subvolume group", () => {
    const caps = cephfsNodeCaps('latch', 'cephfs', 'latch');
    const of = (service: string) => caps[caps.indexOf(service) + 1] ?? '';
    assert.equal(of('mds'), 'allow rw fsname=cephfs path=/volumes/latch');
    assert.match(of('osd'), /allow rw tag cephfs data=cephfs/);
    for (const grant of of('mgr').split(', ')) assert.match(grant, /with vol_name=cephfs group_name=latch( target_group_name=latch)?$/);
    // A clone only from latch's group into latch's group.
    assert.match(
      of('mgr'),
      /allow command "fs subvolume snapshot clone" with vol_name=cephfs group_name=latch target_group_name=latch(,|$)/,
    );
    assert.doesNotMatch(of('mgr'), /subvolumegroup rm|fs volume |fs subvolume ls/);
  });

  it('refuses a subvolume path the volumes module would not give (it reaches ceph-fuse argv)', () => {
    const ref = { fsName: 'cephfs', group: 'latch', volume: 'v1' };
    assert.equal(isSubvolumePath(ROOT, ref), true);
    for (const bad of [
      '/',
      '/volumes/latch/v1',
      '/volumes/latch/v1/../v2/0b4a1c3e-1111-4222-8333-944455556666',
      '/volumes/other/v1/0b4a1c3e-1111-4222-8333-944455556666',
      `${ROOT}/x`,
      `${ROOT} --id admin`,
    ]) {
      assert.equal(isSubvolumePath(bad, ref), false, bad);
    }
  });

  it('refuses a block fsType on a shared volume, and ReadWriteMany on a block volume, saying which is which', () => {
    const block = newVolume('b1', 1 << 30, 'ext4', '2026-11-27T00:00:00.000Z');
    const shared = { ...block, name: 's1', spec: { ...block.spec, shared: true as const } };
    assert.match(
      refuseKindMismatch(shared, { fsType: 'ext4' }) ?? '',
      /shared \(ReadWriteMany\) CephFS volume: it has no block device and no ext4 filesystem/,
    );
    assert.equal(refuseKindMismatch(shared, {}), undefined);
    assert.match(refuseKindMismatch(block, { shared: true }) ?? '', /block \(ReadWriteOnce\) volume; it cannot be used ReadWriteMany/);
    assert.equal(refuseKindMismatch(block, { fsType: 'ext4' }), undefined);
  });

  it('parses accessMode and refuses anything else', () => {
    const limits = { allowedFsTypes: ['ext4' as const], maxSize: 1 << 30 };
    assert.equal(parseOptions(JSON.stringify({ volume: 'v1', accessMode: 'ReadWriteMany' }), limits).shared, true);
    assert.equal(parseOptions(JSON.stringify({ volume: 'v1', accessMode: 'ReadWriteOnce' }), limits).shared, undefined);
    assert.throws(() => parseOptions(JSON.stringify({ volume: 'v1', accessMode: 'RWX; rm -rf /' }), limits), /option "accessMode" must be/);
    assert.throws(() => parseOptions(JSON.stringify({ volume: 'v1', accesMode: 'ReadWriteMany' }), limits), /did you mean "accessMode"/);
  });

  it('never sets up a block device for a shared volume (a job or a manual attach that needs one is refused)', async () => {
    const config = parseConfig(
      { nodeName: 'node-a', poolDir: join(dir, 'pool'), stateDir: join(dir, 'state'), logFile: join(dir, 'latch.log') },
      'test',
    );
    const ctx = createContext(config, { store: new MemoryStore() });
    const block = newVolume('s1', 1 << 20, 'ext4', '2026-11-27T00:00:00.000Z');
    const shared = { ...block, spec: { ...block.spec, shared: true as const } };
    await assert.rejects(setUpDevice(ctx, 's1', shared), /shared \(ReadWriteMany\) CephFS volume: it has no block device to set up/);
    assert.equal(await ctx.backend.size('s1'), undefined, 'no image was made');
    // The runner sets a shared volume's job up without a device; a manual attach of it is refused by its handler.
    const { attachJob } = await import('../../src/node/jobs/attach.js');
    const ticket = {
      id: 't1',
      type: 'manual' as const,
      nodeID: 'node-a',
      parameters: { readOnly: false },
      job: { kind: 'attach' as const },
    };
    await assert.rejects(
      attachJob.run({ kind: 'attach' }, {
        ctx,
        volume: 's1',
        ticket,
        doc: shared,
        device: '/latch/shared/s1',
        signal: new AbortController().signal,
      } as never),
      /shared \(ReadWriteMany\) CephFS volume: it has no block device to attach/,
    );
  });
});

describe('clone status of shared volumes', () => {
  it('reads the state, source and failure of `ceph fs clone status`, and refuses what it does not know', () => {
    const status = parseCloneStatus(
      JSON.stringify({
        status: {
          state: 'failed',
          source: { volume: 'cephfs', subvolume: 'shv', snapshot: 's1', group: 'latch' },
          failure: { errno: '122', errstr: 'Disk quota exceeded' },
        },
      }),
    );
    assert.deepEqual(status, { state: 'failed', source: { volume: 'shv', snapshot: 's1' }, failure: 'Disk quota exceeded' });
    assert.equal(parseCloneStatus('{"status":{"state":"in-progress"}}').state, 'in-progress');
    assert.throws(() => parseCloneStatus('{"status":{"state":"exploded"}}'), /no known state/);
    assert.throws(() => parseCloneStatus('not json'), /not JSON/);
  });
});
