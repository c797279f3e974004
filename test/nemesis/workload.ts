// The nemesis workload: the history file, the driver and admin calls (each recorded with its reply and timing), the
// writers (one per pod: numbered records appended and fsynced, each acknowledged only after fsync returned), and
// looks at the kernel (each node's mounts and rbd mappings).
import { spawn, type ChildProcess } from 'node:child_process';
import { appendFileSync, readFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { listLoopDevices } from '../../src/sys/loop.js';
import { readMountInfo } from '../../src/sys/mounts.js';
import { run } from '../../src/sys/run.js';
import type { CallEvent, HistoryEvent } from './history.js';
import { LATCH, NODES, type NodeSetup } from './rig.js';

export class History {
  readonly t0 = Date.now();
  readonly counts = { calls: 0, faults: 0, records: 0 };

  constructor(readonly file: string) {}

  now(): number {
    return Date.now() - this.t0;
  }

  append(event: HistoryEvent): void {
    if (event.kind === 'call') this.counts.calls++;
    if (event.kind === 'fault' && event.phase === 'start') this.counts.faults++;
    if (event.kind === 'ack') this.counts.records++;
    appendFileSync(this.file, `${JSON.stringify(event)}\n`);
  }
}

/** Who runs a call: a node (its namespace and configuration) or the admin on the switch side. */
export interface Caller {
  name: string;
  netns: string;
  config: string;
}

export interface CallOptions {
  volume?: string;
  /** The deadline the caller (kubelet, the controller) gives the call; past it plus a grace it is SIGKILLed. */
  deadlineMs: number;
  /** Driver calls are held to property 6; admin commands are not. */
  driverCall?: boolean;
  /** SIGKILL the call this many ms after it starts (the nemesis's "call killed mid-operation"). */
  killAfterMs?: number;
}

export interface CallResult {
  event: CallEvent;
  reply: { status?: string; message?: string; device?: string } | undefined;
}

/** Runs `latch args` in the caller's network namespace with its configuration, and records it. */
export async function latchCall(history: History, caller: Caller, args: string[], options: CallOptions): Promise<CallResult> {
  const start = history.now();
  const child = spawn('nsenter', [`--net=/run/netns/${caller.netns}`, '--', LATCH, ...args], {
    env: { ...process.env, LATCH_CONFIG: caller.config },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
  child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
  let killedByNemesis = false;
  const killer = setTimeout(() => child.kill('SIGKILL'), options.deadlineMs + 15_000);
  const nemesis =
    options.killAfterMs === undefined
      ? undefined
      : setTimeout(() => {
          killedByNemesis = child.exitCode === null;
          child.kill('SIGKILL');
        }, options.killAfterMs);
  const [exitCode, signal] = await new Promise<[number | null, string | null]>((resolve) => {
    child.once('error', () => resolve([null, 'spawn error']));
    child.once('close', (code, sig) => resolve([code, sig]));
  });
  clearTimeout(killer);
  if (nemesis) clearTimeout(nemesis);
  const event: CallEvent = {
    kind: 'call',
    node: caller.name,
    op: args[0] === 'node' || args[0] === 'volume' ? `${args[0]} ${args[1]}` : (args[0] ?? ''),
    ...(options.volume ? { volume: options.volume } : {}),
    start,
    end: history.now(),
    deadlineMs: options.deadlineMs,
    stdout,
    stderr,
    exitCode,
    signal,
    driverCall: options.driverCall ?? true,
    ...(killedByNemesis ? { killedByNemesis } : {}),
  };
  history.append(event);
  let reply: CallResult['reply'];
  try {
    reply = JSON.parse(stdout) as CallResult['reply'];
  } catch {
    reply = undefined;
  }
  return { event, reply };
}

// ---------------------------------------------------------------------------------------------------------------
// Writers.

// Appends "writer seq written" lines to its file and fsyncs each; prints "seq written" once fsync returned. Plain
// node (no tsx): one per pod, and cheap to start. `written` is on the runner's clock (ms since T0). A write or fsync
// that fails is not acknowledged, and the writer goes on with the next record: a fenced node's writer keeps trying,
// which is what property 3 needs (none of those later records may land).
const WRITER_SOURCE = `
const fs = require('fs');
const [file, writer, t0, intervalMs] = process.argv.slice(1);
const fd = fs.openSync(file, 'a');
let seq = 0;
function step() {
  seq++;
  const written = Date.now() - Number(t0);
  try {
    fs.writeSync(fd, writer + ' ' + seq + ' ' + written + '\\n');
    fs.fsyncSync(fd);
    process.stdout.write(seq + ' ' + written + '\\n');
  } catch {}
  setTimeout(step, Number(intervalMs));
}
step();
`;

export class Writer {
  private readonly child: ChildProcess;
  readonly exited: Promise<void>;

  constructor(
    history: History,
    readonly volume: string,
    readonly node: string,
    readonly writer: string,
    mountPath: string,
    intervalMs = 250,
  ) {
    history.append({ kind: 'writer', volume, node, writer, at: history.now() });
    this.child = spawn(
      'setpriv',
      [
        '--pdeathsig',
        'SIGKILL',
        '--',
        process.execPath,
        '-e',
        WRITER_SOURCE,
        join(mountPath, `records-${writer}`),
        writer,
        String(history.t0),
        String(intervalMs),
      ],
      { stdio: ['ignore', 'pipe', 'ignore'] },
    );
    let buffered = '';
    this.child.stdout!.setEncoding('utf8').on('data', (d: string) => {
      buffered += d;
      const lines = buffered.split('\n');
      buffered = lines.pop() ?? '';
      const at = history.now();
      for (const line of lines) {
        const [seq, written] = line.split(' ').map(Number);
        if (seq !== undefined && written !== undefined) history.append({ kind: 'ack', volume, node, writer, seq, written, at });
      }
    });
    this.exited = new Promise((resolve) => this.child.once('close', () => resolve()));
  }

  /** SIGKILLs the writer (a pod stopped); one stuck on a dead FUSE mount exits only once that is aborted. */
  kill(): void {
    this.child.kill('SIGKILL');
  }
}

/** The records in every record file at `mountPath` (read by `cat` under a deadline: never stat a mount from here). */
export async function readRecords(mountPath: string): Promise<{ writer: string; seq: number; written: number }[]> {
  const { stdout } = await run('sh', ['-c', 'cat "$1"/records-* 2>/dev/null || true', 'sh', mountPath], { timeoutMs: 20_000 });
  const records: { writer: string; seq: number; written: number }[] = [];
  for (const line of stdout.split('\n')) {
    const [writer, seq, written] = /^(\S+) (\d+) (\d+)$/.exec(line)?.slice(1) ?? [];
    if (writer !== undefined) records.push({ writer, seq: Number(seq), written: Number(written) });
  }
  return records;
}

// ---------------------------------------------------------------------------------------------------------------
// The kernel.

/** Each node's mounts of latch volumes (under its kubelet dir) and its rbd mappings (FUSE mounts under its mount dir). */
export async function lookAtKernel(history: History, nodes: Record<string, NodeSetup>): Promise<void> {
  const table = await readMountInfo();
  const mounts: Record<string, { volume: string; device: string; rw: boolean }[]> = {};
  const mappings: Record<string, string[]> = {};
  const loops: Record<string, string[]> = {};
  // From sysfs: never a stat of a file on a FUSE mount, which hangs on a fenced one.
  const devices = await listLoopDevices();
  for (const node of NODES) {
    const setup = nodes[node];
    if (!setup) continue;
    mounts[node] = table
      .filter((m) => m.mountPoint.startsWith(`${setup.kubeletDir}/`) && m.source.startsWith('/dev/loop'))
      .map((m) => ({ volume: basename(m.mountPoint), device: m.source, rw: m.options.includes('rw') }));
    mappings[node] = table
      .filter((m) => m.mountPoint.startsWith(`${setup.mountDir}/`) && m.fsType.startsWith('fuse'))
      .map((m) => basename(m.mountPoint));
    loops[node] = devices
      .filter((l) => l.backingFile.startsWith(`${setup.mountDir}/`))
      .map((l) => l.backingFile.slice(setup.mountDir.length + 1).split('/')[0] ?? '');
  }
  history.append({ kind: 'kernel', at: history.now(), mounts, mappings, loops });
}

export function readHistoryFile(file: string): string {
  return readFileSync(file, 'utf8');
}
