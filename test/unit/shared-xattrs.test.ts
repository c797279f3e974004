// Extended attributes in shared volume archives (src/node/shared-xattrs.ts, src/node/shared-files.ts), without the
// attr tools (an in-memory stand-in): pax records carry any bytes both ways; a backup keeps user.* attributes and
// POSIX ACLs; a restore sets only those, skips and counts every other attribute (security.capability, trusted.*,
// ceph.*) and unknown record, and fails on a malformed header, on more than 64 KiB of attributes on one entry, and on
// attributes in a global header; getfattr's dump and setfattr's input are read and written with their escapes.
import assert from 'node:assert/strict';
import { chmodSync, mkdirSync, statSync, writeFileSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { extractTree, listTree } from '../../src/node/shared-files.js';
import { archiveImage, scratchRoots, once } from '../fixtures/shared-archive.js';
import {
  MAX_XATTR_BYTES,
  encodePaxRecords,
  entryXattrs,
  formatSetfattrDump,
  parseGetfattrDump,
  parsePaxRecords,
  type Xattrs,
} from '../../src/node/shared-xattrs.js';
import { archiveWithPax, memoryXattrs, type ArchiveEntry } from '../fixtures/memory-xattrs.js';

/** An ACL as the kernel has it in system.posix_acl_*: version 2, then (tag, perm, id) entries; ids of 0xffffffff. */
const ACL = Buffer.from('AgAAAAEABgD/////AgAGAOgDAAAEAAQA/////xAABgD/////IAAEAP////8=', 'base64');
const BINARY = Buffer.from([0, 1, 2, 0xff, 0xfe, 0x0a, 0x3d, 0x20, 0x80]);

const xattrs = (...pairs: [string, Buffer | string][]): Xattrs => new Map(pairs.map(([k, v]) => [k, Buffer.from(v)]));

describe('pax records of extended attributes', () => {
  it('carry any bytes, fill whole blocks, and parse back to the same records', () => {
    for (const path of ['a', 'dir/ü-name', 'x'.repeat(300)]) {
      const block = encodePaxRecords(path, 'target', xattrs(['user.bin', BINARY], ['system.posix_acl_access', ACL], ['user.empty', '']));
      assert.equal(block.length % 512, 0);
      const records = parsePaxRecords(block);
      assert.deepEqual(
        records.map((r) => [r.key, r.value.toString('hex')]),
        [
          ['path', Buffer.from(path).toString('hex')],
          ['linkpath', Buffer.from('target').toString('hex')],
          ['SCHILY.xattr.user.bin', BINARY.toString('hex')],
          ['SCHILY.xattr.system.posix_acl_access', ACL.toString('hex')],
          ['SCHILY.xattr.user.empty', ''],
          ['comment', records.at(-1)?.value.toString('hex')],
        ],
      );
    }
  });

  it("write '=' and '%' in a name as GNU tar does (%3D, %25), and read them back", () => {
    const block = encodePaxRecords('f', undefined, xattrs(['user.a=b%3D', 'v']));
    assert.match(block.toString('latin1'), /SCHILY\.xattr\.user\.a%3Db%253D=v\n/);
    assert.deepEqual([...entryXattrs(parsePaxRecords(block)).kept.keys()], ['user.a=b%3D']);
  });

  it('refuses a malformed header: no length, a length that lies, no =, bytes after the padding', () => {
    assert.throws(() => parsePaxRecords(Buffer.from('x path=a\n')), /malformed pax extended header.*has no length/);
    assert.throws(() => parsePaxRecords(Buffer.from('30 path=a\n')), /does not end where its length says/);
    assert.throws(() => parsePaxRecords(Buffer.from('9 patha\n\n')), /has no '='/);
    assert.throws(() => parsePaxRecords(Buffer.concat([Buffer.from('9 path=a\n'), Buffer.alloc(3), Buffer.from('x')])), /bytes follow/);
    assert.deepEqual(parsePaxRecords(Buffer.concat([Buffer.from('9 path=a\n'), Buffer.alloc(503)])).length, 1);
  });
});

describe('what a restore sets of an entry', () => {
  const records = (...pairs: [string, Buffer | string][]) => pairs.map(([key, value]) => ({ key, value: Buffer.from(value) }));

  it('keeps user.* attributes and POSIX ACLs', () => {
    const { kept, skipped } = entryXattrs(
      records(
        ['path', 'f'],
        ['SCHILY.xattr.user.a', BINARY],
        ['SCHILY.xattr.system.posix_acl_access', ACL],
        ['SCHILY.xattr.system.posix_acl_default', ACL],
      ),
    );
    assert.deepEqual([...kept.keys()], ['user.a', 'system.posix_acl_access', 'system.posix_acl_default']);
    assert.deepEqual(skipped, []);
  });

  it('skips and names security.capability (file capabilities), security.selinux, trusted.*, ceph.* and other system.*', () => {
    const { kept, skipped } = entryXattrs(
      records(
        ['SCHILY.xattr.security.capability', Buffer.from('0100000201000000', 'hex')],
        ['SCHILY.xattr.security.selinux', 'system_u:object_r:shadow_t:s0'],
        ['SCHILY.xattr.trusted.overlay.opaque', 'y'],
        ['SCHILY.xattr.ceph.quota.max_bytes', '1'],
        ['SCHILY.xattr.ceph.dir.layout.pool', 'other'],
        ['SCHILY.xattr.system.nfs4_acl', 'x'],
        ['SCHILY.xattr.user', 'no name after user.'],
      ),
    );
    assert.equal(kept.size, 0);
    assert.deepEqual(skipped, [
      'attribute "security.capability"',
      'attribute "security.selinux"',
      'attribute "trusted.overlay.opaque"',
      'attribute "ceph.quota.max_bytes"',
      'attribute "ceph.dir.layout.pool"',
      'attribute "system.nfs4_acl"',
      'attribute "user"',
    ]);
  });

  it('skips and names an unknown record (a text ACL of GNU tar, libarchive attributes), not the plain pax keywords', () => {
    const { skipped } = entryXattrs(
      records(['SCHILY.acl.access', 'user::rw-'], ['LIBARCHIVE.xattr.user.a', 'YQ'], ['mtime', '1'], ['uid', '0']),
    );
    assert.deepEqual(skipped, ['unknown record "SCHILY.acl.access"', 'unknown record "LIBARCHIVE.xattr.user.a"']);
  });

  it('fails on an attribute without a name, named twice, with a name over 255 bytes, or an ACL that is none', () => {
    assert.throws(() => entryXattrs(records(['SCHILY.xattr.', 'x'])), /an attribute without a name/);
    assert.throws(() => entryXattrs(records(['SCHILY.xattr.user.a', 'x'], ['SCHILY.xattr.user.a', 'y'])), /named twice/);
    assert.throws(() => entryXattrs(records([`SCHILY.xattr.user.${'n'.repeat(251)}`, 'x'])), /longer than 255 bytes/);
    assert.throws(() => entryXattrs(records(['SCHILY.xattr.system.posix_acl_access', 'not an acl'])), /is not a POSIX ACL/);
  });

  it('fails on more than 64 KiB of attributes on one entry, refused ones counted too', () => {
    const half = Buffer.alloc(MAX_XATTR_BYTES / 2);
    assert.throws(() => entryXattrs(records(['SCHILY.xattr.user.a', half], ['SCHILY.xattr.trusted.b', half])), /more than 65536 bytes/);
    assert.equal(entryXattrs(records(['SCHILY.xattr.user.a', half.subarray(100)])).kept.size, 1);
  });
});

describe("the attr tools' formats", () => {
  it("reads getfattr's dump, its escapes undone, every block matched to a path asked for", () => {
    const paths = ['/r/a b', '/r/new\nline', '/r/back\\slash', '/r/none', '/r/é'];
    const dump =
      '# file: /r/a b\nuser.t=0saGVsbG8=\n\n# file: /r/new\\012line\nuser.bin=0sAAEC/w==\nuser.empty=0s\n\n' +
      '# file: /r/back\\134slash\nsystem.posix_acl_access=0sAgAAAAEABgD/////\n\n# file: /r/é\nuser.x=0sMQ==\n\n';
    const found = parseGetfattrDump(dump, paths);
    assert.deepEqual([...found.keys()], ['/r/a b', '/r/new\nline', '/r/back\\slash', '/r/é']);
    assert.deepEqual(found.get('/r/new\nline'), xattrs(['user.bin', Buffer.from([0, 1, 2, 0xff])], ['user.empty', '']));
    assert.throws(() => parseGetfattrDump('# file: /elsewhere\nuser.a=0sMQ==\n', paths), /named a file it was not asked for/);
    assert.throws(() => parseGetfattrDump('# file: /r/a b\nuser.a="text"\n', paths), /another encoding than base64/);
  });

  it("writes setfattr's input with every byte outside printable ASCII escaped", () => {
    assert.equal(
      formatSetfattrDump([{ path: '/r/a b\n=é', xattrs: xattrs(['user.k=v', BINARY]) }]),
      `# file: /r/a\\040b\\012\\075\\303\\251\nuser.k\\075v=0s${BINARY.toString('base64')}\n\n`,
    );
  });
});

describe('archives with extended attributes', () => {
  const fresh = scratchRoots('latch-shared-xattrs-');

  async function backUp(root: string, io: ReturnType<typeof memoryXattrs>): Promise<Buffer> {
    return (await archiveImage(root, await listTree(root, io), io)).image;
  }

  it("round-trip files' and directories' user attributes and ACLs, binary values as they are, long and non-ASCII names too", async () => {
    const src = fresh();
    const long = `${'d'.repeat(120)}/ü-${'f'.repeat(150)}`;
    mkdirSync(join(src, 'd'.repeat(120)));
    writeFileSync(join(src, long), 'x');
    mkdirSync(join(src, 'shared'));
    writeFileSync(join(src, 'shared', 'plain'), 'y');
    symlinkSync('plain', join(src, 'shared', 'link'));
    const io = memoryXattrs([
      [join(src, long), xattrs(['user.bin', BINARY], ['system.posix_acl_access', ACL])],
      [join(src, 'shared'), xattrs(['user.dir', 'v'], ['system.posix_acl_default', ACL])],
      [join(src, 'shared', 'plain'), xattrs(['security.capability', 'cap'], ['user.k', 'kept'])],
    ]);
    const image = await backUp(src, io);
    const dst = fresh();
    const restored = memoryXattrs();
    const report = await extractTree(once(image), dst, restored);
    assert.deepEqual([report.xattrEntries, report.skippedXattrs], [3, 0]);
    assert.deepEqual(restored.attrs.get(join(dst, long)), xattrs(['user.bin', BINARY], ['system.posix_acl_access', ACL]));
    assert.deepEqual(restored.attrs.get(join(dst, 'shared')), xattrs(['user.dir', 'v'], ['system.posix_acl_default', ACL]));
    assert.deepEqual(restored.attrs.get(join(dst, 'shared', 'plain')), xattrs(['user.k', 'kept']), 'the backup left security.* out');
    assert.equal(restored.calls.write, 2, "one batch, then the directories' default ACLs once all is made");
  });

  it("keeps the root's mode and attributes (a default ACL on the volume), in an entry ./ that makes nothing", async () => {
    const src = fresh();
    writeFileSync(join(src, 'f'), 'x');
    chmodSync(src, 0o2775);
    const io = memoryXattrs([[src, xattrs(['user.root', 'r'], ['system.posix_acl_default', ACL])]]);
    const image = await backUp(src, io);
    const dst = fresh();
    const restored = memoryXattrs();
    const report = await extractTree(once(image), dst, restored);
    assert.deepEqual([report.files, report.directories, report.xattrEntries], [1, 0, 1]);
    assert.deepEqual(restored.attrs.get(dst), xattrs(['user.root', 'r'], ['system.posix_acl_default', ACL]));
    assert.equal(statSync(dst).mode & 0o7777, 0o775, 'its mode, without the set-group-ID bit');
  });

  it('refuses an entry naming the root anywhere but first, or as anything but a directory', async () => {
    const dir: ArchiveEntry = { header: { name: './', type: 'directory', mode: 0o755 } };
    await assert.rejects(
      extractTree(once(await archiveWithPax([file('f'), dir])), fresh(), memoryXattrs()),
      /"\.\/" names the root itself/,
    );
    await assert.rejects(extractTree(once(await archiveWithPax([dir, dir])), fresh(), memoryXattrs()), /names the root itself/);
    await assert.rejects(extractTree(once(await archiveWithPax([file('.')])), fresh(), memoryXattrs()), /names the root itself/);
  });

  it('fails a backup of an entry with more than 64 KiB of attributes', async () => {
    const src = fresh();
    writeFileSync(join(src, 'big'), '');
    const io = memoryXattrs([[join(src, 'big'), xattrs(['user.a', Buffer.alloc(40_000)], ['user.b', Buffer.alloc(40_000)])]]);
    await assert.rejects(listTree(src, io), /"big" has more than 65536 bytes of extended attributes/);
  });

  const file = (name: string, pax?: Buffer): ArchiveEntry => ({ header: { name, type: 'file', size: 1, mode: 0o755 }, body: 'x', pax });

  it('restores a crafted archive without security.capability, trusted.* or ceph.*, and counts what it skipped', async () => {
    const hostile = xattrs(
      ['security.capability', Buffer.from('0100000201000000', 'hex')],
      ['ceph.quota.max_bytes', '1'],
      ['trusted.x', 'y'],
      ['user.fine', 'ok'],
    );
    const image = await archiveWithPax([file('tool', encodePaxRecords('tool', undefined, hostile)), file('other')]);
    const dst = fresh();
    const restored = memoryXattrs();
    const report = await extractTree(once(image), dst, restored);
    assert.equal(report.files, 2);
    assert.deepEqual(restored.attrs.get(join(dst, 'tool')), xattrs(['user.fine', 'ok']));
    assert.equal(report.skippedXattrs, 3);
    assert.deepEqual(report.skippedXattrsSample, [
      'tool: attribute "security.capability"',
      'tool: attribute "ceph.quota.max_bytes"',
      'tool: attribute "trusted.x"',
    ]);
  });

  it("skips a symbolic link's attributes (Linux has none there), and counts them", async () => {
    const link: ArchiveEntry = {
      header: { name: 'l', type: 'symlink', linkname: 'f' },
      pax: encodePaxRecords('l', 'f', xattrs(['user.a', 'b'])),
    };
    const restored = memoryXattrs();
    const report = await extractTree(once(await archiveWithPax([file('f'), link])), fresh(), restored);
    assert.deepEqual([report.symlinks, report.skippedXattrs, restored.attrs.size], [1, 1, 0]);
  });

  it('fails a restore on a malformed pax header, or on attributes in a global header', async () => {
    const bad = Buffer.concat([Buffer.from('99 path=tool\n'), Buffer.alloc(499)]);
    await assert.rejects(
      extractTree(once(await archiveWithPax([file('tool', bad)])), fresh(), memoryXattrs()),
      /malformed pax extended header/,
    );
    const tooMuch = encodePaxRecords('tool', undefined, xattrs(['user.a', Buffer.alloc(40_000)], ['security.b', Buffer.alloc(40_000)]));
    await assert.rejects(
      extractTree(once(await archiveWithPax([file('tool', tooMuch)])), fresh(), memoryXattrs()),
      /more than 65536 bytes/,
    );

    const records = encodePaxRecords('ignored', undefined, xattrs(['user.a', 'b']));
    const globalArchive = await archiveWithPax([file('tool', records)]);
    // The same archive with its pax header's typeflag made 'g' (global), its checksum redone.
    globalArchive[156] = 'g'.charCodeAt(0);
    globalArchive.fill(' ', 148, 156);
    const sum = globalArchive.subarray(0, 512).reduce((a, b) => a + b, 0);
    globalArchive.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 'latin1');
    await assert.rejects(extractTree(once(globalArchive), fresh(), memoryXattrs()), /attributes or names in a global pax header/);
  });
});
