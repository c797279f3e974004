// What each driver-call bundle of bin/latch-sea exports (src/sea/load.ts loads them): src/sea/driver.ts with every
// op, src/sea/control.ts with the control plane's. The call itself, and the warm-up that the build runs before it
// takes the bundle's V8 code cache. Admin commands run the whole of latch from another asset (src/bin.ts).
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { encodeReply } from '../contract/reply.js';
import { redactArgs, writeLog } from '../log.js';
import { answerCall, runDriverCall, type StartupFacts } from '../protocol/driver.js';
import type { OpTable } from '../protocol/ops.js';

export interface DriverBundle {
  readonly runDriverCall: (op: string, argv: string[], startup: StartupFacts) => Promise<void>;
  readonly warmUp: (dir: string) => Promise<never>;
}

export function driverBundle(ops: OpTable): DriverBundle {
  return {
    runDriverCall: (op, argv, startup) => runDriverCall(op, argv, ops, startup),
    warmUp: (dir) => warmUp(dir, ops),
  };
}

/**
 * Answers the control plane's calls (init, getvolumename, attach, isattached: the ones KCM and kubelet make all
 * the time; and an attach and detach that write the ledger) once each on a scratch configuration and ledger in `dir`,
 * so that V8 compiles their path (the configuration's validated copy, options, the file store, the ledger and its
 * writes, the log line) and the code cache taken afterwards holds its bytecode. The build runs it twice in two
 * processes on the same `dir` and takes the cache of the second: by then the configuration's copy and the attachment
 * exist, so the cache holds what a steady call runs (not zod, which only a first call needs) and nothing else a call
 * would have to deserialize. These calls run no child process; nothing of the build host stays in the cache, which is
 * code, not data.
 *
 * The last call is a whole one, through runDriverCall (stray output, signal handlers, deadline, log line, reply), so
 * that the cache holds that path too: it ends the process, with the call's exit code, and src/sea/warm.ts takes the
 * cache on the way out.
 */
async function warmUp(dir: string, ops: OpTable): Promise<never> {
  const configPath = join(dir, 'config.json');
  const config = { nodeName: 'warm-node', stateDir: join(dir, 'state'), poolDir: join(dir, 'pool'), logFile: join(dir, 'latch.log') };
  writeFileSync(configPath, JSON.stringify(config));
  const env = { LATCH_CONFIG: configPath };
  const json = JSON.stringify({ 'kubernetes.io/fsType': '', 'kubernetes.io/pvOrVolumeName': 'pv-warm', 'kubernetes.io/readwrite': 'rw' });
  // A volume of this process's own, attached and detached, so that both processes write the ledger (pv-warm's attach
  // is a write only in the first).
  const own = `pv-warm-${process.pid}`;
  const ownJson = JSON.stringify({ 'kubernetes.io/fsType': '', 'kubernetes.io/pvOrVolumeName': own, 'kubernetes.io/readwrite': 'rw' });
  const calls: [string, string[]][] = [
    ['init', []],
    ['getvolumename', [json]],
    ['attach', [json, 'warm-node']],
    ['attach', [ownJson, 'warm-node']],
    ['detach', [own, 'warm-node']],
  ];
  // Once is enough: V8 makes a function's bytecode when it first runs it, and that is what the cache holds.
  for (const [op, argv] of calls) {
    const log = {};
    let logFile: { logFile: string; logMaxBytes: number } | undefined;
    const reply = await answerCall(op, argv, ops, log, (c) => (logFile = c), { env });
    if (reply.status !== 'Success') throw new Error(`warm-up ${op}: ${reply.message ?? reply.status}`);
    if (logFile) writeLog(logFile, { op, args: redactArgs(argv), ...log, status: reply.status }, op !== 'init');
    encodeReply(reply);
  }
  process.env.LATCH_CONFIG = configPath;
  await runDriverCall('isattached', [json, 'warm-node'], ops);
  throw new Error('warm-up isattached: runDriverCall returned without ending the process');
}
