// The admin commands as plain functions: each is called with typed options and a CommandIO (a captured sink, its
// own configuration, a context factory), without commander or a child process. Volumes live in a temporary pool
// (sparse image files; no loop device is set up, so no root is needed).
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { printingIO, type PrintingIO } from '../fixtures/printing-io.js';
import { ledgerMigrate } from '../../src/cli/ledger/migrate.js';
import { ticketAdd } from '../../src/cli/ticket/add.js';
import { ticketList } from '../../src/cli/ticket/list.js';
import { ticketRemove } from '../../src/cli/ticket/remove.js';
import { version } from '../../src/cli/version.js';
import { volumeAllow } from '../../src/cli/volume/allow.js';
import { volumeCreate } from '../../src/cli/volume/create.js';
import { volumeDelete } from '../../src/cli/volume/delete.js';
import { volumeInspect } from '../../src/cli/volume/inspect.js';
import { volumeList } from '../../src/cli/volume/list.js';
import { volumeRelease } from '../../src/cli/volume/release.js';
import { volumeUnlink } from '../../src/cli/volume/unlink.js';
import { configOf } from '../../src/cli/io.js';
import type { VolumeDoc } from '../../src/ledger/types.js';
import { defined } from '../fixtures/defined.js';

let work: string;
let n = 0;

before(() => {
  work = mkdtempSync(join(tmpdir(), 'latch-cli-commands-'));
});
after(() => {
  rmSync(work, { recursive: true, force: true });
});

interface Node extends PrintingIO {
  dir: string;
}

/** A node with its own configuration in a fresh directory (maxSize 1Gi), printing into a buffer. */
function node(overrides: Record<string, unknown> = {}): Node {
  const dir = join(work, `node-${++n}`);
  const config = join(`${dir}.json`);
  writeFileSync(
    config,
    JSON.stringify({ nodeName: 'node-a', stateDir: join(dir, 'state'), poolDir: join(dir, 'pool'), maxSize: '1Gi', ...overrides }),
  );
  return { dir, ...printingIO(config) };
}

describe('volume and ticket commands, called as functions', () => {
  test('allow: PV names and namespaces added and removed, shown by list and inspect; bad names refused', async () => {
    const io = node();
    await volumeCreate({ name: 'data', size: '64Mi', output: 'table' }, io);
    io.take();
    await volumeAllow({ name: 'data', pv: ['pv-2', 'pv-1'], namespace: ['shop'] }, io);
    assert.equal(io.take(), 'volume data: no PV of its own (PV data only); also PVs pv-1, pv-2; also namespaces shop\n');
    await volumeList({ output: 'table' }, io);
    assert.match(io.take(), /\ndata +- \+3 +64Mi /);
    await volumeAllow({ name: 'data', pv: ['pv-2'], namespace: ['shop'], remove: true }, io);
    assert.equal(io.take(), 'volume data: no PV of its own (PV data only); also PVs pv-1\n');
    await volumeInspect({ name: 'data', output: 'table' }, io);
    assert.match(io.take(), /^Used by: +no PV of its own \(PV data only\); also PVs pv-1$/m);
    await volumeInspect({ name: 'data', output: 'json' }, io);
    assert.deepEqual((JSON.parse(io.take()) as VolumeDoc).spec.allowed, { pvs: ['pv-1'] });

    await assert.rejects(volumeAllow({ name: 'data' }, io), /name what to allow: --pv NAME and\/or --namespace NAMESPACE/);
    await assert.rejects(volumeAllow({ name: 'data', namespace: ['Shop'] }, io), /--namespace "Shop" is not a namespace name/);
    await assert.rejects(volumeAllow({ name: 'data', pv: ['../x'] }, io), /--pv "\.\.\/x" is not allowed/);
    await assert.rejects(volumeAllow({ name: 'nope', pv: ['pv-1'] }, io), /volume nope does not exist/);
  });

  test('unlink: removes a PV name alias; none is fine; a bad name is refused', async () => {
    const io = node();
    await io.context(configOf(io)).ledger.linkPv('pv-1', 'data');
    await volumeUnlink({ pv: 'pv-1' }, io);
    assert.equal(io.take(), 'PV name pv-1 no longer leads to volume data\n');
    await volumeUnlink({ pv: 'pv-1' }, io);
    assert.equal(io.take(), 'PV name pv-1 has no alias\n');
    await assert.rejects(volumeUnlink({ pv: 'Bad' }, io), /PV name "Bad" is not allowed/);
  });

  test('create, list, inspect, a ticket that blocks delete, remove it by prefix, delete', async () => {
    const io = node();
    await volumeCreate({ name: 'data', size: '64Mi', output: 'table' }, io);
    assert.equal(io.take(), 'volume data created (64Mi, ext4 on first mount)\n');
    assert.ok(existsSync(join(io.dir, 'pool/data.img')), 'the image is in the pool');
    await volumeCreate({ name: 'data', size: '64Mi', fsType: 'ext4', output: 'table' }, io);
    assert.match(io.take(), /^volume data already exists/);

    await volumeList({ output: 'table' }, io);
    assert.match(io.take(), /^NAME +PV +SIZE +FS +STATE +NODES +TICKETS\ndata +- +64Mi +\(ext4\) +detached +- +0\n$/);

    await ticketAdd({ volume: 'data', node: 'node-b', type: 'admin', readOnly: true, owner: 'alice' }, io);
    const added = /^ticket (admin-[0-9a-f]{64}) added: satisfied/.exec(io.take());
    assert.ok(added, 'the ticket is granted to node-b');
    const id = defined(added[1], 'the ticket id');

    await ticketList({ output: 'table' }, io);
    const table = io.take();
    assert.match(
      table,
      new RegExp(`^data +${id.slice(0, 'admin-'.length + 12)}\\.\\.\\. +admin \\(1000\\) +node-b +ro +yes +- +admin \\(alice\\) +- `, 'm'),
    );

    await volumeInspect({ name: 'data', output: 'json' }, io);
    const doc = JSON.parse(io.take()) as VolumeDoc;
    assert.deepEqual(Object.keys(doc.spec.tickets), [id]);

    await assert.rejects(volumeDelete({ name: 'data' }, io), /volume data is in use: 1 ticket\(s\), held by node-b; detach it first/);
    assert.ok(existsSync(join(io.dir, 'pool/data.img')), 'a refused delete keeps the image');

    await ticketRemove({ volume: 'data', ticket: id.slice(0, 10) }, io);
    assert.equal(io.take(), `ticket ${id} removed; volume data is detached\n`);
    await ticketRemove({ volume: 'data', ticket: 'admin-00' }, io);
    assert.equal(io.take(), 'volume data has no ticket admin-00; nothing to do\n');

    await volumeDelete({ name: 'data' }, io);
    assert.match(io.take(), /^volume data deleted, with its image in the pool \(.*\/pool\)\n$/);
    assert.equal(existsSync(join(io.dir, 'pool/data.img')), false);
    await volumeList({ output: 'json' }, io);
    assert.deepEqual(JSON.parse(io.take()), []);
  });

  test('refusals: above maxSize, a filesystem not allowed, a release without --node-is-down, a missing volume', async () => {
    const io = node({ allowedFsTypes: ['ext4'] });
    await assert.rejects(volumeCreate({ name: 'big', size: '2Gi', output: 'table' }, io), /--size 2Gi is above maxSize \(1Gi\)/);
    await assert.rejects(
      volumeCreate({ name: 'x', size: '1Mi', fsType: 'xfs', output: 'table' }, io),
      /--fs-type xfs is not allowed; allowed: ext4/,
    );
    await assert.rejects(volumeRelease({ name: 'x', node: 'node-b' }, io), /make sure the node is down, then repeat with --node-is-down/);
    await assert.rejects(volumeRelease({ name: 'x', node: 'node-b', nodeIsDown: true }, io), /volume x does not exist/);
    await assert.rejects(volumeRelease({ name: 'x', node: 'node-b', poweredOff: true }, io), /repeat with --node-is-down/);
    assert.equal(io.take(), '');
  });

  test('ledger migrate refuses the same store on both sides and etcd without endpoints', async () => {
    const io = node();
    await assert.rejects(ledgerMigrate({ from: 'file', to: 'file', output: 'table' }, io), /--from and --to must differ/);
    await assert.rejects(ledgerMigrate({ from: 'file', to: 'etcd', output: 'table' }, io), /no etcd endpoints: .* uses the file store/);
  });

  test('version prints one line', async () => {
    const io = node();
    assert.equal(await version({}, io), undefined);
    assert.equal(io.take(), 'dev\n');
  });
});
