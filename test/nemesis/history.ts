// The history of a nemesis run: one JSON object per line, appended as things happen (test/nemesis/run.ts writes it,
// test/nemesis/checker.ts decides from it alone). Times are milliseconds since the run started, from one clock.

/** A driver or admin call as the runner saw it: its reply as printed, and whether it ended within its deadline. */
export interface CallEvent {
  kind: 'call';
  node: string;
  /** The driver op (attach, waitforattach, mountdevice, unmountdevice, detach) or an admin command (fence, doctor). */
  op: string;
  volume?: string;
  start: number;
  end: number;
  deadlineMs: number;
  stdout: string;
  stderr: string;
  exitCode: number | null;
  signal: string | null;
  /** SIGKILLed on purpose by the nemesis: exempt from property 6 (a killed call prints nothing, as designed). */
  killedByNemesis?: boolean;
  /** Whether property 6 applies: true for driver calls (kubelet's contract), false for admin commands. */
  driverCall: boolean;
}

/**
 * A fault the nemesis started or ended. Faults may overlap: each has its own id, and its start and end events share
 * it. `at` is when the fault was in place (start: after it was set up) and when its heal began (end), so that the
 * window between them is one where the fault certainly held.
 */
export interface FaultEvent {
  kind: 'fault';
  id: number;
  /** e.g. "isolate-node", "node-storage-cut", "node-etcd-cut", "etcd-minority", "kill-osd", "kill-call". */
  fault: string;
  phase: 'start' | 'end';
  at: number;
  /** Nodes that, during this fault, cannot reach a majority of etcd's members. */
  etcdCutNodes?: string[];
  detail?: string;
}

/** A node fence the controller ran (the admin step), and when it completed successfully. */
export interface FenceEvent {
  kind: 'fence';
  node: string;
  volume: string;
  at: number;
}

/** A record the writer on `node` appended to `volume` and fsynced: acknowledged only after fsync returned. */
export interface AckEvent {
  kind: 'ack';
  volume: string;
  node: string;
  /** One writer incarnation: a writer started on a node for a volume. */
  writer: string;
  seq: number;
  /** When the write of the record began (the time it carries in its line). */
  written: number;
  at: number;
}

/** A writer incarnation started (before its first record). */
export interface WriterEvent {
  kind: 'writer';
  volume: string;
  node: string;
  writer: string;
  at: number;
}

/** One look at the kernel: each node's read-write mounts of latch volumes (all nodes share one kernel here). */
export interface KernelEvent {
  kind: 'kernel';
  at: number;
  /** node -> its mounts of volumes: { volume, device, rw }. */
  mounts: Record<string, { volume: string; device: string; rw: boolean }[]>;
  /** node -> its rbd mappings (volumes with an rbd-fuse mount under its mount dir). */
  mappings: Record<string, string[]>;
  /** node -> the volumes of its loop devices (backed by a file of its rbd-fuse mounts), one entry per device. */
  loops?: Record<string, string[]>;
}

/** What the controller last asked for each volume: its node, or null for detached. */
export interface IntentEvent {
  kind: 'intent';
  volume: string;
  node: string | null;
  at: number;
}

/** The records found on a volume after the run (each record file read by a fresh, healthy node). */
export interface FinalEvent {
  kind: 'final';
  volume: string;
  /** When the read began: only records acknowledged before then must be in it. */
  at: number;
  records: { writer: string; seq: number; written: number }[];
}

/** The state once the faults healed and the controller settled. */
export interface ConvergedEvent {
  kind: 'converged';
  at: number;
  /** volume -> nodes the ledger says hold it. */
  holders: Record<string, string[]>;
  /** volume -> nodes with a ticket on it that nobody is waiting for. */
  staleTickets: Record<string, string[]>;
  /** Blocklist entries of fenced clients that latch should have cleared (none expected after an unfence). */
  staleBlocklist?: string[];
  /** node -> doctor's problems (empty: nothing wrong). */
  doctor: Record<string, string[]>;
}

export type HistoryEvent =
  CallEvent | FaultEvent | FenceEvent | AckEvent | WriterEvent | KernelEvent | IntentEvent | FinalEvent | ConvergedEvent;

export function parseHistory(text: string): HistoryEvent[] {
  return text
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => JSON.parse(line) as HistoryEvent);
}
