// A device is freed only once no filesystem writes through it (src/sys/blockdev.ts, waitNoFilesystemLeft), against a
// fake sysfs: the last request of a clean unmount still in flight for a moment is waited for; one that stays (the
// storage stalled), or a filesystem still registered on the device, is refused once the settle time is over.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { waitNoFilesystemLeft } from '../../src/sys/blockdev.js';

const roots: string[] = [];
after(() => roots.forEach((r) => rmSync(r, { recursive: true, force: true })));

/** A fake /sys with loop7's in-flight counts (reads, writes). */
function fakeSys(inflight: string): string {
  const root = mkdtempSync(join(tmpdir(), 'latch-sys-'));
  roots.push(root);
  mkdirSync(join(root, 'block', 'loop7'), { recursive: true });
  writeFileSync(join(root, 'block', 'loop7', 'inflight'), inflight);
  return root;
}

describe('freeing a device under a filesystem being unmounted', () => {
  it('goes on at once when nothing is in flight and no filesystem is registered', async () => {
    const sysRoot = fakeSys('       0        0\n');
    const started = Date.now();
    await waitNoFilesystemLeft('/dev/loop7', 'dev', { sysRoot, settleMs: 5000 });
    assert.ok(Date.now() - started < 1000);
  });

  it('waits for a request that lands within the settle time', async () => {
    const sysRoot = fakeSys('       0        1\n');
    const landed = setTimeout(() => writeFileSync(join(sysRoot, 'block', 'loop7', 'inflight'), '0 0\n'), 300);
    const started = Date.now();
    await waitNoFilesystemLeft('/dev/loop7', 'dev', { sysRoot, settleMs: 5000 });
    clearTimeout(landed);
    assert.ok(Date.now() - started >= 250, 'it waited for the request');
  });

  it('refuses once the settle time is over while a request stays in flight, or a filesystem is still registered', async () => {
    const stalled = fakeSys('0 1\n');
    await assert.rejects(
      waitNoFilesystemLeft('/dev/loop7', '/dev/loop7 of latch/v', { sysRoot: stalled, settleMs: 200 }),
      /\/dev\/loop7 of latch\/v is still in use by a filesystem being unmounted \(1 request\(s\) waiting on the storage\); try again/,
    );
    const registered = fakeSys('0 0\n');
    mkdirSync(join(registered, 'fs', 'ext4', 'loop7'), { recursive: true });
    await assert.rejects(
      waitNoFilesystemLeft('/dev/loop7', 'dev', { sysRoot: registered, settleMs: 200 }),
      /^LatchError: dev is still in use by a filesystem being unmounted; try again/,
    );
  });
});
