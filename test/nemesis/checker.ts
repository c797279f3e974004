// The nemesis suite's checker: decides latch's six properties from a run's history alone (test/nemesis/history.ts).
// A pure function, so that it can be tested on small histories made by hand, each breaking one property.
import type {
  AckEvent,
  CallEvent,
  ConvergedEvent,
  FaultEvent,
  FenceEvent,
  FinalEvent,
  HistoryEvent,
  KernelEvent,
  WriterEvent,
} from './history.js';

export const PROPERTIES = [
  'one read-write node',
  'acknowledged records survive',
  'no late writes of a fenced node',
  'no grant without quorum',
  'convergence',
  'one reply within the deadline',
] as const;
export type Property = (typeof PROPERTIES)[number];

export interface Verdict {
  property: Property;
  passed: boolean;
  violations: string[];
}

const of = <K extends HistoryEvent['kind']>(history: HistoryEvent[], kind: K) =>
  history.filter((e): e is Extract<HistoryEvent, { kind: K }> => e.kind === kind);

/** When `node` was fenced off `volume`, in order. */
function fenceTimes(fences: FenceEvent[], node: string, volume: string): number[] {
  return fences
    .filter((f) => f.node === node && f.volume === volume)
    .map((f) => f.at)
    .sort((a, b) => a - b);
}

/**
 * 1. No volume is mounted read-write on two nodes at once. All nodes share one kernel here, so each look at it is one
 * instant for every node. A mount that was there before its node was fenced off the volume no longer counts: the
 * fence cut its client off (its writes fail; property 3 checks that none landed), and the mount lingers until the
 * node's cleanup, which may be after the volume has moved.
 */
function oneReadWriteNode(kernel: KernelEvent[], fences: FenceEvent[]): string[] {
  const violations: string[] = [];
  const firstSeen = new Map<string, number>(); // node volume device -> when this mount was first seen
  for (const look of [...kernel].sort((a, b) => a.at - b.at)) {
    const seenNow = new Set<string>();
    const live = new Map<string, string[]>(); // volume -> nodes with a live read-write mount
    for (const [node, mounts] of Object.entries(look.mounts)) {
      for (const m of mounts) {
        const key = `${node} ${m.volume} ${m.device}`;
        seenNow.add(key);
        const since = firstSeen.get(key) ?? look.at;
        firstSeen.set(key, since);
        if (!m.rw) continue;
        const fencedSince = fenceTimes(fences, node, m.volume).some((f) => f >= since && f <= look.at);
        if (!fencedSince) live.set(m.volume, [...(live.get(m.volume) ?? []), node]);
      }
    }
    for (const key of [...firstSeen.keys()]) if (!seenNow.has(key)) firstSeen.delete(key);
    for (const [volume, nodes] of live) {
      if (new Set(nodes).size > 1)
        violations.push(`at ${look.at} ms ${volume} was mounted read-write on ${[...new Set(nodes)].join(' and ')}`);
    }
  }
  return violations;
}

/** The fence of the writer's node off its volume that came after the writer started, if any. */
function fenceOfWriter(writer: WriterEvent | undefined, fences: FenceEvent[]): number | undefined {
  if (!writer) return undefined;
  return fenceTimes(fences, writer.node, writer.volume).find((f) => f >= writer.at);
}

/** 2. Every record acknowledged before its node's fence completed (or with no fence at all) is on the volume. */
function acknowledgedSurvive(
  acks: AckEvent[],
  writers: Map<string, WriterEvent>,
  fences: FenceEvent[],
  finals: Map<string, FinalEvent>,
): string[] {
  const violations: string[] = [];
  const missing = new Map<string, number[]>();
  for (const ack of acks) {
    const fence = fenceOfWriter(writers.get(ack.writer), fences);
    if (fence !== undefined && ack.at >= fence) continue; // acknowledged after the fence: may be lost
    const final = finals.get(ack.volume);
    if (final && ack.at >= final.at) continue; // acknowledged after the last read began
    if (!final) {
      violations.push(`${ack.volume}: no final read of the volume, so record ${ack.writer}#${ack.seq} cannot be found`);
      continue;
    }
    if (!final.records.some((r) => r.writer === ack.writer && r.seq === ack.seq)) {
      missing.set(`${ack.volume} ${ack.writer}`, [...(missing.get(`${ack.volume} ${ack.writer}`) ?? []), ack.seq]);
    }
  }
  for (const [key, seqs] of missing) violations.push(`${key}: acknowledged records missing from the volume: ${seqs.join(', ')}`);
  return [...new Set(violations)];
}

/** 3. No record that a fenced node's writer began after the fence completed is on the volume. */
function noLateWrites(finals: FinalEvent[], writers: Map<string, WriterEvent>, fences: FenceEvent[]): string[] {
  const violations: string[] = [];
  for (const final of finals) {
    for (const record of final.records) {
      const writer = writers.get(record.writer);
      const fence = fenceOfWriter(writer, fences);
      if (fence !== undefined && record.written >= fence) {
        violations.push(
          `${final.volume}: record ${record.writer}#${record.seq} of ${writer?.node} was written at ${record.written} ms, after its fence at ${fence} ms`,
        );
      }
    }
  }
  return violations;
}

/**
 * When each node could not reach a majority of etcd's members: the windows of every fault that cut it off, merged.
 * Faults overlap, and any one of them suffices: a node cut off by one fault and then by another that started before
 * the first healed was cut off throughout. (No two of the nemesis's faults cut a node off together that neither
 * cuts off alone: test/nemesis/nemesis.ts.) A fault with no end in the history lasts to the end.
 */
function cutOffWindows(faults: FaultEvent[]): Map<string, { from: number; to: number; faults: string[] }[]> {
  const byNode = new Map<string, { from: number; to: number; faults: string[] }[]>();
  for (const start of faults) {
    if (start.phase !== 'start') continue;
    const to = faults.find((e) => e.phase === 'end' && e.id === start.id)?.at ?? Infinity;
    for (const node of start.etcdCutNodes ?? []) {
      byNode.set(node, [...(byNode.get(node) ?? []), { from: start.at, to, faults: [`${start.fault} #${start.id}`] }]);
    }
  }
  for (const [node, windows] of byNode) {
    const merged: { from: number; to: number; faults: string[] }[] = [];
    for (const w of windows.sort((a, b) => a.from - b.from)) {
      const last = merged.at(-1);
      if (last && w.from <= last.to)
        merged[merged.length - 1] = { from: last.from, to: Math.max(last.to, w.to), faults: [...last.faults, ...w.faults] };
      else merged.push(w);
    }
    byNode.set(node, merged);
  }
  return byNode;
}

/**
 * 4. No node claimed a grant (waitforattach succeeded: the node's side of an attach, where it takes its hold) while,
 * for the whole call, it could not reach a majority of etcd's members (because of any of the faults active then).
 */
function noGrantWithoutQuorum(calls: CallEvent[], faults: FaultEvent[]): string[] {
  const violations: string[] = [];
  const windows = cutOffWindows(faults);
  for (const call of calls) {
    if (call.op !== 'waitforattach' || !succeeded(call)) continue;
    const window = windows.get(call.node)?.find((w) => w.from <= call.start && call.end <= w.to);
    if (window) {
      violations.push(
        `attach of ${call.volume} on ${call.node} succeeded at ${call.end} ms while it was cut off from etcd's majority (${window.faults.join(', ')})`,
      );
    }
  }
  return violations;
}

/** 5. After the faults healed: each volume held where the controller last asked (or nowhere), nothing stale, doctor clean. */
function convergence(history: HistoryEvent[], converged: ConvergedEvent | undefined, kernel: KernelEvent[]): string[] {
  if (!converged) return ['the run recorded no converged state'];
  const violations: string[] = [];
  const intents = new Map<string, string | null>();
  for (const e of of(history, 'intent')) intents.set(e.volume, e.node);
  const after = kernel.filter((k) => k.at >= converged.at).sort((a, b) => a.at - b.at)[0];
  if (!after) violations.push('no look at the kernel after the run converged');
  for (const [volume, node] of intents) {
    const want = node === null ? [] : [node];
    const holders = [...(converged.holders[volume] ?? [])].sort();
    if (JSON.stringify(holders) !== JSON.stringify(want))
      violations.push(`${volume}: held by [${holders.join(', ')}], the controller asked for [${want.join(', ')}]`);
    if (after) {
      const mapped = Object.entries(after.mappings)
        .filter(([, volumes]) => volumes.includes(volume))
        .map(([n]) => n)
        .sort();
      if (JSON.stringify(mapped) !== JSON.stringify(want))
        violations.push(`${volume}: mapped on [${mapped.join(', ')}], the controller asked for [${want.join(', ')}]`);
      // One loop device per mapping, on the node asked for only.
      const looped = Object.entries(after.loops ?? {})
        .flatMap(([n, volumes]) => volumes.filter((v) => v === volume).map(() => n))
        .sort();
      if (after.loops && JSON.stringify(looped) !== JSON.stringify(want))
        violations.push(`${volume}: loop devices on [${looped.join(', ')}], the controller asked for [${want.join(', ')}]`);
    }
  }
  for (const [volume, nodes] of Object.entries(converged.staleTickets)) {
    if (nodes.length > 0) violations.push(`${volume}: stale tickets of ${nodes.join(', ')}`);
  }
  for (const entry of converged.staleBlocklist ?? []) violations.push(`stale blocklist entry ${entry}`);
  for (const [node, problems] of Object.entries(converged.doctor)) {
    for (const problem of problems) violations.push(`doctor on ${node}: ${problem}`);
  }
  return violations;
}

function succeeded(call: CallEvent): boolean {
  try {
    return (JSON.parse(call.stdout) as { status?: string }).status === 'Success';
  } catch {
    return false;
  }
}

/** 6. Every driver call (not killed on purpose) printed exactly one JSON reply, nothing on stderr, within its deadline. */
function oneReplyWithinDeadline(calls: CallEvent[]): string[] {
  const violations: string[] = [];
  for (const call of calls) {
    if (!call.driverCall || call.killedByNemesis) continue;
    const what = `${call.op}${call.volume ? ` of ${call.volume}` : ''} on ${call.node} at ${call.start} ms`;
    const took = call.end - call.start;
    if (took > call.deadlineMs) violations.push(`${what} took ${took} ms, over its deadline of ${call.deadlineMs} ms`);
    if (call.signal !== null) violations.push(`${what} was killed by ${call.signal}`);
    if (call.stderr !== '') violations.push(`${what} wrote to stderr: ${JSON.stringify(call.stderr.slice(0, 200))}`);
    const lines = call.stdout.split('\n').filter((l) => l !== '');
    let reply: unknown;
    try {
      reply = lines.length === 1 ? JSON.parse(lines[0] ?? '') : undefined;
    } catch {
      reply = undefined;
    }
    const status = (reply as { status?: unknown } | undefined)?.status;
    if (typeof reply !== 'object' || reply === null || !['Success', 'Failure', 'Not supported'].includes(String(status))) {
      violations.push(`${what} did not print one JSON reply: ${JSON.stringify(call.stdout.slice(0, 200))}`);
    } else if (call.exitCode !== (status === 'Failure' ? 1 : 0)) {
      violations.push(`${what} exited ${call.exitCode} with status ${String(status)}`);
    }
  }
  return violations;
}

/** The verdict on each property, from the history alone. */
export function check(history: HistoryEvent[]): Verdict[] {
  const fences = of(history, 'fence');
  const kernel = of(history, 'kernel');
  const calls = of(history, 'call');
  const writers = new Map(of(history, 'writer').map((w) => [w.writer, w]));
  const finalList = of(history, 'final');
  const finals = new Map(finalList.map((f) => [f.volume, f]));
  const converged = of(history, 'converged').at(-1);
  const found: Record<Property, string[]> = {
    'one read-write node': oneReadWriteNode(kernel, fences),
    'acknowledged records survive': acknowledgedSurvive(of(history, 'ack'), writers, fences, finals),
    'no late writes of a fenced node': noLateWrites(finalList, writers, fences),
    'no grant without quorum': noGrantWithoutQuorum(calls, of(history, 'fault')),
    convergence: convergence(history, converged, kernel),
    'one reply within the deadline': oneReplyWithinDeadline(calls),
  };
  return PROPERTIES.map((property) => ({ property, passed: found[property].length === 0, violations: found[property] }));
}

/**
 * Not a property, a figure: records a fenced node's writer was told were durable (fsync returned) only after its
 * fence completed, and that are not on the volume. Property 2 does not ask for them (the node was fenced), but the
 * application on that node was told they were safe.
 */
export function lostAfterFence(history: HistoryEvent[]): string[] {
  const fences = of(history, 'fence');
  const writers = new Map(of(history, 'writer').map((w) => [w.writer, w]));
  const finals = new Map(of(history, 'final').map((f) => [f.volume, f]));
  const lost: string[] = [];
  for (const ack of of(history, 'ack')) {
    const fence = fenceOfWriter(writers.get(ack.writer), fences);
    const final = finals.get(ack.volume);
    if (fence === undefined || ack.at < fence || !final || ack.at >= final.at) continue;
    if (!final.records.some((r) => r.writer === ack.writer && r.seq === ack.seq)) {
      lost.push(
        `${ack.volume}: ${ack.writer}#${ack.seq}, written at ${ack.written} ms, fsync returned at ${ack.at} ms, after the fence at ${fence} ms`,
      );
    }
  }
  return lost;
}
