// One node at a glance: `latch node check`, and `--node` on `ticket list` and `volume list`, called as functions over
// an in-memory ledger that holds a volume in each situation a node can be in.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { printingIO, type PrintingIO } from '../fixtures/printing-io.js';
import { nodeCheck } from '../../src/cli/node/check.js';
import { ticketList } from '../../src/cli/ticket/list.js';
import { volumeList } from '../../src/cli/volume/list.js';
import { parseConfig } from '../../src/config.js';
import { createContext } from '../../src/context.js';
import { LatchError } from '../../src/errors.js';
import { ticketId } from '../../src/ledger/ids.js';
import type { TicketType, VolumeDoc } from '../../src/ledger/types.js';
import { defined } from '../fixtures/defined.js';
import { MemoryStore } from '../fixtures/memory-store.js';

let work: string;
let io: PrintingIO;

const SPEC = { sizeBytes: 64 * 1024 * 1024, fsType: 'ext4' } as const;
const id = (type: TicketType, volume: string, node: string) => ticketId(type, volume, 'latch/loop', node);

/**
 * The ledger:
 * - granted-b: an admin ticket for node-b, granted (node-b has not touched the device); node-c waits on it too;
 * - attached-c: a workload ticket for node-c, which has the device;
 * - detaching-d: node-d had it, its ticket is gone (force-detached), it has not confirmed the release;
 * - attached-e: node-e's, which must not show for the other nodes.
 */
before(async () => {
  work = mkdtempSync(join(tmpdir(), 'latch-cli-node-'));
  const raw = { nodeName: 'node-a', stateDir: join(work, 'state'), poolDir: join(work, 'pool') };
  writeFileSync(join(work, 'config.json'), JSON.stringify(raw));
  const store = new MemoryStore();
  const context = () => createContext(parseConfig(raw, 'test'), { store });
  io = printingIO(join(work, 'config.json'), context);

  const { ledger } = context();
  const ask = (volume: string, node: string, type: TicketType, requestedBy: VolumeDoc['spec']['tickets'][string]['requestedBy']) =>
    ledger.addTicket(volume, { id: id(type, volume, node), type, nodeID: node, parameters: { readOnly: false }, requestedBy }, SPEC);
  const attach = async (volume: string, node: string) => {
    assert.ok(await ledger.claimGrant(volume, node));
    assert.ok(await ledger.recordDevice(volume, node, '/dev/loop3'));
  };

  await ask('granted-b', 'node-b', 'admin', { admin: true });
  await ask('granted-b', 'node-c', 'workload', { pvName: 'pv-granted-b' });
  await ask('attached-c', 'node-c', 'workload', { pvName: 'pv-c', pod: { name: 'web', namespace: 'shop' } });
  await attach('attached-c', 'node-c');
  await ask('detaching-d', 'node-d', 'workload', { pvName: 'pv-d' });
  await attach('detaching-d', 'node-d');
  await ledger.removeTicket('detaching-d', id('workload', 'detaching-d', 'node-d'));
  await ask('attached-e', 'node-e', 'workload', { pvName: 'pv-e' });
  await attach('attached-e', 'node-e');

  const states = Object.fromEntries((await ledger.list()).docs.map((d) => [d.name, d.status.nodes]));
  assert.deepEqual(
    Object.fromEntries(Object.entries(states).map(([v, nodes]) => [v, Object.entries(nodes).map(([n, e]) => `${n}:${e.phase}`)])),
    {
      'granted-b': ['node-b:granted'],
      'attached-c': ['node-c:attached'],
      'detaching-d': ['node-d:detaching'],
      'attached-e': ['node-e:attached'],
    },
    'the ledger is set up as the cases need',
  );
});
after(() => {
  rmSync(work, { recursive: true, force: true });
});

interface CheckJson {
  node: string;
  mayGo: boolean;
  volumes: {
    volume: string;
    hold?: { phase: string; since: string; readOnly: boolean; device?: string; clearedBy: string };
    tickets: { id: string; shortId: string; type: string; requestedBy: string; satisfied: boolean; clearedBy: string }[];
  }[];
}

async function checkJson(node: string): Promise<{ code: number; check: CheckJson }> {
  const code = await nodeCheck({ node, output: 'json' }, io);
  return { code, check: JSON.parse(io.take()) as CheckJson };
}

describe('latch node check', () => {
  test('a node no volume names may go: exit 0', async () => {
    assert.equal(await nodeCheck({ node: 'node-z', output: 'table' }, io), 0);
    assert.equal(io.take(), 'node node-z may be drained or deleted: no volume has a ticket for it or lists it\n');
    assert.deepEqual(await checkJson('node-z'), { code: 0, check: { node: 'node-z', mayGo: true, volumes: [], damaged: [] } });
  });

  test('a granted admin ticket keeps the node: the ticket, who asked, and the ticket remove that clears it', async () => {
    const { code, check } = await checkJson('node-b');
    assert.equal(code, 1);
    assert.equal(check.mayGo, false);
    const [tie, ...more] = check.volumes;
    assert.deepEqual(more, [], 'only the volume that names node-b');
    const ticketOfB = id('admin', 'granted-b', 'node-b');
    const since = defined(tie?.hold?.since, 'since');
    assert.match(since, /^\d{4}-\d\d-\d\dT/);
    assert.deepEqual(defined(tie), {
      volume: 'granted-b',
      hold: {
        phase: 'granted',
        since,
        readOnly: false,
        clearedBy: "goes with the node's tickets (node-b has not touched the device)",
      },
      tickets: [
        {
          id: ticketOfB,
          shortId: `${ticketOfB.slice(0, 'admin-'.length + 12)}...`,
          type: 'admin',
          requestedBy: 'admin',
          satisfied: true,
          clearedBy: `latch ticket remove granted-b ${ticketOfB.slice(0, 'admin-'.length + 12)}`,
        },
      ],
    });

    assert.equal(await nodeCheck({ node: 'node-b', output: 'table' }, io), 1);
    const text = io.take();
    assert.match(text, /^node node-b may not be drained or deleted yet: 1 volume\(s\) still name it\n/);
    assert.match(text, /^volume granted-b: granted since \S+; 1 ticket\(s\)$/m);
    assert.match(text, new RegExp(`^  ticket ${ticketOfB.slice(0, 18)}\\.\\.\\. admin, requested by admin$`, 'm'));
    assert.match(text, /^ {4}cleared by: latch ticket remove granted-b admin-[0-9a-f]{12}$/m);
  });

  test('an attached node: its volume with the device, its workload ticket and what lets go; a waiting ticket too', async () => {
    const { code, check } = await checkJson('node-c');
    assert.equal(code, 1);
    assert.deepEqual(
      check.volumes.map((v) => [v.volume, v.hold?.phase, v.tickets.map((t) => `${t.type} ${t.requestedBy} satisfied=${t.satisfied}`)]),
      [
        ['attached-c', 'attached', ['workload pv pv-c pod shop/web satisfied=true']],
        ['granted-b', undefined, ['workload pv pv-granted-b satisfied=false']],
      ],
    );
    const attached = defined(check.volumes[0]);
    assert.equal(attached.hold?.device, '/dev/loop3');
    assert.match(defined(attached.hold).clearedBy, /node-c must unmount the volume/);
    assert.match(
      defined(attached.tickets[0]).clearedBy,
      /the pod leaving node-c .*latch volume release attached-c --node node-c --node-is-down$/,
    );

    assert.equal(await nodeCheck({ node: 'node-c', output: 'table' }, io), 1);
    const text = io.take();
    assert.match(text, /^volume granted-b: not granted \(tickets only\); 1 ticket\(s\)$/m);
    assert.match(text, /^volume attached-c: attached since \S+ \(device \/dev\/loop3\); 1 ticket\(s\)$/m);
    assert.match(text, /^ {2}ticket workload-[0-9a-f]{12}\.\.\. workload, requested by pv pv-granted-b, not satisfied$/m);
  });

  test('a detaching node with no tickets (force-detached) may not go until it unmounts or is declared down', async () => {
    const { code, check } = await checkJson('node-d');
    assert.equal(code, 1);
    assert.deepEqual(
      check.volumes.map((v) => [v.volume, v.hold?.phase, v.tickets.length]),
      [['detaching-d', 'detaching', 0]],
    );
    assert.equal(
      check.volumes[0]?.hold?.clearedBy,
      'node-d must unmount the volume and release its device (unmountdevice or unmount confirms it; ' +
        'latch agent on node-d does it once node-d has no device of it); ' +
        'if node-d is down for good: latch volume release detaching-d --node node-d --node-is-down',
    );
    await nodeCheck({ node: 'node-d', output: 'table' }, io);
    assert.match(
      io.take(),
      /^volume detaching-d: detaching since \S+ \(device \/dev\/loop3\); no tickets\n {2}detaching: node-d must unmount/m,
    );
  });

  test("another node's volumes are not shown", async () => {
    for (const node of ['node-b', 'node-c', 'node-d']) {
      const { check } = await checkJson(node);
      assert.ok(!check.volumes.some((v) => v.volume === 'attached-e'), node);
    }
    const { check } = await checkJson('node-e');
    assert.deepEqual(
      check.volumes.map((v) => v.volume),
      ['attached-e'],
    );
  });
});

describe('--node on ticket list and volume list', () => {
  test("ticket list --node shows only that node's tickets, of all volumes or of one", async () => {
    await ticketList({ node: 'node-c', output: 'json' }, io);
    const rows = JSON.parse(io.take()) as { volume: string; nodeID: string }[];
    assert.deepEqual(
      rows.map((r) => [r.volume, r.nodeID]),
      [
        ['attached-c', 'node-c'],
        ['granted-b', 'node-c'],
      ],
    );
    await ticketList({ volume: 'granted-b', node: 'node-b', output: 'table' }, io);
    const table = io.take().split('\n');
    assert.equal(table.length, 3, 'heading, one row, final newline');
    assert.match(defined(table[1]), /^granted-b +admin-[0-9a-f]{12}\.\.\. +admin \(1000\) +node-b +rw +yes +- +admin/);
    await ticketList({ node: 'node-d', output: 'json' }, io);
    assert.deepEqual(JSON.parse(io.take()), [], 'node-d lost its ticket');
  });

  test('volume list --node shows the volumes the node holds in any phase or has tickets for', async () => {
    const names = async (node: string) => {
      await volumeList({ node, output: 'json' }, io);
      return (JSON.parse(io.take()) as VolumeDoc[]).map((d) => d.name);
    };
    assert.deepEqual(await names('node-b'), ['granted-b']);
    assert.deepEqual(await names('node-c'), ['attached-c', 'granted-b']);
    assert.deepEqual(await names('node-d'), ['detaching-d']);
    assert.deepEqual(await names('node-z'), []);
    await volumeList({ node: 'node-d', output: 'table' }, io);
    assert.match(io.take(), /^NAME .*\ndetaching-d +- +64Mi +\(ext4\) +detaching +node-d\(detaching\) +0\n$/);
  });

  test('a bad node name is refused before anything is read', async () => {
    const refusals: [string, RegExp][] = [
      ['Node_B', /^node name "Node_B" is not allowed/],
      ['../etc', /^node name "\.\.\/etc" is not allowed/],
      ['', /^node name is empty$/],
      ['a'.repeat(254), /^node name is 254 characters long; the limit is 253$/],
    ];
    for (const [node, message] of refusals) {
      const refused = (err: unknown) => err instanceof LatchError && message.test(err.message);
      await assert.rejects(nodeCheck({ node, output: 'table' }, io), refused, JSON.stringify(node));
      await assert.rejects(ticketList({ node, output: 'table' }, io), refused);
      await assert.rejects(volumeList({ node, output: 'json' }, io), refused);
    }
    assert.equal(io.take(), '');
  });
});
