// The Ledger's job methods on a real FileStore: each one a compare-and-swap write, refusals as LatchErrors, repeats
// that change nothing write nothing (the revision stays), and racing requesters of the same job find one ticket.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { LatchError } from '../../src/errors.js';
import { finishedJob, isSatisfied, jobTicketsOfNode, type JobRequest } from '../../src/ledger/arbitrate.js';
import { jobTicketId } from '../../src/ledger/ids.js';
import { volumeKey } from '../../src/ledger/keys.js';
import { Ledger } from '../../src/ledger/ledger.js';
import { FileStore } from '../../src/store/file.js';
import { defined } from '../fixtures/defined.js';

let work: string;
let n = 0;
before(() => {
  work = mkdtempSync(join(tmpdir(), 'latch-ledger-jobs-'));
});
after(() => rmSync(work, { recursive: true, force: true }));

/** A ledger on a fresh file store, with a clock the test moves. */
function ledgerAt(): { ledger: Ledger; store: FileStore; tick: () => void } {
  const store = new FileStore(join(work, `state-${++n}`));
  let t = Date.parse('2026-11-23T10:00:00.000Z');
  const ledger = new Ledger(store, () => new Date(t).toISOString());
  return { ledger, store, tick: () => (t += 1000) };
}
const revision = async (store: FileStore, volume: string): Promise<number | undefined> => (await store.get(volumeKey(volume)))?.revision;

const snapshotJob = (volume: string, name: string, node: string): JobRequest => ({
  id: jobTicketId('snapshot', volume, name),
  type: 'snapshot',
  nodeID: node,
  parameters: { readOnly: true, disableFrontend: true },
  job: { kind: 'snapshot', snapshot: name },
  requestedBy: { admin: true },
});

describe('Ledger job methods (file store)', () => {
  it('requestJob creates the volume when asked to, and a repeat writes nothing', async () => {
    const { ledger, store, tick } = ledgerAt();
    const restore: JobRequest = {
      id: jobTicketId('restore', 'new', 'b1'),
      type: 'restore',
      nodeID: 'node-a',
      parameters: { readOnly: false, disableFrontend: true },
      job: { kind: 'restore', backup: 'b1' },
      requestedBy: { admin: true },
    };
    assert.equal(await ledger.requestJob('new', restore), undefined, 'no volume, no create: nothing');
    assert.equal(await store.get(volumeKey('new')), undefined);
    const doc = await ledger.requestJob('new', restore, { sizeBytes: 1 << 20, fsType: 'ext4' });
    assert.equal(doc?.spec.sizeBytes, 1 << 20);
    assert.equal(isSatisfied(defined(doc, 'the volume'), restore.id), true);
    const rev = await revision(store, 'new');
    tick();
    await ledger.requestJob('new', restore, { sizeBytes: 1 << 20, fsType: 'ext4' });
    assert.equal(await revision(store, 'new'), rev, 'the same request again: no write');
    await assert.rejects(
      ledger.requestJob('new', { ...restore, job: { kind: 'restore', backup: 'b2' } }),
      (err: unknown) => err instanceof LatchError && /a job named restore-.* is already asked for on volume new/.test(err.message),
    );
  });

  it('start, record, finish: the outcome stays in status.jobs and the ticket goes in the same write', async () => {
    const { ledger, store, tick } = ledgerAt();
    await ledger.createVolume('v', { sizeBytes: 1 << 20, fsType: 'ext4' });
    const req = snapshotJob('v', 's1', 'node-a');
    await ledger.requestJob('v', req);
    await assert.rejects(ledger.startJob('v', req.id, 'node-b'), /is for node node-a, not node-b/);
    await assert.rejects(ledger.startJob('v', 'snapshot-nope', 'node-a'), /has no job ticket/);
    await assert.rejects(ledger.startJob('gone', req.id, 'node-a'), /volume gone does not exist/);
    tick();
    let doc = await ledger.startJob('v', req.id, 'node-a');
    assert.equal(doc?.status.tickets[req.id]?.job?.state, 'running');
    assert.deepEqual(
      jobTicketsOfNode(defined(doc, 'the volume'), 'node-a').map((t) => t.id),
      [req.id],
    );
    tick();
    doc = await ledger.recordJob('v', req.id, { state: 'succeeded', message: 'snapshot s1 taken', result: { name: 's1' } });
    const rev = await revision(store, 'v');
    tick();
    await ledger.recordJob('v', req.id, { state: 'succeeded', message: 'snapshot s1 taken', result: { name: 's1' } });
    assert.equal(await revision(store, 'v'), rev, 'the same record again: no write');
    tick();
    doc = await ledger.finishJob('v', req.id);
    assert.equal(doc?.spec.tickets[req.id], undefined);
    assert.equal(doc?.status.state, 'detached');
    assert.deepEqual(finishedJob(defined(doc, 'the volume'), req.id)?.status.result, { name: 's1' });
    const stored = (await store.get(volumeKey('v')))?.value as typeof doc;
    assert.deepEqual(stored, doc, 'what the requester reads is what is stored');
    const after = await revision(store, 'v');
    assert.equal(await ledger.finishJob('v', req.id).then(() => revision(store, 'v')), after, 'finishing again: no write');
  });

  it('endJob of an unstarted job finishes it at once', async () => {
    const { ledger } = ledgerAt();
    await ledger.createVolume('v', { sizeBytes: 1 << 20, fsType: 'ext4' });
    const manual: JobRequest = {
      id: jobTicketId('manual', 'v', 'manual'),
      type: 'manual',
      nodeID: 'node-a',
      parameters: { readOnly: false, disableFrontend: true },
      job: { kind: 'attach' },
      requestedBy: { admin: true },
    };
    await ledger.requestJob('v', manual);
    const doc = await ledger.endJob('v', manual.id);
    assert.equal(doc?.spec.tickets[manual.id], undefined);
    assert.equal(finishedJob(defined(doc, 'the volume'), manual.id)?.status.state, 'ending');
  });

  it('racing requesters of the same job (two agents for one recurring slot) end with one ticket', async () => {
    const { ledger } = ledgerAt();
    await ledger.createVolume('v', { sizeBytes: 1 << 20, fsType: 'ext4' });
    const other = new Ledger(ledger.store);
    const req = snapshotJob('v', 'hourly-0900', 'node-a');
    await Promise.all(Array.from({ length: 8 }, (_, i) => (i % 2 ? ledger : other).requestJob('v', req)));
    const doc = await ledger.get('v');
    assert.deepEqual(Object.keys(doc!.spec.tickets), [req.id]);
    assert.equal(doc!.spec.generationCounter, 1, 'added once');
  });
});
