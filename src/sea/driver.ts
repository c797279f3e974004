// The driver calls' code in bin/latch-sea (src/sea/load.ts): the call itself, and the warm-up that the build runs
// before it takes this bundle's V8 code cache. Admin commands run the whole of latch from another asset (src/bin.ts).
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { encodeReply } from '../contract/reply.js';
import { redactArgs, writeLog } from '../log.js';
import { answerCall } from '../protocol/driver.js';

export { runDriverCall } from '../protocol/driver.js';

/**
 * Answers the control plane's calls (init, getvolumename, attach, isattached: the ones KCM and kubelet make all
 * the time) a few times on a scratch configuration and ledger, so that V8 compiles their whole path (config and
 * options parsing, the file store, the ledger, the log line) here, once, and the code cache taken afterwards holds
 * its bytecode. Nothing of the build host stays: the cache is code, not data, and the scratch directory is removed.
 * These calls run no child process.
 */
export async function warmUp(): Promise<void> {
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
