import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { test } from 'node:test';
import { jobTicketId, podTicketId, ticketId, workloadTicketId } from '../../src/ledger/ids.js';

const sha256 = (text: string) => createHash('sha256').update(text, 'utf8').digest('hex');

test('ticket IDs are the sha256 of what they name, as node:crypto computes it (IDs already in ledgers stay valid)', () => {
  assert.equal(ticketId('workload', 'pv-a', 'latch/latch', 'node-a'), `workload-${sha256('pv-alatch/latchnode-a')}`);
  assert.equal(podTicketId('pv-a', 'latch/latch', 'node-a', 'ns/pod-1'), `workload-${sha256('pv-alatch/latchnode-a\0pod\0ns/pod-1')}`);
  // Beyond ASCII (a job's key is free text): the UTF-8 bytes.
  assert.equal(jobTicketId('backup', 'vol-a', 'nächtlich-✓'), `backup-${sha256('vol-a\0nächtlich-✓')}`);
});

test("a workload ticket's ID: the node's without a pod key, that pod's with one (IDs already in ledgers stay valid)", () => {
  assert.equal(workloadTicketId('pv-a', 'latch/latch', 'node-a'), `workload-${sha256('pv-alatch/latchnode-a')}`);
  assert.equal(workloadTicketId('pv-a', 'latch/latch', 'node-a', 'ns/pod-1'), `workload-${sha256('pv-alatch/latchnode-a\0pod\0ns/pod-1')}`);
  assert.notEqual(workloadTicketId('pv-a', 'latch/latch', 'node-a', ''), workloadTicketId('pv-a', 'latch/latch', 'node-a'));
});
