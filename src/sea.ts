// Entry point of bin/latch-sea, the single-executable build with a V8 startup snapshot: this script runs once, at
// build time, and the heap it leaves (modules evaluated, zod loaded, the schemas built, the hot paths compiled) is
// what every call starts from. Nothing here may depend on the build host (paths found, environment): that is all
// read at run time.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startupSnapshot } from 'node:v8';
import { warmConfigSchema } from './config.js';
import { encodeReply } from './contract/reply.js';
import { warmOptionsSchema } from './contract/options.js';
import { redactArgs, writeLog } from './log.js';
import { main } from './main.js';
import { answerCall } from './protocol/driver.js';
import { OPS } from './protocol/ops.js';

/**
 * Answers the control plane's calls (init, getvolumename, attach, isattached: the ones KCM and kubelet make all
 * the time) a few times on a scratch configuration and ledger, so that V8 compiles their whole path (config and
 * options parsing, the file store, the ledger, the log line) here, once, and every call starts with its bytecode
 * instead of compiling it (measured: a third of a call's JavaScript time). Only the heap stays: the scratch
 * directory is removed, and these calls run no child process.
 */
async function compileHotPaths(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'latch-sea-warm-'));
  try {
    const config = {
      nodeName: 'warm-node',
      stateDir: join(dir, 'state'),
      poolDir: join(dir, 'pool'),
      logFile: join(dir, 'latch.log'),
      defaultSize: '64Mi',
    };
    writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
    const env = { LATCH_CONFIG: join(dir, 'config.json') };
    const json = JSON.stringify({ 'kubernetes.io/fsType': '', 'kubernetes.io/pvOrVolumeName': 'pv-warm', 'kubernetes.io/readwrite': 'rw' });
    const calls: [string, string[]][] = [
      ['init', []],
      ['getvolumename', [json]],
      ['attach', [json, 'warm-node']],
      ['isattached', [json, 'warm-node']],
    ];
    for (let round = 0; round < 3; round++) {
      for (const [op, argv] of calls) {
        const log = {};
        let logFile: { logFile: string; logMaxBytes: number } | undefined;
        const reply = await answerCall(op, argv, log, (c) => (logFile = c), env);
        if (logFile) writeLog(logFile, { op, args: redactArgs(argv), ...log, status: reply.status }, op !== 'init');
        encodeReply(reply);
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

warmConfigSchema();
warmOptionsSchema();
// Evaluate the op modules too (their imports of the stores stay lazy), then compile the hot paths.
void Promise.all(Object.values(OPS).map((load) => load()))
  .then(compileHotPaths)
  .then(() => {
    startupSnapshot.setDeserializeMainFunction(() => main(process.argv));
  });
