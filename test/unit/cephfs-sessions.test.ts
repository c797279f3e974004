// Which MDS sessions a fence of a shared volume cuts off (src/backend/cephfs-sessions.ts), against fake `client ls`
// listings: ceph-fuse sessions (recorded with their instance) and kernel-client ones (recorded by entity only), the
// other holders spared by entity and by instance, a session of the node nobody recorded found, a node sharing its
// entity with another holder refused, and every hostile ledger value refused. Also what a node records for its client.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { SharedVolumes } from '../../src/backend/cephfs.js';
import { KernelCephClient } from '../../src/backend/cephfs-kernel.js';
import { parseSharedClient, selectFenceTargets, sharedClientRecord } from '../../src/backend/cephfs-sessions.js';
import { LatchError } from '../../src/errors.js';
import type { MdsSession } from '../../src/sys/cephfs.js';

const PATH = '/volumes/latch/v1/0f5e1a3c-4b2d-4c1e-9a7b-1d2e3f405162';
let nextId = 4100;
const session = (entity: string, address: string, root = PATH): MdsSession => ({ mds: 'a', id: nextId++, address, entity, root });

// node-a: ceph-fuse, recorded; a second ceph-fuse of node-a on the same volume that nobody recorded; node-b: the kernel
// client (entity only); node-c: ceph-fuse, recorded; a session on another volume; one on the file system's root.
const A = session('latch-node-a', '10.0.0.1:0/1001');
const A2 = session('latch-node-a', '10.0.0.1:0/1002', `${PATH}/sub`);
const B = session('latch-node-b', '10.0.0.2:0/2001');
const C = session('latch-node-c', '10.0.0.3:0/3001');
const OTHER = session('latch-node-a', '10.0.0.1:0/1003', '/volumes/latch/v10/6c1f2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b');
const ROOT = session('admin', '10.0.0.9:0/9001', '/');
const ALL = [A, A2, B, C, OTHER, ROOT];

const select = (sessions: MdsSession[], known: string[], spare: string[]) => selectFenceTargets('v1', 'latch', sessions, known, spare);
const refused = (pattern: RegExp) => (err: unknown) => err instanceof LatchError && pattern.test(err.message);

describe('the sessions a fence of a shared volume cuts off', () => {
  it("takes the node's recorded instance and its unrecorded session, sparing ceph-fuse and kernel holders", () => {
    const targets = select(ALL, ['entity:latch-node-a@10.0.0.1:0/1001'], ['entity:latch-node-b', 'entity:latch-node-c@10.0.0.3:0/3001']);
    assert.deepEqual(targets, ['10.0.0.1:0/1001', '10.0.0.1:0/1002']);
  });

  it('finds a node whose record is missing or wrong by its sessions on the volume', () => {
    const spare = ['entity:latch-node-b', 'entity:latch-node-c@10.0.0.3:0/3001'];
    assert.deepEqual(select(ALL, [], spare), ['10.0.0.1:0/1001', '10.0.0.1:0/1002']);
    // A stale instance (the ceph-fuse it names is gone) is blocklisted too: it costs nothing.
    assert.deepEqual(select(ALL, ['10.0.0.1:0/999'], spare), ['10.0.0.1:0/1001', '10.0.0.1:0/1002', '10.0.0.1:0/999']);
  });

  it('fences a kernel-client node, recorded by its entity only', () => {
    assert.deepEqual(select(ALL, ['entity:latch-node-b'], ['entity:latch-node-a@10.0.0.1:0/1001', 'entity:latch-node-c']), [
      '10.0.0.2:0/2001',
    ]);
  });

  it('spares holders recorded the old way, by bare instance, and their entity with it', () => {
    // node-c recorded only its instance: its entity is read from the MDS, so a second session of it is spared too.
    const C2 = session('latch-node-c', '10.0.0.3:0/3002');
    assert.deepEqual(select([...ALL, C2], ['10.0.0.1:0/1001'], ['10.0.0.3:0/3001', 'entity:latch-node-b']), [
      '10.0.0.1:0/1001',
      '10.0.0.1:0/1002',
    ]);
  });

  it("takes a session nobody holds (another identity's mount of the volume), but not the volume's neighbours", () => {
    const stranger = session('someone', '10.0.0.7:0/7001');
    const parent = session('someone', '10.0.0.7:0/7002', '/volumes/latch/v1');
    assert.deepEqual(select([...ALL, stranger, parent], ['entity:latch-node-a'], ['entity:latch-node-b', 'entity:latch-node-c']), [
      '10.0.0.1:0/1001',
      '10.0.0.1:0/1002',
      '10.0.0.7:0/7001',
      '10.0.0.7:0/7002',
    ]);
  });

  it('finds nothing where nothing of the node is on the volume (the caller then fails closed)', () => {
    assert.deepEqual(select([B, C, OTHER, ROOT], ['entity:latch-node-a'], ['entity:latch-node-b', 'entity:latch-node-c']), []);
  });

  it('refuses a node that shares its entity with another holder, recorded or shown by the MDS', () => {
    const shares = refused(/shares its cephx identity \(client\.latch-node-a\)/);
    assert.throws(() => select(ALL, ['entity:latch-node-a'], ['entity:latch-node-a@10.0.0.1:0/1002']), shares);
    // Neither side recorded the entity: the MDS shows both instances as latch-node-a.
    assert.throws(() => select(ALL, ['10.0.0.1:0/1001'], ['10.0.0.1:0/1002']), shares);
  });

  it('refuses an instance recorded both for the node and for another holder', () => {
    assert.throws(
      () => select(ALL, ['entity:latch-node-a@10.0.0.2:0/2001'], ['entity:latch-node-b@10.0.0.2:0/2001']),
      refused(/both for the node to fence and for another holder/),
    );
  });

  it('refuses a session of the volume it would cut off but cannot name (no IPv4 instance, a zero nonce)', () => {
    for (const address of ['', '10.0.0.5:0/0']) {
      assert.throws(() => select([...ALL, session('x', address)], [], ['entity:latch-node-b']), refused(/name no single client instance/));
    }
    // Another holder's such session is spared by its entity, and the fence goes on.
    assert.deepEqual(select([A, session('latch-node-b', '')], [], ['entity:latch-node-b']), ['10.0.0.1:0/1001']);
  });

  it('refuses every hostile recorded form, on either side', () => {
    const hostile = [
      '',
      'entity:',
      'entity:@10.0.0.1:0/1001',
      'entity:latch node',
      'entity:latch-node-a@',
      'entity:latch-node-a@10.0.0.1:0/0',
      'entity:latch-node-a@10.0.0.1',
      'entity:latch-node-a@10.0.0.1:0/1@x',
      'entity:a/../b',
      'entity:latch-node-a;rm -rf /',
      `entity:${'a'.repeat(300)}`,
      'client.latch-node-a',
      '10.0.0.0/8',
      '10.0.0.1',
      '10.0.0.1:0/0',
      '10.0.0.1:0/1001\n',
      'ENTITY:latch-node-a',
      // Not a string at all: the ledger's documents are JSON another node wrote.
      42 as unknown as string,
      { entity: 'latch-node-a' } as unknown as string,
    ];
    for (const value of hostile) {
      assert.throws(() => select(ALL, [value], []), refused(/cannot be named/), `known ${JSON.stringify(value)}`);
      assert.throws(() => select(ALL, ['entity:latch-node-a'], [value]), refused(/cannot be named/), `spare ${JSON.stringify(value)}`);
      assert.throws(() => parseSharedClient('v1', value), LatchError);
    }
  });

  it('reads the forms a node records', () => {
    assert.deepEqual(parseSharedClient('v1', 'entity:latch-node-a'), { entity: 'latch-node-a', address: undefined });
    assert.deepEqual(parseSharedClient('v1', 'entity:latch.node_a@10.0.0.1:0/1001'), {
      entity: 'latch.node_a',
      address: '10.0.0.1:0/1001',
    });
    assert.deepEqual(parseSharedClient('v1', '10.0.0.1:0/1001'), { entity: undefined, address: '10.0.0.1:0/1001' });
  });
});

describe('what a node records for its client of a shared volume', () => {
  const dir = mkdtempSync(join(tmpdir(), 'latch-cephfs-record-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('entity:ID, with the instance where the client named one', () => {
    assert.equal(sharedClientRecord('latch-node-a', undefined), 'entity:latch-node-a');
    assert.equal(sharedClientRecord('latch-node-a', '10.0.0.1:0/1001'), 'entity:latch-node-a@10.0.0.1:0/1001');
    assert.equal(sharedClientRecord('latch-node-a', '10.0.0.1:0/0'), 'entity:latch-node-a', 'no zero nonce');
  });

  it('the kernel client (no admin socket) records its entity, so that its node can be fenced', async () => {
    const identity = { cephConf: '/etc/ceph/ceph.conf', clientId: 'latch-node-k', keyring: join(dir, 'keyring') };
    const cephfs = { fsName: 'cephfs', group: 'latch', client: 'kernel' as const, mountDir: dir };
    const client = new KernelCephClient({
      identity,
      fsName: 'cephfs',
      mountDir: dir,
      timeoutMs: 1000,
      mountTable: () => Promise.resolve([]),
    });
    const shared = new SharedVolumes({ identity, cephfs, client, maxSize: 1 << 30, timeoutMs: 1000 });
    assert.equal(await shared.clientOf('v1'), 'entity:latch-node-k');
    // A ceph-fuse mount notes its instance beside the volume; a hostile note is ignored, the entity stays.
    writeFileSync(join(dir, 'v1.client'), '10.0.0.1:0/1001\n');
    assert.equal(await shared.clientOf('v1'), 'entity:latch-node-k@10.0.0.1:0/1001');
    writeFileSync(join(dir, 'v1.client'), 'entity:evil@10.0.0.1:0/1001\n');
    assert.equal(await shared.clientOf('v1'), 'entity:latch-node-k');
  });
});
