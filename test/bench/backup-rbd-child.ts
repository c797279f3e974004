// One backup or restore of the rbd backup benchmark (backup-rbd.ts), in a process of its own so that its peak memory
// (maxRSS) is its own. Prints one JSON line: the outcome and the process's peak resident set in bytes.
import { RbdBackend } from '../../src/backend/rbd.js';
import { restoreBackup } from '../../src/backup/restore.js';
import { parseConfig } from '../../src/config.js';
import { createContext } from '../../src/context.js';
import { incrementalBackup } from '../../src/node/backup.js';
import { MemoryStore } from '../fixtures/memory-store.js';

export interface ChildJob {
  /** noop: the same process with the same modules loaded, for the baseline of peak memory. */
  op: 'backup' | 'restore' | 'noop';
  pool: string;
  cephConf: string;
  clientId: string;
  keyring: string;
  mountDir: string;
  work: string;
  target: string;
  volume: string;
  sizeBytes: number;
  name: string;
}

async function main(): Promise<void> {
  const job = JSON.parse(process.argv[2] ?? '{}') as ChildJob;
  const backend = new RbdBackend({
    pool: job.pool,
    cephConf: job.cephConf,
    clientId: job.clientId,
    keyring: job.keyring,
    mountDir: job.mountDir,
    maxSize: 64 * 1024 ** 3,
    timeoutMs: 60_000,
  });
  const target = { type: 'dir' as const, path: job.target };
  const started = performance.now();
  let result: Record<string, unknown>;
  if (job.op === 'noop') {
    result = {};
  } else if (job.op === 'backup') {
    const raw = { nodeName: 'node-a', poolDir: `${job.work}/pool`, stateDir: `${job.work}/state`, logFile: `${job.work}/latch.log` };
    const ctx = createContext(parseConfig(raw, `${job.work}/config.json`), { store: new MemoryStore(), backend });
    await ctx.ledger.createVolume(job.volume, { sizeBytes: job.sizeBytes, fsType: 'ext4' });
    const made = await incrementalBackup(ctx, { target, volume: job.volume, name: job.name, node: 'node-a' });
    result = { bytesRead: made.bytesRead, base: made.base, stats: made.manifest.stats };
  } else {
    await backend.create(job.volume, job.sizeBytes);
    const device = await backend.attach(job.volume);
    try {
      const report = await restoreBackup({ target, name: job.name, destination: device, fresh: true });
      result = { dataChunks: report.dataChunks, bytesWritten: report.bytesWritten };
    } finally {
      await backend.release(job.volume);
    }
  }
  const ms = performance.now() - started;
  process.stdout.write(`${JSON.stringify({ ...result, ms, maxRssBytes: process.resourceUsage().maxRSS * 1024 })}\n`);
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
