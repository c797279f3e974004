// A shared volume's files as a backup image and back (src/node/shared-files.ts), on plain directories: the archive
// round-trips directories, files (sparse ones stay sparse), symbolic and hard links, owners, modes and times; its
// size bound holds; and a restore refuses every hostile entry (a path with .., an absolute path, a symbolic link out
// of the root, a device node, a FIFO, a hard link out of the root, a path through a symbolic link, an entry made twice)
// without writing outside the root.
import assert from 'node:assert/strict';
import {
  existsSync,
  lstatSync,
  mkdirSync,
  readFileSync,
  readlinkSync,
  statSync,
  symlinkSync,
  writeFileSync,
  linkSync,
  chmodSync,
  openSync,
  closeSync,
  ftruncateSync,
  writeSync,
} from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { pack as makePack, type Header } from 'tar-stream';

type Headers = Partial<Header> & Pick<Header, 'name'>;
import { checkEntryPath, checkSymlinkTarget, extractTree, listTree, streamChunkSource } from '../../src/node/shared-files.js';
import { archiveImage, scratchRoots, once } from '../fixtures/shared-archive.js';
import { memoryXattrs } from '../fixtures/memory-xattrs.js';

/** The image a backup would store: the chunk source read to its end, chunk by chunk (holes as zeros). */
async function imageOf(root: string): Promise<{ image: Buffer; bound: number; dataEnd: number }> {
  const xattrs = memoryXattrs();
  const listing = await listTree(root, xattrs);
  return { ...(await archiveImage(root, listing, xattrs)), bound: listing.sizeBound };
}

/** A tar archive of the given entries, as a hostile target could hold it. */
async function archive(entries: { header: Headers; body?: string }[]): Promise<Buffer> {
  const pack = makePack();
  for (const e of entries) pack.entry(e.header, e.body ?? '');
  pack.finalize();
  const parts: Buffer[] = [];
  for await (const part of pack) parts.push(part as Buffer);
  return Buffer.concat(parts);
}

describe('shared volume archives', () => {
  const fresh = scratchRoots('latch-shared-files-');

  it('round-trips files, directories, links, owners, modes, times, and keeps sparse files sparse', async () => {
    const src = fresh();
    mkdirSync(join(src, 'dir', 'deep'), { recursive: true });
    writeFileSync(join(src, 'dir', 'a.txt'), 'alpha\n');
    chmodSync(join(src, 'dir', 'a.txt'), 0o640);
    writeFileSync(join(src, 'dir', 'deep', 'b.bin'), Buffer.alloc(300_000, 9));
    symlinkSync('../dir/a.txt', join(src, 'dir', 'deep', 'to-a'));
    linkSync(join(src, 'dir', 'a.txt'), join(src, 'hard-a'));
    // 8 MiB with 4 KiB of data in the middle.
    const fd = openSync(join(src, 'sparse'), 'w');
    ftruncateSync(fd, 8 * 1024 * 1024);
    writeSync(fd, Buffer.alloc(4096, 1), 0, 4096, 4 * 1024 * 1024);
    closeSync(fd);
    const { image, bound, dataEnd } = await imageOf(src);
    assert.equal(image.length, bound);
    assert.ok(dataEnd <= bound, `the archive (${dataEnd}) stays within its bound (${bound})`);

    const dst = fresh();
    const report = await extractTree(once(image), dst, memoryXattrs());
    assert.deepEqual(
      { ...report, bytes: undefined },
      { files: 3, directories: 2, symlinks: 1, hardLinks: 1, bytes: undefined, xattrEntries: 0, skippedXattrs: 0, skippedXattrsSample: [] },
    );
    assert.equal(readFileSync(join(dst, 'dir', 'a.txt'), 'utf8'), 'alpha\n');
    assert.equal(statSync(join(dst, 'dir', 'a.txt')).mode & 0o777, 0o640);
    assert.ok(readFileSync(join(dst, 'dir', 'deep', 'b.bin')).equals(Buffer.alloc(300_000, 9)));
    assert.equal(readlinkSync(join(dst, 'dir', 'deep', 'to-a')), '../dir/a.txt');
    assert.equal(statSync(join(dst, 'hard-a')).ino, statSync(join(dst, 'dir', 'a.txt')).ino, 'the hard link is one file again');
    assert.equal(
      statSync(join(dst, 'dir', 'deep')).mtimeMs,
      Math.floor(statSync(join(src, 'dir', 'deep')).mtimeMs / 1000) * 1000,
      'a directory keeps its time (to the second, as tar has it) after its contents were made',
    );
    const sparse = statSync(join(dst, 'sparse'));
    assert.equal(sparse.size, 8 * 1024 * 1024);
    assert.ok(sparse.blocks * 512 <= 256 * 1024, `the sparse file stays sparse (${sparse.blocks * 512} bytes allocated)`);
    assert.ok(
      readFileSync(join(dst, 'sparse'))
        .subarray(4 * 1024 * 1024, 4 * 1024 * 1024 + 4096)
        .equals(Buffer.alloc(4096, 1)),
    );
  });

  it('skips device nodes, FIFOs and sockets on a backup, and says so', async () => {
    const src = fresh();
    writeFileSync(join(src, 'kept'), 'x');
    const { run } = await import('../../src/sys/run.js');
    await run('mkfifo', [join(src, 'fifo')], { timeoutMs: 10_000 });
    await run('mknod', [join(src, 'null'), 'c', '1', '3'], { timeoutMs: 10_000 });
    const listing = await listTree(src, memoryXattrs());
    assert.deepEqual(
      listing.entries.map((e) => e.path.toString()),
      ['.', 'kept'],
    );
    assert.deepEqual(listing.skipped, [
      { path: 'fifo', kind: 'FIFO' },
      { path: 'null', kind: 'character device' },
    ]);
  });

  it('fails a backup whose archive would outgrow its bound, rather than cut it short', async () => {
    const source = streamChunkSource(once(Buffer.alloc(10_000, 1)), 8192);
    await source.chunk(0, 8192, Buffer.alloc(8192));
    await assert.rejects(source.finish(), /the archive outgrew its bound of 8192 bytes/);
  });

  const file = (name: string, body = 'x'): { header: Headers; body: string } => ({
    header: { name, type: 'file', size: Buffer.byteLength(body), mode: 0o644 },
    body,
  });

  /** Extracts `entries` into a fresh root inside a fresh parent; checks nothing appeared in the parent besides the root. */
  async function refusedWith(entries: { header: Headers; body?: string }[], why: RegExp): Promise<void> {
    const parent = fresh();
    const root = join(parent, 'root');
    mkdirSync(root);
    await assert.rejects(extractTree(once(await archive(entries)), root, memoryXattrs()), why);
    assert.deepEqual((await import('node:fs')).readdirSync(parent), ['root'], 'nothing was written outside the root');
  }

  it('refuses a path that climbs out with ..', async () => {
    await refusedWith([file('../escaped')], /"..\/escaped" climbs out of the volume with \.\./);
    await refusedWith([{ header: { name: 'd', type: 'directory', mode: 0o755 } }, file('d/../../escaped')], /climbs out of the volume/);
  });

  it('refuses an absolute path', async () => {
    await refusedWith([file('/tmp/latch-escaped')], /is an absolute path/);
    assert.equal(existsSync('/tmp/latch-escaped'), false);
  });

  it('refuses a symbolic link that escapes the root, absolute or relative', async () => {
    await refusedWith([{ header: { name: 'etc', type: 'symlink', linkname: '/etc' } }], /symbolic link to the absolute path "\/etc"/);
    await refusedWith([{ header: { name: 'up', type: 'symlink', linkname: '../..' } }], /symbolic link to "..\/..", outside the volume/);
    await refusedWith(
      [{ header: { name: 'd', type: 'directory', mode: 0o755 } }, { header: { name: 'd/up', type: 'symlink', linkname: '../../x' } }],
      /outside the volume/,
    );
  });

  it('never writes through a symbolic link, even one that points inside', async () => {
    await refusedWith(
      [
        { header: { name: 'sub', type: 'directory', mode: 0o755 } },
        { header: { name: 'l', type: 'symlink', linkname: 'sub' } },
        file('l/x'),
      ],
      /goes through "l", which is no directory in the archive/,
    );
  });

  it('refuses device nodes and FIFOs', async () => {
    await refusedWith(
      [{ header: { name: 'null', type: 'character-device', devmajor: 1, devminor: 3 } }],
      /is a character-device, which a restore never makes/,
    );
    await refusedWith([{ header: { name: 'sda', type: 'block-device', devmajor: 8, devminor: 0 } }], /is a block-device/);
    await refusedWith([{ header: { name: 'pipe', type: 'fifo' } }], /is a fifo/);
  });

  it('refuses a hard link to anything but a file restored inside the root, and an entry made twice', async () => {
    await refusedWith([{ header: { name: 'pw', type: 'link', linkname: '/etc/passwd' } }], /is an absolute path/);
    await refusedWith([{ header: { name: 'pw', type: 'link', linkname: '../x' } }], /climbs out/);
    await refusedWith([{ header: { name: 'pw', type: 'link', linkname: 'missing' } }], /which is no file restored here/);
    await refusedWith([file('twice'), file('twice')], /"twice" is made twice/);
    // A symbolic link first, then a file of the same name: never opened through the link.
    await refusedWith([{ header: { name: 'x', type: 'symlink', linkname: 'y' } }, file('x')], /"x" is made twice/);
  });

  it('checks paths and link targets by themselves', () => {
    const b = (s: string) => Buffer.from(s);
    assert.deepEqual(checkEntryPath(b('./a//b/./c')), b('a/b/c'));
    assert.throws(() => checkEntryPath(b('a/\0b')), /NUL/);
    assert.throws(() => checkEntryPath(b('./')), /names the root itself/);
    checkSymlinkTarget(b('a/b/link'), b('../c'));
    assert.throws(() => checkSymlinkTarget(b('a/link'), b('../../c')), /outside the volume/);
  });

  void lstatSync;
});
