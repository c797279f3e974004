import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { podTicketId, ticketId } from '../../src/ledger/ids.js';
import { withVolumeLock } from '../../src/node/lock.js';
import { podKeyOf, stagingPath } from '../../src/node/staging.js';
import { hasCapability, parseCapEff } from '../../src/sys/capabilities.js';
import { LatchError } from '../../src/errors.js';
import { Ledger } from '../../src/ledger/ledger.js';
import { awayFromHome, reachesHome } from '../../src/node/home.js';
import { MemoryStore } from '../fixtures/memory-store.js';

describe('pod keys and pod tickets (non-attach mode)', () => {
  it("takes the pod UID from kubelet's pod volume dir, else the whole path", () => {
    assert.equal(podKeyOf('/var/lib/kubelet/pods/1b2c-33/volumes/latch~loop/pv-1'), '1b2c-33');
    assert.equal(podKeyOf('/other/kubelet/pods/u/volumes/latch~loop/pv'), 'u');
    assert.equal(podKeyOf('/mnt/somewhere/pv-1'), '/mnt/somewhere/pv-1');
    assert.equal(podKeyOf('/var/lib/kubelet/pods/u/volumes/latch~loop/pv/extra'), '/var/lib/kubelet/pods/u/volumes/latch~loop/pv/extra');
  });

  it("gives one deterministic workload ticket per pod, never equal to attach mode's node ticket", () => {
    const a = podTicketId('pv-1', 'latch/loop', 'node-a', 'uid-1');
    assert.equal(a, podTicketId('pv-1', 'latch/loop', 'node-a', 'uid-1'));
    assert.match(a, /^workload-[0-9a-f]{64}$/);
    assert.notEqual(a, podTicketId('pv-1', 'latch/loop', 'node-a', 'uid-2'));
    assert.notEqual(a, podTicketId('pv-1', 'latch/loop', 'node-b', 'uid-1'));
    assert.notEqual(a, ticketId('workload', 'pv-1', 'latch/loop', 'node-a'));
  });

  it('keeps staging mounts node-private under stateDir', () => {
    assert.equal(stagingPath({ stateDir: '/var/lib/latch/state', nodeName: 'node-a' }, 'pv-1'), '/var/lib/latch/state/staging/node-a/pv-1');
    assert.notEqual(stagingPath({ stateDir: '/s', nodeName: 'node-a' }, 'v'), stagingPath({ stateDir: '/s', nodeName: 'node-b' }, 'v'));
  });
});

describe('capabilities', () => {
  it('reads CapEff and tests CAP_SYS_RESOURCE (bit 24)', () => {
    const without = parseCapEff('Name:\tnode\nCapInh:\t0000000000000000\nCapEff:\t000001fffeffffff\nCapBnd:\t000001ffffffffff\n');
    assert.equal(without, 0x1fffeffffffn);
    assert.equal(hasCapability(without, 24), false);
    assert.equal(hasCapability(without, 21), true); // CAP_SYS_ADMIN
    const full = parseCapEff('CapEff:\t000001ffffffffff\n');
    assert.equal(full, 0x1ffffffffffn);
    assert.equal(hasCapability(full, 24), true);
    assert.equal(parseCapEff('no such line'), undefined);
  });
});

describe('the node-local volume lock', () => {
  const config = { stateDir: `/tmp/latch-lock-test-${process.pid}`, nodeName: 'node-a' };

  it('serialises holders of the same volume and lets other volumes and nodes through', async () => {
    const order: string[] = [];
    // The second holder asks only once the first is in: a fixed sleep lost that race on a loaded machine.
    let firstIn!: () => void;
    const entered = new Promise<void>((r) => (firstIn = r));
    const first = withVolumeLock(config, 'v', async () => {
      order.push('first in');
      firstIn();
      // Other volumes and other nodes are not blocked meanwhile.
      await withVolumeLock(config, 'w', async () => order.push('other volume'), 1000);
      await withVolumeLock({ ...config, nodeName: 'node-b' }, 'v', async () => order.push('other node'), 1000);
      await sleep(150);
      order.push('first out');
    });
    await entered;
    const second = withVolumeLock(config, 'v', async () => order.push('second'));
    await Promise.all([first, second]);
    assert.deepEqual(order, ['first in', 'other volume', 'other node', 'first out', 'second']);
  });

  it('gives up with a LatchError after the wait, and frees the lock when fn throws', async () => {
    let release!: () => void;
    let heldIn!: () => void;
    const entered = new Promise<void>((r) => (heldIn = r));
    const held = withVolumeLock(config, 'x', () => {
      heldIn();
      return new Promise<void>((r) => (release = r));
    });
    await entered;
    await assert.rejects(
      withVolumeLock(config, 'x', async () => 1, 100),
      (err: unknown) => {
        assert.ok(err instanceof LatchError);
        assert.match(err.message, /another latch call .* volume x on node node-a/);
        return true;
      },
    );
    release();
    await held;
    await assert.rejects(
      withVolumeLock(config, 'x', async () => {
        throw new Error('boom');
      }),
      /boom/,
    );
    assert.equal(await withVolumeLock(config, 'x', async () => 42, 100), 42);
  });
});

describe("a node-local volume's home (node/home.ts)", () => {
  const view = (nodeName: string, localPool: string | undefined, oneHost?: boolean) => ({
    config: { nodeName, ...(oneHost !== undefined && { oneHost }) },
    backend: { localPool },
  });

  it('is recorded once: a second node racing to record its own keeps the first, and is then refused', async () => {
    const ledger = new Ledger(new MemoryStore());
    await ledger.createVolume('vol', { sizeBytes: 1024, fsType: 'ext4' });
    assert.equal((await ledger.recordHome('vol', 'node-a', '/pool/a'))?.status.home?.node, 'node-a');
    const after = await ledger.recordHome('vol', 'node-b', '/pool/b');
    assert.deepEqual([after?.status.home?.node, after?.status.home?.pool], ['node-a', '/pool/a']);
    assert.match(awayFromHome(view('node-b', '/pool/b'), after, 'node-b') ?? '', /lives on node node-a .* not on node node-b/);
    assert.equal(awayFromHome(view('node-a', '/pool/a'), after, 'node-a'), undefined);
    assert.equal(await ledger.recordHome('missing', 'node-a', '/pool/a'), undefined, 'no document, nothing recorded');
  });

  it('is reached by its node, by this node under oneHost with the same pool, and always on shared storage', () => {
    const home = { node: 'node-a', pool: '/pool', since: '2026-11-27T00:00:00.000Z' };
    assert.equal(reachesHome(view('node-b', '/pool'), home, 'node-b'), false, 'same path, but not declared one host');
    assert.equal(reachesHome(view('node-b', '/pool', true), home, 'node-b'), true);
    assert.equal(reachesHome(view('node-b', '/other', true), home, 'node-b'), false, 'one host, another pool');
    assert.equal(reachesHome(view('node-a', '/pool', true), home, 'node-c'), false, "another node's pool is not known here");
    assert.equal(reachesHome(view('node-b', undefined), home, 'node-b'), true, 'rbd: no home');
    assert.equal(reachesHome(view('node-b', '/pool'), undefined, 'node-b'), true, 'no home recorded yet');
  });
});
