// `latch ticket list` and `latch volume inspect` with job tickets: type with priority, the job and its state, the
// seeds' conditions (and the seed's attacher type in JSON), lastAttachedBy; `ticket add` refuses job types.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { printingIO, type PrintingIO } from '../fixtures/printing-io.js';
import { configOf } from '../../src/cli/io.js';
import { parseTicketType } from '../../src/cli/ticket/add.js';
import { ticketList } from '../../src/cli/ticket/list.js';
import { volumeCreate } from '../../src/cli/volume/create.js';
import { volumeInspect } from '../../src/cli/volume/inspect.js';
import { jobTicketId } from '../../src/ledger/ids.js';
import type { Condition, JobStatus } from '../../src/ledger/types.js';
import { defined } from '../fixtures/defined.js';

let work: string;
before(() => {
  work = mkdtempSync(join(tmpdir(), 'latch-cli-ticket-jobs-'));
});
after(() => rmSync(work, { recursive: true, force: true }));

/** A node's CommandIO printing into a buffer, with its own configuration (sparse images, no loop device). */
function node(): PrintingIO {
  const config = join(work, 'config.json');
  writeFileSync(config, JSON.stringify({ nodeName: 'node-a', stateDir: join(work, 'state'), poolDir: join(work, 'pool'), maxSize: '1Gi' }));
  return printingIO(config);
}

describe('ticket list and volume inspect with job tickets', () => {
  test('a running snapshot job: type (priority), job state, conditions; JSON carries them and the attacher type', async () => {
    const io = node();
    await volumeCreate({ name: 'data', size: '64Mi', output: 'table' }, io);
    io.take();
    const { ledger } = io.context(configOf(io));
    const id = jobTicketId('snapshot', 'data', 's1');
    await ledger.requestJob('data', {
      id,
      type: 'snapshot',
      nodeID: 'node-a',
      parameters: { readOnly: true, disableFrontend: true },
      job: { kind: 'snapshot', snapshot: 's1' },
      requestedBy: { admin: true },
    });
    await ticketList({ volume: 'data', output: 'table' }, io);
    const waiting = defined(io.take().split('\n')[1]);
    assert.match(
      waiting,
      /^data +snapshot-[0-9a-f]{12}\.\.\. +snapshot \(800\) +node-a +ro +yes +snapshot: not started +admin +- +Satisfied=True\(Attached\) +attached to node node-a$/,
    );

    await ledger.startJob('data', id, 'node-a');
    await ledger.claimGrant('data', 'node-a');
    await ledger.recordDevice('data', 'node-a', '/dev/loop42');
    await ledger.recordJob('data', id, { state: 'running', message: 'copying blocks' });
    await ticketList({ volume: 'data', output: 'table' }, io);
    assert.match(
      defined(io.take().split('\n')[1]),
      / +snapshot: running +admin +- +Satisfied=True\(Attached\) Job=Unknown\(Running\) +attached to node node-a; job: copying blocks$/,
    );

    await ticketList({ volume: 'data', output: 'json' }, io);
    const [row] = JSON.parse(io.take()) as {
      id: string;
      type: string;
      priority: number;
      attacherType: string;
      job: unknown;
      status: { conditions: Condition[]; job: JobStatus };
    }[];
    assert.equal(row?.id, id);
    assert.deepEqual([row?.type, row?.priority, row?.attacherType], ['snapshot', 800, 'snapshot-controller']);
    assert.deepEqual(row?.job, { kind: 'snapshot', snapshot: 's1' });
    assert.deepEqual(
      row?.status.conditions.map((c) => [c.type, c.status, c.reason, c.message]),
      [
        ['Satisfied', 'True', 'Attached', 'attached to node node-a'],
        ['Job', 'Unknown', 'Running', 'copying blocks'],
      ],
    );
    assert.deepEqual([row?.status.job.state, row?.status.job.attempts, row?.status.job.node], ['running', 1, 'node-a']);

    await volumeInspect({ name: 'data', output: 'table' }, io);
    const inspected = io.take();
    assert.match(inspected, /^Last attach: node node-a for snapshot ticket snapshot-[0-9a-f]{12}\.\.\. at \d{4}-/m);
    assert.match(inspected, /^ {4}job snapshot: running on node-a, attempt 1: copying blocks$/m);
    await volumeInspect({ name: 'data', output: 'json' }, io);
    assert.equal((JSON.parse(io.take()) as { status: { lastAttachedBy: { ticket: string } } }).status.lastAttachedBy.ticket, id);
  });

  test('ticket add --type takes reservations only: job types are made by their commands', () => {
    for (const type of ['admin', 'maintenance', 'workload', 'restore']) assert.equal(parseTicketType(type), type);
    assert.throws(
      () => parseTicketType('snapshot'),
      /--type snapshot: snapshot tickets carry a job .* made by `latch snapshot create`, not by ticket add/,
    );
    assert.throws(() => parseTicketType('backup'), /`latch backup create`/);
    assert.throws(() => parseTicketType('clone'), /`latch volume clone`/);
    assert.throws(() => parseTicketType('manual'), /`latch volume attach`/);
    assert.throws(() => parseTicketType('urgent'), /--type urgent is not a ticket type; use one of restore, admin, workload, maintenance$/);
  });
});
