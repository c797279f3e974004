// Real mounts (root, loop devices): a loop device mounted, seen in mountinfo and findmnt, bind-mounted read-only,
// unmounted idempotently. Parsing mountinfo is in test/unit/sys-mounts.test.ts.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { blockDeviceSize, makeFs, probeFsType } from '../../src/sys/blockdev.js';
import { detachLoop, setupLoop } from '../../src/sys/loop.js';
import { bindMount, isMountPoint, mount, mountsAt, umount } from '../../src/sys/mounts.js';
import { findmnt } from '../fixtures/findmnt.js';

const notRoot = process.getuid?.() !== 0 ? 'needs root and loop devices' : false;

describe('real mounts', { skip: notRoot }, () => {
  it('mounts a loop device, sees it in mountinfo and findmnt, bind-mounts read-only, unmounts idempotently', async () => {
    const dir = mkdtempSync(`/tmp/latch-mounts-${randomBytes(3).toString('hex')}-`);
    const image = join(dir, 'disk.img');
    const target = join(dir, 'mnt with space');
    const bind = join(dir, 'bind');
    const mounted: string[] = [];
    let device: string | undefined;
    try {
      writeFileSync(image, '');
      execFileSync('truncate', ['-s', '64M', image]);
      mkdirSync(target);
      mkdirSync(bind);
      device = await setupLoop(image);
      assert.equal(await blockDeviceSize(device), 64 * 1024 * 1024);
      assert.equal(await probeFsType(device), undefined);
      await makeFs(device, 'ext4');
      assert.equal(await probeFsType(device), 'ext4');

      assert.equal(await isMountPoint(target), false);
      assert.equal(await findmnt(target), undefined);
      await mount(device, target, { fsType: 'ext4', options: ['noatime'] });
      mounted.push(target);

      const entries = await mountsAt(target);
      assert.equal(entries.length, 1);
      assert.equal(entries[0]!.source, device);
      assert.equal(entries[0]!.fsType, 'ext4');
      assert.equal(entries[0]!.mountPoint, target);
      assert.ok(entries[0]!.options.includes('noatime'));
      assert.equal(await isMountPoint(`${target}/`), true);

      const found = await findmnt(target);
      assert.ok(found);
      assert.equal(found.source, device);
      assert.equal(found.target, target);
      assert.equal(found.fsType, 'ext4');
      assert.ok(found.options.includes('rw'));

      await bindMount(target, bind, true);
      mounted.push(bind);
      const bound = await findmnt(bind);
      assert.equal(bound?.source, device);
      assert.ok(bound?.options.includes('ro'), `read-only bind: ${bound?.options.join(',')}`);
      assert.throws(() => writeFileSync(join(bind, 'x'), 'x'), /EROFS/);
      writeFileSync(join(target, 'x'), 'x'); // the original stays writable

      assert.equal(await umount(bind), true);
      mounted.pop();
      assert.equal(await umount(bind), false, 'not mounted is success');
      assert.equal(await umount(join(dir, 'missing')), false, 'missing directory is success');

      // Read-only mount of the device itself.
      assert.equal(await umount(target), true);
      mounted.pop();
      await mount(device, target, { fsType: 'ext4', readOnly: true });
      mounted.push(target);
      assert.ok((await findmnt(target))?.options.includes('ro'));
      assert.equal(await umount(target), true);
      mounted.pop();
      assert.equal(await isMountPoint(target), false);
    } finally {
      for (const path of mounted.reverse()) {
        try {
          execFileSync('umount', [path], { stdio: 'ignore' });
        } catch {
          // already gone
        }
      }
      if (device) await detachLoop(device, image).catch(() => undefined);
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
