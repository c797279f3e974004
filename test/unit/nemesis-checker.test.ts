// The nemesis checker (test/nemesis/checker.ts) on small histories made by hand: a run where node-a is cut off,
// fenced and its volume moved to node-b passes every property, and each variant that breaks one property fails
// that property (and only that one).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { check, lostAfterFence, PROPERTIES, type Property } from '../nemesis/checker.js';
import type { CallEvent, HistoryEvent } from '../nemesis/history.js';

function call(node: string, op: string, start: number, end: number, status = 'Success', extra: Partial<CallEvent> = {}): CallEvent {
  return {
    kind: 'call',
    node,
    op,
    volume: 'v1',
    start,
    end,
    deadlineMs: 60_000,
    stdout: `${JSON.stringify({ status })}\n`,
    stderr: '',
    exitCode: status === 'Failure' ? 1 : 0,
    signal: null,
    driverCall: true,
    ...extra,
  };
}

const mountA = { volume: 'v1', device: '/dev/loop1', rw: true };
const mountB = { volume: 'v1', device: '/dev/loop2', rw: true };

/** node-a writes records 1-3, is cut off, fenced at 5000; node-b takes over and writes record 1 of its own. */
function goodRun(): HistoryEvent[] {
  return [
    { kind: 'intent', volume: 'v1', node: 'node-a', at: 0 },
    call('node-a', 'attach', 0, 900),
    call('node-a', 'mountdevice', 1000, 1500),
    { kind: 'kernel', at: 1600, mounts: { 'node-a': [mountA], 'node-b': [] }, mappings: { 'node-a': ['v1'], 'node-b': [] } },
    { kind: 'writer', volume: 'v1', node: 'node-a', writer: 'a1', at: 1700 },
    { kind: 'ack', volume: 'v1', node: 'node-a', writer: 'a1', seq: 1, written: 1800, at: 1810 },
    { kind: 'ack', volume: 'v1', node: 'node-a', writer: 'a1', seq: 2, written: 1900, at: 1910 },
    { kind: 'fault', id: 1, fault: 'isolate-node', phase: 'start', at: 2000, etcdCutNodes: ['node-a'] },
    call('node-a', 'waitforattach', 2100, 3000, 'Failure'), // a grant claimed while cut off: refused
    { kind: 'fence', node: 'node-a', volume: 'v1', at: 5000 },
    { kind: 'intent', volume: 'v1', node: 'node-b', at: 5000 },
    call('node-b', 'attach', 5100, 5500),
    call('node-b', 'mountdevice', 5600, 6000),
    // node-a's mount lingers (dead) beside node-b's.
    { kind: 'kernel', at: 6100, mounts: { 'node-a': [mountA], 'node-b': [mountB] }, mappings: { 'node-a': ['v1'], 'node-b': ['v1'] } },
    { kind: 'writer', volume: 'v1', node: 'node-b', writer: 'b1', at: 6200 },
    { kind: 'ack', volume: 'v1', node: 'node-b', writer: 'b1', seq: 1, written: 6300, at: 6310 },
    { kind: 'fault', id: 1, fault: 'isolate-node', phase: 'end', at: 7000 },
    {
      kind: 'final',
      volume: 'v1',
      at: 8000,
      records: [
        { writer: 'a1', seq: 1, written: 1800 },
        { writer: 'a1', seq: 2, written: 1900 },
        { writer: 'b1', seq: 1, written: 6300 },
      ],
    },
    { kind: 'converged', at: 9000, holders: { v1: ['node-b'] }, staleTickets: {}, doctor: { 'node-a': [], 'node-b': [] } },
    { kind: 'kernel', at: 9100, mounts: { 'node-a': [], 'node-b': [mountB] }, mappings: { 'node-a': [], 'node-b': ['v1'] } },
  ];
}

function failed(history: HistoryEvent[]): Property[] {
  return check(history)
    .filter((v) => !v.passed)
    .map((v) => v.property);
}

function violations(history: HistoryEvent[], property: Property): string[] {
  return check(history).find((v) => v.property === property)!.violations;
}

describe('the nemesis checker', () => {
  it('passes a run where the cut-off node is fenced before its volume moves', () => {
    assert.deepEqual(
      check(goodRun()).map((v) => [v.property, v.violations]),
      PROPERTIES.map((p) => [p, []]),
    );
  });

  it('1: catches a volume mounted read-write on two nodes without a fence in between', () => {
    const history = goodRun().filter((e) => e.kind !== 'fence');
    assert.ok(failed(history).includes('one read-write node'));
    assert.match(violations(history, 'one read-write node').join('\n'), /at 6100 ms v1 was mounted read-write on node-a and node-b/);
  });

  it('1: a mount first seen after the fence counts again', () => {
    const history = goodRun();
    // node-a's cleanup unmounts, then it mounts v1 again while node-b still has it.
    history.push({ kind: 'kernel', at: 6400, mounts: { 'node-a': [], 'node-b': [mountB] }, mappings: {} });
    history.push({ kind: 'kernel', at: 6500, mounts: { 'node-a': [mountA], 'node-b': [mountB] }, mappings: {} });
    assert.deepEqual(failed(history), ['one read-write node']);
  });

  it('2: catches an acknowledged record missing from the volume', () => {
    const history = goodRun().map((e) =>
      e.kind === 'final' ? { ...e, records: e.records.filter((r) => !(r.writer === 'a1' && r.seq === 2)) } : e,
    );
    assert.deepEqual(failed(history), ['acknowledged records survive']);
    assert.match(violations(history, 'acknowledged records survive').join('\n'), /v1 a1: acknowledged records missing from the volume: 2/);
  });

  it('2: a record acknowledged after the fence may be lost (and is counted as such)', () => {
    const history = goodRun();
    assert.deepEqual(lostAfterFence(history), []);
    history.splice(10, 0, { kind: 'ack', volume: 'v1', node: 'node-a', writer: 'a1', seq: 3, written: 4000, at: 5200 });
    assert.deepEqual(failed(history), []);
    assert.deepEqual(lostAfterFence(history), ['v1: a1#3, written at 4000 ms, fsync returned at 5200 ms, after the fence at 5000 ms']);
  });

  it("3: catches a fenced node's record written after the fence", () => {
    const history = goodRun().map((e) =>
      e.kind === 'final' ? { ...e, records: [...e.records, { writer: 'a1', seq: 3, written: 5300 }] } : e,
    );
    assert.deepEqual(failed(history), ['no late writes of a fenced node']);
    assert.match(
      violations(history, 'no late writes of a fenced node').join('\n'),
      /a1#3 of node-a was written at 5300 ms, after its fence at 5000 ms/,
    );
  });

  it('4: catches a grant on a node cut off from the etcd majority', () => {
    const history = goodRun().map((e) => (e.kind === 'call' && e.start === 2100 ? call('node-a', 'waitforattach', 2100, 3000) : e));
    assert.deepEqual(failed(history), ['no grant without quorum']);
  });

  // Overlapping faults (test/nemesis/run.ts starts a second fault while the first is active): each has its own id,
  // start and end, and they may end in either order.
  const cut = (id: number, fault: string, node: string, from: number, to: number): HistoryEvent[] => [
    { kind: 'fault', id, fault, phase: 'start', at: from, etcdCutNodes: [node] },
    { kind: 'fault', id, fault, phase: 'end', at: to },
  ];
  const grant = (node: string, start: number, end: number) => call(node, 'waitforattach', start, end);

  it('4: a call cut off by one fault and then by another that overlapped it was cut off throughout', () => {
    // Neither fault alone spans the call [2100, 3000]; together they do.
    const history = [...goodRun(), ...cut(2, 'node-etcd-cut', 'node-a', 2500, 4000), grant('node-a', 2100, 3000)];
    // goodRun's isolate-node (#1) of node-a lasts from 2000 to 7000: move its end before the call's.
    const early = history.map((e) => (e.kind === 'fault' && e.id === 1 && e.phase === 'end' ? { ...e, at: 2600 } : e));
    assert.deepEqual(failed(early), ['no grant without quorum']);
    assert.match(
      violations(early, 'no grant without quorum').join('\n'),
      /node-a succeeded at 3000 ms .*\(isolate-node #1, node-etcd-cut #2\)/,
    );
  });

  it('4: a gap between two faults lets a call through; a fault of another node does not count', () => {
    const gap = goodRun().map((e) => (e.kind === 'fault' && e.id === 1 && e.phase === 'end' ? { ...e, at: 2500 } : e));
    assert.deepEqual(failed([...gap, ...cut(2, 'node-etcd-cut', 'node-a', 2600, 4000), grant('node-a', 2100, 3000)]), []);
    assert.deepEqual(failed([...gap, ...cut(2, 'node-etcd-cut', 'node-b', 2400, 4000), grant('node-a', 2100, 3000)]), []);
  });

  it('4: faults that end in the other order than they started: each window ends at its own end', () => {
    // #2 starts after #1 and ends first; a grant after #2 ended but while #1 still lasts is a violation, and one
    // after both ended is not.
    const nested = [...goodRun(), ...cut(2, 'etcd-minority', 'node-a', 2500, 3000)];
    assert.deepEqual(failed([...nested, grant('node-a', 3500, 4000)]), ['no grant without quorum']);
    assert.deepEqual(failed([...nested, grant('node-a', 7100, 7500)]), []);
  });

  it('4: a fault that never ended lasts to the end of the history', () => {
    const open = [
      ...goodRun(),
      { kind: 'fault', id: 2, fault: 'etcd-majority', phase: 'start', at: 8000, etcdCutNodes: ['node-a', 'node-b'] },
    ];
    assert.deepEqual(failed([...(open as HistoryEvent[]), grant('node-b', 8100, 8500)]), ['no grant without quorum']);
  });

  it('5: catches a volume held elsewhere than asked, a stale ticket, a stray mapping and a doctor complaint', () => {
    const history = goodRun().map((e) =>
      e.kind === 'converged'
        ? { ...e, holders: { v1: ['node-a', 'node-b'] }, staleTickets: { v1: ['node-c'] }, doctor: { 'node-a': ['a stale loop device'] } }
        : e.kind === 'kernel' && e.at === 9100
          ? { ...e, mappings: { 'node-a': ['v1'], 'node-b': ['v1'] } }
          : e,
    );
    assert.deepEqual(failed(history), ['convergence']);
    assert.equal(violations(history, 'convergence').length, 4);
    assert.deepEqual(failed(goodRun().filter((e) => e.kind !== 'converged')), ['convergence']);
  });

  it('5: catches a stray loop device, and a second one on the node asked for', () => {
    const strays: Record<string, string[]>[] = [{ 'node-a': ['v1'], 'node-b': ['v1'] }, { 'node-b': ['v1', 'v1'] }];
    for (const loops of strays) {
      const history = goodRun().map((e) => (e.kind === 'kernel' && e.at === 9100 ? { ...e, loops } : e));
      assert.deepEqual(failed(history), ['convergence']);
      assert.match(violations(history, 'convergence').join('\n'), /v1: loop devices on/);
    }
    const fine = goodRun().map((e) => (e.kind === 'kernel' && e.at === 9100 ? { ...e, loops: { 'node-a': [], 'node-b': ['v1'] } } : e));
    assert.deepEqual(failed(fine), []);
  });

  it('6: catches a call over its deadline, with stderr, two lines, no JSON, or killed; not one killed on purpose', () => {
    const bad = [
      call('node-c', 'attach', 0, 70_000, 'Failure'),
      { ...call('node-c', 'detach', 0, 10), stderr: 'oops' },
      { ...call('node-c', 'detach', 0, 10), stdout: '{"status":"Success"}\n{"status":"Success"}\n' },
      { ...call('node-c', 'detach', 0, 10), stdout: 'not json' },
      { ...call('node-c', 'detach', 0, 10), stdout: '', signal: 'SIGKILL', exitCode: null },
    ];
    for (const c of bad) assert.deepEqual(failed([...goodRun(), c]), ['one reply within the deadline'], JSON.stringify(c));
    const killed = { ...call('node-c', 'attach', 0, 10), stdout: '', signal: 'SIGKILL', exitCode: null, killedByNemesis: true };
    assert.deepEqual(failed([...goodRun(), killed]), []);
  });
});
