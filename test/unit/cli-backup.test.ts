// latch backup and latch snapshot called as plain functions with a captured CommandIO: an idle loop volume backed up
// through a backup ticket served by an in-process job runner (which sets a loop device up: root), list, verify
// (intact and damaged, with the exit code), delete, and the refusals: no target configured, a volume that does not
// exist, a backup that does not exist.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { closeSync, mkdirSync, mkdtempSync, openSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { chunkPath } from '../../src/backup/layout.js';
import { readManifest } from '../../src/backup/manifest.js';
import { backupCreate } from '../../src/cli/backup/create.js';
import { backupDelete } from '../../src/cli/backup/delete.js';
import { backupList } from '../../src/cli/backup/list.js';
import { backupVerify } from '../../src/cli/backup/verify.js';
import type { CommandIO } from '../../src/cli/io.js';
import { snapshotList } from '../../src/cli/snapshot/list.js';
import { parseConfig } from '../../src/config.js';
import { createContext, type Context } from '../../src/context.js';
import { withJobRunner } from '../fixtures/job-runner.js';
import { MemoryStore } from '../fixtures/memory-store.js';

const MiB = 1024 * 1024;

const notRoot = process.getuid?.() !== 0 ? 'needs root: the job runner sets a loop device up for the idle backup' : false;

describe('latch backup and latch snapshot commands', { skip: notRoot }, () => {
  let root = '';
  let target = '';
  let printed = '';
  const store = new MemoryStore();

  function ioFor(raw: Record<string, unknown>): CommandIO {
    const file = join(root, `config-${randomBytes(3).toString('hex')}.json`);
    writeFileSync(file, JSON.stringify(raw));
    return { out: (text) => (printed += text), env: { LATCH_CONFIG: file }, context: (c) => createContext(c, { store }) };
  }

  let io: CommandIO;
  let ctx: Context;

  before(async () => {
    root = mkdtempSync(join(tmpdir(), 'latch-cli-backup-'));
    target = join(root, 'target');
    mkdirSync(target);
    const raw = {
      nodeName: 'node-a',
      poolDir: join(root, 'pool'),
      stateDir: join(root, 'state'),
      logFile: join(root, 'latch.log'),
      backupTarget: { type: 'dir', path: target },
    };
    io = ioFor(raw);
    ctx = createContext(parseConfig(raw, 'test'), { store });
    await ctx.ledger.createVolume('vol', { sizeBytes: 64 * MiB, fsType: 'ext4' });
    await ctx.backend.create('vol', 64 * MiB);
    const fd = openSync(join(root, 'pool', 'vol.img'), 'r+');
    writeSync(fd, randomBytes(6 * MiB), 0, 6 * MiB, 10 * MiB);
    closeSync(fd);
  });
  after(() => {
    if (root) rmSync(root, { recursive: true, force: true });
  });

  it('backs an idle volume up through a ticket and lists it', async () => {
    printed = '';
    await withJobRunner(ctx, () => backupCreate({ volume: 'vol', name: 'b1', output: 'table' }, io));
    assert.match(
      printed,
      /^backup b1 of volume vol created \(idle\): 64Mi, 2 new chunk\(s\) \([0-9.]+\s?\S+ written\), 0 already in the target\n$/,
    );

    printed = '';
    await backupList({ output: 'table' }, io);
    assert.match(printed, /^NAME\s+VOLUME\s+SIZE/);
    assert.match(printed, /\nb1\s+vol\s+64Mi\s+8Mi/);
    printed = '';
    await backupList({ volume: 'other', output: 'json' }, io);
    assert.deepEqual(JSON.parse(printed), []);
  });

  it('verify exits 0 for an intact backup and 1, naming the chunk, for a damaged one; delete removes it', async () => {
    printed = '';
    assert.equal(await backupVerify({ name: 'b1', output: 'table' }, io), 0);
    assert.match(printed, /backup b1 of volume vol is intact: 2 chunk\(s\) read back/);

    const manifest = await readManifest({ type: 'dir', path: target }, 'b1');
    const index = manifest.chunks.findIndex((c) => c !== null);
    writeFileSync(chunkPath({ type: 'dir', path: target }, manifest.chunks[index] ?? ''), 'junk');
    printed = '';
    assert.equal(await backupVerify({ name: 'b1', output: 'table' }, io), 1);
    assert.match(printed, new RegExp(`is DAMAGED; it cannot be restored:\\n  chunk ${index} \\(\\w+\\): corrupt`));

    printed = '';
    await backupDelete({ name: 'b1' }, io);
    assert.match(printed, /backup b1 deleted; 2 chunk\(s\) no other backup needs were removed/);
    await assert.rejects(backupVerify({ name: 'b1', output: 'table' }, io), /backup b1 does not exist/);
  });

  it('refuses without a target, for a volume that does not exist, and for bad names', async () => {
    const noTarget = ioFor({
      nodeName: 'node-a',
      poolDir: join(root, 'pool'),
      stateDir: join(root, 'state'),
      logFile: join(root, 'l.log'),
    });
    await assert.rejects(backupList({ output: 'table' }, noTarget), /no backup target is configured: set "backupTarget"/);
    await assert.rejects(backupCreate({ volume: 'ghost', output: 'table' }, io), /volume ghost does not exist/);
    await assert.rejects(snapshotList({ volume: 'ghost', output: 'table' }, io), /volume ghost does not exist/);
    await assert.rejects(backupCreate({ volume: 'vol', name: 'Bad/Name', output: 'table' }, io), /backup name .* is not allowed/);
  });
});
