// Names that are not UTF-8 in shared volume archives (src/node/shared-files.ts, src/node/shared-xattrs.ts): a backup
// keeps file, directory and symbolic link names and link targets byte for byte (pax `path` and `linkpath` records
// under `hdrcharset=BINARY`), a restore makes them with the same bytes, and every refusal of a hostile entry holds on
// such names too (absolute, `..`, NUL, a link out of the root, through a symbolic link, a device node, a FIFO, made
// twice), as does an unknown `hdrcharset`. On plain directories of the temp dir, as any user.
import assert from 'node:assert/strict';
import { existsSync, linkSync, mkdirSync, readdirSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { checkEntryPath, checkSymlinkTarget, emptyDirectory, extractTree, listTree } from '../../src/node/shared-files.js';
import { shownName } from '../../src/node/shared-xattrs.js';
import { encodePaxRecords, parsePaxRecords } from '../../src/node/shared-xattrs.js';
import { pathOf, treeOf } from '../fixtures/byte-tree.js';
import { archiveWithPax, memoryXattrs, type ArchiveEntry } from '../fixtures/memory-xattrs.js';
import { archiveImage, scratchRoots, once } from '../fixtures/shared-archive.js';

const latin1 = (s: string) => Buffer.from(s, 'latin1');
const at = pathOf;

/** A pax extended header of `records` as they are (no hdrcharset added), NUL-padded to whole blocks. */
function paxBlock(records: [string, Buffer | string][]): Buffer {
  const parts = records.map(([key, value]) => {
    const body = Buffer.concat([Buffer.from(` ${key}=`), Buffer.from(value), Buffer.from('\n')]);
    let length = body.length + String(body.length).length;
    if (String(length).length !== String(body.length).length) length = body.length + String(length).length;
    return Buffer.concat([Buffer.from(String(length)), body]);
  });
  const all = Buffer.concat(parts);
  return Buffer.concat([all, Buffer.alloc((512 - (all.length % 512)) % 512)]);
}

describe('names that are not UTF-8 in shared volume archives', () => {
  const fresh = scratchRoots('latch-shared-names-');

  it('writes a name that is not UTF-8 as its bytes under hdrcharset=BINARY, and a UTF-8 one without it', () => {
    const binary = parsePaxRecords(encodePaxRecords(latin1('d\xe9j\xe0/caf\xe9'), latin1('\xff\xfe'), new Map()));
    assert.deepEqual(
      binary.filter((r) => r.key !== 'comment'),
      [
        { key: 'hdrcharset', value: Buffer.from('BINARY') },
        { key: 'path', value: latin1('d\xe9j\xe0/caf\xe9') },
        { key: 'linkpath', value: latin1('\xff\xfe') },
      ],
    );
    const text = parsePaxRecords(encodePaxRecords('déjà/café', undefined, new Map()));
    assert.deepEqual(
      text.filter((r) => r.key !== 'comment'),
      [{ key: 'path', value: Buffer.from('déjà/café') }],
    );
    assert.equal(shownName(latin1('caf\xe9\\')), 'caf\\xe9\\x5c');
    assert.equal(shownName(Buffer.from('café')), 'café');
  });

  it('checks paths and link targets on their bytes', () => {
    assert.deepEqual(checkEntryPath(latin1('./\xe9//\xff/./\xfe')), latin1('\xe9/\xff/\xfe'));
    assert.throws(() => checkEntryPath(latin1('\xff/\0\xfe')), /has a NUL byte/);
    assert.throws(() => checkEntryPath(latin1('/\xff')), /"\/\\\\xff" is an absolute path/);
    assert.throws(() => checkEntryPath(latin1('\xff/../../\xfe')), /climbs out of the volume/);
    checkSymlinkTarget(latin1('\xe9/\xff/link'), latin1('../\xfe'));
    assert.throws(() => checkSymlinkTarget(latin1('\xe9/link'), latin1('../../\xfe')), /outside the volume/);
    assert.throws(() => checkSymlinkTarget(latin1('\xe9'), latin1('/etc/\xfe')), /absolute path/);
    assert.throws(() => checkSymlinkTarget(latin1('\xe9'), latin1('\xfe\0')), /empty or NUL target/);
  });

  it('round-trips file, directory and symbolic link names and link targets byte for byte', async () => {
    const src = fresh();
    mkdirSync(at(src, latin1('d\xe9j\xe0')));
    writeFileSync(at(src, latin1('d\xe9j\xe0'), latin1('caf\xe9')), 'latin-1');
    writeFileSync(at(src, latin1('\xff\xfe')), 'not text at all');
    linkSync(at(src, latin1('\xff\xfe')), at(src, latin1('hard\xe9')));
    writeFileSync(join(src, 'déjà-utf8'), 'utf-8');
    symlinkSync(latin1('d\xe9j\xe0/caf\xe9'), at(src, latin1('l\xe0')));
    symlinkSync(latin1('dangling-\xfe'), at(src, latin1('d\xe9j\xe0'), latin1('dangling')));
    const xattrs = memoryXattrs();
    const listing = await listTree(src, xattrs);
    // The attributes of paths that are not UTF-8 are read too (the attr tools through a descriptor): nothing skipped.
    assert.deepEqual(listing.skipped, []);
    assert.equal(xattrs.calls.read, 1, 'one batch for every file and directory, whatever its name');
    const { image } = await archiveImage(src, listing, xattrs);
    const dst = fresh();
    const report = await extractTree(once(image), dst, memoryXattrs());
    assert.deepEqual([report.files, report.directories, report.symlinks, report.hardLinks], [3, 1, 2, 1]);
    assert.deepEqual(treeOf(dst), treeOf(src));
    assert.ok(treeOf(dst).includes(`${latin1('l\xe0').toString('hex')} -> ${latin1('d\xe9j\xe0/caf\xe9').toString('hex')}`));
  });

  it('empties a root holding names that are not UTF-8 (what an interrupted restore made)', async () => {
    const root = fresh();
    mkdirSync(at(root, latin1('d\xe9')));
    writeFileSync(at(root, latin1('d\xe9'), latin1('\xff')), 'x');
    symlinkSync(latin1('\xfe'), at(root, latin1('l\xe0')));
    await emptyDirectory(root);
    assert.deepEqual(readdirSync(root), []);
  });

  describe('refuses hostile entries with names that are not UTF-8', () => {
    /** An entry whose names its pax header gives as bytes (under hdrcharset=BINARY); its ustar header says `stand-in`. */
    const entry = (type: string, path: Buffer, linkname?: Buffer, extra: Partial<ArchiveEntry['header']> = {}): ArchiveEntry => ({
      header: {
        name: 'stand-in',
        type: type as 'file',
        mode: 0o644,
        ...(linkname && { linkname: 'stand-in' }),
        ...(type === 'file' && { size: 1 }),
        ...extra,
      },
      body: type === 'file' ? 'x' : undefined,
      pax: paxBlock([['hdrcharset', 'BINARY'], ['path', path], ...(linkname ? [['linkpath', linkname] as [string, Buffer]] : [])]),
    });
    const dir = (path: Buffer) => entry('directory', path, undefined, { mode: 0o755 });

    async function refusedWith(entries: ArchiveEntry[], why: RegExp): Promise<void> {
      const parent = fresh();
      const root = join(parent, 'root');
      mkdirSync(root);
      await assert.rejects(extractTree(once(await archiveWithPax(entries)), root, memoryXattrs()), why);
      assert.deepEqual(readdirSync(parent), ['root'], 'nothing was written outside the root');
    }

    it('an absolute path', async () => {
      const outside = fresh();
      await refusedWith([entry('file', latin1(`${outside}/escaped-\xff`))], /is an absolute path/);
      assert.equal(existsSync(at(outside, latin1('escaped-\xff'))), false);
    });

    it('a path that climbs out with ..', async () => {
      await refusedWith([entry('file', latin1('../escaped-\xff'))], /"..\/escaped-\\\\xff" climbs out of the volume with \.\./);
      await refusedWith([dir(latin1('\xe9')), entry('file', latin1('\xe9/../../escaped-\xff'))], /climbs out of the volume/);
    });

    it('a path with a NUL byte', async () => {
      await refusedWith([entry('file', latin1('\xff\0../../x'))], /has a NUL byte/);
    });

    it('a symbolic link whose target is absolute or resolves outside the root', async () => {
      await refusedWith([entry('symlink', latin1('\xe9'), latin1('/etc/\xff'))], /symbolic link to the absolute path "\/etc\/\\\\xff"/);
      await refusedWith([entry('symlink', latin1('\xe9'), latin1('../\xff'))], /outside the volume/);
      await refusedWith([dir(latin1('\xe0')), entry('symlink', latin1('\xe0/\xe9'), latin1('../../\xff'))], /outside the volume/);
      await refusedWith([entry('symlink', latin1('\xe9'), latin1('\xff\0'))], /empty or NUL target/);
    });

    it('a path through a symbolic link', async () => {
      await refusedWith(
        [dir(latin1('s\xff')), entry('symlink', latin1('l\xff'), latin1('s\xff')), entry('file', latin1('l\xff/x\xfe'))],
        /"l\\\\xff\/x\\\\xfe" goes through "l\\\\xff", which is no directory/,
      );
    });

    it('a device node or a FIFO', async () => {
      await refusedWith([entry('character-device', latin1('null\xff'), undefined, { devmajor: 1, devminor: 3 })], /is a character-device/);
      await refusedWith([entry('block-device', latin1('sda\xff'), undefined, { devmajor: 8, devminor: 0 })], /is a block-device/);
      await refusedWith([entry('fifo', latin1('pipe\xff'))], /"pipe\\\\xff" is a fifo/);
    });

    it('a hard link out of the root, and an entry made twice', async () => {
      await refusedWith([entry('link', latin1('h\xff'), latin1('../\xfe'))], /climbs out/);
      await refusedWith([entry('link', latin1('h\xff'), latin1('/etc/\xfe'))], /is an absolute path/);
      await refusedWith([entry('file', latin1('t\xff')), entry('file', latin1('t\xff'))], /"t\\\\xff" is made twice/);
      await refusedWith([entry('symlink', latin1('x\xff'), latin1('y')), entry('file', latin1('x\xff'))], /is made twice/);
    });

    it('an hdrcharset other than BINARY or UTF-8; UTF-8 is taken', async () => {
      const charset = (value: string): ArchiveEntry => ({
        header: { name: 'stand-in', type: 'file', size: 1, mode: 0o644 },
        body: 'x',
        pax: paxBlock([
          ['hdrcharset', value],
          ['path', latin1('caf\xe9')],
        ]),
      });
      await refusedWith([charset('ISO-8859-1')], /names its character set "ISO-8859-1", neither BINARY nor UTF-8/);
      const root = fresh();
      await extractTree(once(await archiveWithPax([charset('ISO-IR 10646 2000 UTF-8')])), root, memoryXattrs());
      assert.deepEqual(readdirSync(root, { encoding: 'buffer' }), [latin1('caf\xe9')], 'the bytes, as they are');
    });
  });
});
