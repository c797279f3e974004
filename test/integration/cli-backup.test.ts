// latch backup and latch snapshot called as plain functions with a captured CommandIO: an idle loop volume backed up
// through a backup ticket served by an in-process job runner (which sets a loop device up: root), list, verify
// (intact and damaged, with the exit code), delete, and the refusals: no target configured, a volume that does not
// exist, a backup that does not exist; with a backup key (backupTarget.keyFile): an older unauthenticated backup is
// listed as such, refused by verify until `latch backup authenticate` signs it, and a key file others can read is refused.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { chmodSync, closeSync, mkdirSync, mkdtempSync, openSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { chunkPath } from '../../src/backup/layout.js';
import { readManifest } from '../../src/backup/manifest.js';
import { backupAuthenticate } from '../../src/cli/backup/authenticate.js';
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
  let raw: Record<string, unknown>;

  before(async () => {
    root = mkdtempSync(join(tmpdir(), 'latch-cli-backup-'));
    target = join(root, 'target');
    mkdirSync(target);
    raw = {
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
    // No key configured: the manifest has an unkeyed checksum, and the list says it is not authenticated.
    assert.match(printed, /^NAME\s+VOLUME\s+SIZE\s+DATA\s+STORED\s+CREATED\s+AUTHENTICATED\s+PARENT\n/);
    assert.match(printed, /\nb1\s+vol\s+64Mi\s+8Mi\s+\S+\s+\S+\s+NO\s+-\n/);
    printed = '';
    await backupList({ volume: 'other', output: 'json' }, io);
    assert.deepEqual(JSON.parse(printed), []);
  });

  it('verify exits 0 for an intact backup and 1, naming the chunk, for a damaged one; delete removes it', async () => {
    printed = '';
    assert.equal(await backupVerify({ name: 'b1', output: 'table' }, io), 0);
    assert.match(
      printed,
      /backup b1 of volume vol is intact: 2 chunk\(s\) read back, image checksum matches; its manifest is UNAUTHENTICATED/,
    );

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

  it('with a backup key, an older backup is listed as unauthenticated and refused by verify until authenticate signs it', async () => {
    await withJobRunner(ctx, () => backupCreate({ volume: 'vol', name: 'old', output: 'json' }, io));
    const keyFile = join(root, 'backup.key');
    writeFileSync(keyFile, `${randomBytes(48).toString('base64')}\n`, { mode: 0o600 });
    const keyed = ioFor({ ...raw, backupTarget: { type: 'dir', path: target, keyFile } });

    printed = '';
    await backupList({ output: 'json' }, keyed);
    assert.deepEqual(
      (JSON.parse(printed) as { name: string; authenticated: boolean }[]).map((b) => [b.name, b.authenticated]),
      [['old', false]],
    );
    await assert.rejects(backupVerify({ name: 'old', output: 'table' }, keyed), /is not authenticated .* latch backup authenticate old/);

    printed = '';
    assert.equal(await backupAuthenticate({ name: 'old' }, keyed), 0);
    assert.match(printed, /^backup old is intact \(2 chunk\(s\) read back\) and its manifest is now authenticated by the backup key\n$/);
    printed = '';
    assert.equal(await backupVerify({ name: 'old', output: 'table' }, keyed), 0);
    assert.match(printed, /is intact: .*, manifest authenticated by the backup key\n$/);
    printed = '';
    await backupList({ output: 'table' }, keyed);
    assert.match(printed, /\nold\s+vol\s+64Mi\s+8Mi\s+\S+\s+\S+\s+yes\s+-\n/);
    // Signed now: without the key it cannot be checked.
    await assert.rejects(backupVerify({ name: 'old', output: 'table' }, io), /no backup key is configured here/);

    // The configuration takes an absolute path only.
    const relative = ioFor({ ...raw, backupTarget: { type: 'dir', path: target, keyFile: 'backup.key' } });
    await assert.rejects(backupList({ output: 'table' }, relative), /backupTarget\.keyFile.*must be an absolute path/);

    chmodSync(keyFile, 0o644);
    await assert.rejects(backupList({ output: 'table' }, keyed), /backup key file .* is readable or writable by others \(mode 644\)/);
    chmodSync(keyFile, 0o600);
    await backupDelete({ name: 'old' }, keyed);
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
