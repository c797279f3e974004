import assert from 'node:assert/strict';
import { execFile, execFileSync, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  chmodSync,
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  statfsSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { join, resolve } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { LoopBackend } from '../../src/backend/loop.js';
import { LatchError } from '../../src/errors.js';
import { blockDeviceSize } from '../../src/sys/blockdev.js';
import { listLoopDevices, loopDirectIo, setupLoop } from '../../src/sys/loop.js';
import { defined } from '../fixtures/defined.js';

const REPO = resolve(__dirname, '../..');
const MiB = 1024 * 1024;
const GiB = 1024 * MiB;
const notRoot = process.getuid?.() !== 0 ? 'needs root and loop devices' : false;

/** Detaches every loop device backed by a file under `dir` (and nothing else). */
function detachAllUnder(dir: string): void {
  const out = execFileSync('losetup', ['--list', '--noheadings', '--output', 'NAME,BACK-FILE'], { encoding: 'utf8' });
  for (const line of out.split('\n')) {
    const [name, ...rest] = line.trim().split(/\s+/);
    const file = rest.join(' ').replace(/ \(deleted\)$/, '');
    if (name && file.startsWith(`${dir}/`)) {
      try {
        execFileSync('losetup', ['-d', name], { stdio: 'ignore' });
      } catch {
        // already gone
      }
    }
  }
}

/** Unmounts every mount under `dir`, deepest first. */
function unmountAllUnder(dir: string): void {
  const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' ')[4] ?? '')
    .filter((m) => m.startsWith(`${dir}/`))
    .sort()
    .reverse();
  for (const m of mounts) execFileSync('umount', [m]);
}

const logicalBlockSize = (device: string) => Number(readFileSync(`/sys/block/${device.slice(5)}/queue/logical_block_size`, 'utf8'));

describe('LoopBackend', { skip: notRoot }, () => {
  let root = '';
  let pool = '';
  let backend: LoopBackend;

  before(() => {
    root = mkdtempSync(`/tmp/latch-backend-${randomBytes(3).toString('hex')}-`);
    pool = join(root, 'pool');
    backend = new LoopBackend({ poolDir: pool, maxSize: 1 * GiB });
  });

  after(() => {
    if (!root) return;
    unmountAllUnder(root);
    detachAllUnder(root);
    rmSync(root, { recursive: true, force: true });
  });

  it('creates a sparse 0600 image in a 0700 pool, idempotently', async () => {
    await backend.create('vol-a', 256 * MiB);
    assert.equal(statSync(pool).mode & 0o777, 0o700);
    const image = statSync(join(pool, 'vol-a.img'));
    assert.equal(image.size, 256 * MiB);
    assert.equal(image.mode & 0o777, 0o600);
    assert.ok(image.blocks * 512 < MiB, 'sparse');
    assert.equal(await backend.size('vol-a'), 256 * MiB);
    assert.equal(await backend.size('vol-none'), undefined);

    await backend.create('vol-a', 256 * MiB);
    await backend.create('vol-a', 100 * MiB);
    await assert.rejects(backend.create('vol-a', 512 * MiB), /already exists with 256Mi, less than the requested 512Mi/);
    assert.equal(await backend.size('vol-a'), 256 * MiB);
  });

  it('concurrent creates of one volume neither clobber nor fail', async () => {
    await Promise.all(Array.from({ length: 8 }, () => backend.create('vol-race', 64 * MiB)));
    assert.equal(await backend.size('vol-race'), 64 * MiB);
    await backend.delete('vol-race');
  });

  it('refuses bad names and sizes above maxSize or the free space', async () => {
    await assert.rejects(backend.create('../etc', MiB), LatchError);
    await assert.rejects(backend.create('Vol', MiB), LatchError);
    await assert.rejects(backend.attach('a/b'), LatchError);
    await assert.rejects(backend.create('vol-b', 0), LatchError);
    await assert.rejects(backend.create('vol-b', 2 * GiB), /requested size 2Gi is above the limit of 1Gi \(maxSize\)/);

    const free = statfsSync(root);
    const available = free.bavail * free.bsize;
    const roomy = new LoopBackend({ poolDir: pool, maxSize: 2 ** 52 });
    const tooBig = Math.ceil(available / GiB) * GiB + 16 * GiB;
    await assert.rejects(roomy.create('vol-b', tooBig), /is above the .* available in the pool/);
    assert.equal(await backend.size('vol-b'), undefined);
  });

  it('attach returns one device per image, however often and however concurrently it is called', async () => {
    const first = await backend.attach('vol-a');
    assert.match(first, /^\/dev\/loop[0-9]+$/);
    assert.equal(await backend.attach('vol-a'), first);
    assert.equal(await backend.findDevice('vol-a'), first);

    const all = await Promise.all(Array.from({ length: 6 }, () => backend.attach('vol-a')));
    assert.deepEqual(new Set(all), new Set([first]));
    const image = join(pool, 'vol-a.img');
    assert.equal((await listLoopDevices()).filter((d) => d.backingFile === image).length, 1);
  });

  it("a device's set-up removes the temp files that killed creates of the volume left, and nothing else", async () => {
    await backend.create('vol-temps', 64 * MiB);
    // What a create killed between its temp file and the temp's removal leaves (src/backend/loop.ts, create).
    const dead = spawnSync('true').pid ?? 1_999_999; // a pid that has exited
    const left = join(pool, `.vol-temps.img.${dead}.0a1b2c3d.tmp`);
    const live = join(pool, `.vol-temps.img.${process.pid}.0a1b2c3d.tmp`); // a create still running
    const other = join(pool, `.vol-other.img.${dead}.0a1b2c3d.tmp`); // another volume's
    for (const file of [left, live, other]) writeFileSync(file, '');
    try {
      await backend.attach('vol-temps');
      assert.equal(existsSync(left), false, "the dead writer's temp file is gone");
      assert.equal(existsSync(live), true, "a live writer's stays");
      assert.equal(existsSync(other), true, "another volume's stays");
    } finally {
      for (const file of [live, other]) rmSync(file, { force: true });
      await backend.release('vol-temps');
    }
  });

  it('concurrent attaches from several processes converge on exactly one device', async () => {
    await backend.create('vol-c', 32 * MiB);
    const script = join(root, 'attach.ts');
    writeFileSync(
      script,
      `import { LoopBackend } from ${JSON.stringify(join(REPO, 'src/backend/loop'))};\n` +
        `(async () => {\n` +
        `  const b = new LoopBackend({ poolDir: ${JSON.stringify(pool)}, maxSize: ${GiB} });\n` +
        `  const devices = await Promise.all([b.attach('vol-c'), b.attach('vol-c')]);\n` +
        `  process.stdout.write(JSON.stringify(devices));\n` +
        `})().catch((e) => { process.stdout.write(JSON.stringify({ error: String(e) })); process.exitCode = 1; });\n`,
    );
    const run = promisify(execFile);
    const results = await Promise.all(
      Array.from({ length: 6 }, () => run(process.execPath, ['--import', 'tsx', script], { cwd: REPO, timeout: 60_000 })),
    );
    const devices = results.flatMap((r) => JSON.parse(r.stdout) as string[]);
    const image = join(pool, 'vol-c.img');
    // Losers of the race may still be detaching with autoclear while udev closes them: give it a moment.
    let backed = (await listLoopDevices()).filter((d) => d.backingFile === image);
    for (let i = 0; i < 40 && backed.length > 1; i++) {
      await new Promise((r) => setTimeout(r, 50));
      backed = (await listLoopDevices()).filter((d) => d.backingFile === image);
    }
    assert.equal(backed.length, 1, JSON.stringify(backed));
    assert.deepEqual(new Set(devices), new Set([backed[0]!.device]));
    await backend.release('vol-c');
    await backend.delete('vol-c');
  });

  it('volumeOfDevice knows our devices and nothing else', async () => {
    const ours = await backend.attach('vol-a');
    assert.equal(await backend.volumeOfDevice(ours), 'vol-a');
    assert.equal(await backend.volumeOfDevice('/dev/vda'), undefined);
    assert.equal(await backend.volumeOfDevice('/dev/loop999'), undefined);
    assert.equal(await backend.volumeOfDevice('not-a-path'), undefined);

    // A loop device over a file outside the pool, and over files inside it that are not images of ours.
    const foreignDir = join(root, 'elsewhere');
    mkdirSync(foreignDir);
    const foreignFile = join(foreignDir, 'vol-a.img');
    execFileSync('truncate', ['-s', '8M', foreignFile]);
    const nested = join(pool, 'nested');
    mkdirSync(nested);
    const nestedFile = join(nested, 'vol-a.img');
    execFileSync('truncate', ['-s', '8M', nestedFile]);
    const foreign = await setupLoop(foreignFile);
    const nestedDevice = await setupLoop(nestedFile);
    try {
      assert.equal(await backend.volumeOfDevice(foreign), undefined);
      assert.equal(await backend.volumeOfDevice(nestedDevice), undefined);
      assert.equal(await backend.findDevice('vol-a'), ours);

      // release is idempotent and leaves foreign devices alone.
      await backend.release('vol-a');
      await backend.release('vol-a');
      assert.equal(await backend.findDevice('vol-a'), undefined);
      assert.equal(await backend.volumeOfDevice(ours), undefined);
      const remaining = (await listLoopDevices()).map((d) => d.device);
      assert.ok(remaining.includes(foreign), 'foreign device untouched');
      assert.ok(remaining.includes(nestedDevice), 'nested device untouched');
      await backend.release('vol-never-created');
    } finally {
      execFileSync('losetup', ['-d', foreign]);
      execFileSync('losetup', ['-d', nestedDevice]);
    }
  });

  it('grow refuses to shrink or exceed the limits, and refreshes the device size', async () => {
    const device = await backend.attach('vol-a');
    assert.equal(await blockDeviceSize(device), 256 * MiB);
    await assert.rejects(backend.grow('vol-a', 128 * MiB), /cannot shrink from 256Mi to 128Mi/);
    await assert.rejects(backend.grow('vol-a', 2 * GiB), /above the limit of 1Gi/);
    await assert.rejects(backend.grow('vol-none', 512 * MiB), /has no image/);

    await backend.grow('vol-a', 512 * MiB);
    assert.equal(await backend.size('vol-a'), 512 * MiB);
    assert.equal(await blockDeviceSize(device), 512 * MiB);
    await backend.grow('vol-a', 512 * MiB); // same size again: no-op
    assert.equal(await backend.findDevice('vol-a'), device);

    // Grown while detached: the next attach simply sees the new size.
    await backend.release('vol-a');
    await backend.grow('vol-a', 768 * MiB);
    const again = await backend.attach('vol-a');
    assert.equal(await blockDeviceSize(again), 768 * MiB);
  });

  it('delete is refused while attached, then removes the image; a missing volume is a no-op', async () => {
    const device = await backend.attach('vol-a');
    await assert.rejects(backend.delete('vol-a'), new RegExp(`still set up as ${device}`));
    assert.notEqual(await backend.size('vol-a'), undefined);
    await backend.release('vol-a');
    await backend.delete('vol-a');
    assert.equal(await backend.size('vol-a'), undefined);
    await backend.delete('vol-a');
    await assert.rejects(backend.attach('vol-a'), /has no image in the pool/);
  });

  it('a pool that does not exist yet owns no devices', async () => {
    const empty = new LoopBackend({ poolDir: join(root, 'no-pool'), maxSize: GiB });
    assert.equal(await empty.findDevice('vol-a'), undefined);
    assert.equal(await empty.size('vol-a'), undefined);
    await empty.release('vol-a');
    await empty.delete('vol-a');
  });

  it('proves a fresh image blank, and nothing else: not once a byte is written (synced or not), nor after mkfs', async () => {
    await backend.create('vol-blank', 64 * MiB);
    await backend.create('vol-other', 64 * MiB);
    const device = await backend.attach('vol-blank');
    const other = await backend.attach('vol-other');
    assert.equal(await backend.isBlank('vol-blank', device), true);
    assert.equal(await backend.isBlank('vol-blank', other), false, "another volume's device");
    assert.equal(await backend.isBlank('vol-blank', '/dev/loop999999'), false, 'a device that is not set up');

    // One byte written through the device and left in its page cache (the descriptor stays open, nothing synced).
    const fd = openSync(device, 'r+');
    try {
      writeSync(fd, Buffer.from([1]), 0, 1, 40 * MiB);
      assert.equal(await backend.isBlank('vol-blank', device), false);
    } finally {
      closeSync(fd);
    }

    execFileSync('mkfs.ext4', ['-q', '-F', '-E', 'lazy_itable_init=1,lazy_journal_init=1', other]);
    assert.equal(await backend.isBlank('vol-other', other), false, 'a formatted device');

    await backend.release('vol-blank');
    await backend.release('vol-other');
    await backend.delete('vol-blank');
    await backend.delete('vol-other');
  });

  it('proves nothing for a device whose image was replaced under it', async () => {
    await backend.create('vol-swap', 64 * MiB);
    const device = await backend.attach('vol-swap');
    const image = join(pool, 'vol-swap.img');
    renameSync(image, `${image}.old`);
    execFileSync('truncate', ['-s', '64M', image]);
    assert.equal(statSync(image).blocks, 0);
    assert.equal(await backend.isBlank('vol-swap', device), false, 'the device still reads the old image');
    await backend.release('vol-swap');
    rmSync(`${image}.old`);
    await backend.delete('vol-swap');
  });

  it('sets the device up with direct I/O on the image and 512-byte sectors: reads leave no copy of the image cached', async () => {
    await backend.create('vol-dio', 64 * MiB);
    const device = await backend.attach('vol-dio');
    assert.equal(await loopDirectIo(device), true);
    assert.equal(logicalBlockSize(device), 512);
    const image = join(pool, 'vol-dio.img');
    execFileSync('dd', [`if=${image}`, 'iflag=nocache', 'count=0', 'status=none']); // drop what create() cached
    execFileSync('dd', [`if=${device}`, 'of=/dev/null', 'bs=1M', 'count=16', 'status=none']);
    const cached = Number(execFileSync('fincore', ['--bytes', '--noheadings', '--output', 'RES', image], { encoding: 'utf8' }).trim());
    assert.equal(cached, 0, 'the image pages the read went through are not in the page cache');
    await backend.release('vol-dio');
    await backend.delete('vol-dio');
  });

  it('on a pool disk with 4096-byte sectors the device keeps 512-byte sectors (and the kernel keeps it buffered)', async () => {
    const disk = join(root, 'disk4k.img');
    execFileSync('truncate', ['-s', '128M', disk]);
    const diskDevice = await setupLoop(disk, { sectorSize: 4096 });
    assert.equal(logicalBlockSize(diskDevice), 4096);
    execFileSync('mkfs.ext4', ['-q', '-F', diskDevice]);
    const mnt = join(root, 'pool4k');
    mkdirSync(mnt);
    execFileSync('mount', [diskDevice, mnt]);
    try {
      const onDisk4k = new LoopBackend({ poolDir: join(mnt, 'pool'), maxSize: GiB });
      await onDisk4k.create('vol-4k', 32 * MiB);
      const device = await onDisk4k.attach('vol-4k');
      assert.equal(logicalBlockSize(device), 512, 'the volume has the geometry a buffered loop device would give it');
      assert.equal(await loopDirectIo(device), false, 'O_DIRECT at 512 bytes is not possible on a 4096-byte disk');
      execFileSync('mkfs.ext4', ['-q', '-F', device]); // and the device works
      await onDisk4k.release('vol-4k');
    } finally {
      execFileSync('umount', [mnt]);
      execFileSync('losetup', ['-d', diskDevice]);
    }
  });

  it('where losetup refuses --direct-io, the device is set up without it', async () => {
    const real = execFileSync('sh', ['-c', 'PATH=$PATH:/usr/sbin:/sbin command -v losetup'], { encoding: 'utf8' }).trim();
    const fakeDir = join(root, 'fake-tools');
    mkdirSync(fakeDir, { recursive: true });
    const calls = join(root, 'losetup-calls');
    writeFileSync(
      join(fakeDir, 'losetup'),
      `#!/bin/sh\necho "$*" >> ${calls}\nfor a in "$@"; do [ "$a" = --direct-io=on ] && { echo "losetup: set direct io failed" >&2; exit 1; }; done\nexec ${real} "$@"\n`,
    );
    chmodSync(join(fakeDir, 'losetup'), 0o755);
    await backend.create('vol-nodio', 32 * MiB);
    const path = process.env.PATH;
    process.env.PATH = `${fakeDir}:${path ?? ''}`;
    let device: string;
    try {
      device = await backend.attach('vol-nodio');
    } finally {
      process.env.PATH = path;
    }
    const tried = readFileSync(calls, 'utf8').trim().split('\n');
    assert.equal(tried.length, 2, tried.join('; '));
    assert.match(defined(tried[0]), /--direct-io=on/);
    assert.doesNotMatch(defined(tried[1]), /--direct-io/);
    assert.equal(await loopDirectIo(device), false);
    assert.equal(await backend.findDevice('vol-nodio'), device);
    await backend.release('vol-nodio');
    await backend.delete('vol-nodio');
  });
});
