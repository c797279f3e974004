// Reloading a file's page cache (src/sys/page-cache.ts): the cached pages are dropped and read back from the disk,
// the whole file is cached afterwards, and a file that cannot be reloaded is reported, never thrown. What it buys (a
// driver call's page faults and time) is measured by the bench, not here.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { closeSync, fsyncSync, mkdtempSync, openSync, readFileSync, rmSync, statfsSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { reloadPageCache } from '../../src/sys/page-cache.js';

const TMPFS_MAGIC = 0x01021994;
const work = mkdtempSync(join(tmpdir(), 'latch-page-cache-'));
after(() => rmSync(work, { recursive: true, force: true }));

/** Bytes this process has had read from storage, its threads included (/proc/self/io). */
function readBytes(): number | undefined {
  try {
    return Number(/^read_bytes: (\d+)$/m.exec(readFileSync('/proc/self/io', 'utf8'))?.[1]);
  } catch {
    return undefined;
  }
}

function skipReason(): string | undefined {
  if (statfsSync(work).type === TMPFS_MAGIC) return `${tmpdir()} is tmpfs: its pages are the data and cannot be dropped`;
  if (readBytes() === undefined) return 'no /proc/self/io (a kernel without task I/O accounting)';
  if (spawnSync('fincore', ['--version']).status !== 0) return 'fincore is not installed (util-linux)';
  return undefined;
}

describe('reloadPageCache', () => {
  it('drops what is cached and reads the whole file back from the disk', { skip: skipReason() }, async () => {
    const file = join(work, 'executable');
    const size = 16 * 1024 * 1024;
    const fd = openSync(file, 'w');
    for (let written = 0; written < size; written += 1024 * 1024) writeSync(fd, Buffer.alloc(1024 * 1024, written & 0xff));
    fsyncSync(fd);
    closeSync(fd);
    readFileSync(file); // all of it cached: without a drop, reading it again would read nothing from the disk

    const before = readBytes() ?? 0;
    assert.deepEqual(await reloadPageCache([file]), { reloaded: true });
    const fromDisk = (readBytes() ?? 0) - before;
    assert.ok(fromDisk >= size, `read ${fromDisk} bytes from the disk, not the whole ${size}: the cached pages were not dropped`);
    const resident = Number(spawnSync('fincore', ['--bytes', '--noheadings', '--output', 'RES', file], { encoding: 'utf8' }).stdout.trim());
    assert.equal(resident, size);
  });

  it('reports a file it cannot reload, without throwing, and goes no further', async () => {
    const missing = join(work, 'missing');
    const result = await reloadPageCache([missing, join(work, 'never-reached')]);
    assert.equal(result.reloaded, false);
    assert.match(result.reloaded ? '' : result.reason, /missing/);
  });
});
