// Extended attributes of a shared volume's files through a backup archive and back (src/node/shared-files.ts with the
// attr tools, src/node/shared-xattrs.ts), on a directory of the local disk (an ext4 image on a loop device where the
// temp dir takes no user attributes): user.* attributes (binary values too) and POSIX ACLs of files and directories
// come back as they were, whatever the names (a newline, a backslash, non-ASCII, longer than ustar's fields), a
// directory's default ACL is not inherited by what the restore makes inside it, and GNU tar (`--xattrs
// --xattrs-include=*`) restores the same attributes and ACLs from the archive. Needs root, getfattr/setfattr (Debian's
// attr) and setfacl (acl); skips otherwise.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { extractTree, listTree } from '../../src/node/shared-files.js';
import { archiveImage, keptAttributesDump, once } from '../fixtures/shared-archive.js';
import { attrTools } from '../../src/node/shared-xattrs.js';

const tool = (name: string) => spawnSync(name, ['--version']).error === undefined;
const skip =
  process.getuid?.() !== 0
    ? 'needs root'
    : !tool('getfattr') || !tool('setfattr') || !tool('setfacl')
      ? "needs getfattr, setfattr (Debian's attr) and setfacl (acl): run scripts/setup.sh"
      : undefined;

function sh(command: string, args: string[], options: { cwd?: string } = {}): string {
  const r = spawnSync(command, args, { encoding: 'utf8', timeout: 60_000, ...options });
  assert.equal(r.status, 0, `${command} ${args.join(' ')}: ${r.stderr}`);
  return r.stdout;
}

describe('extended attributes through a shared volume archive, with the attr tools', { skip }, () => {
  let work = '';
  let disk = '';
  let loopMount = false;

  before(() => {
    work = mkdtempSync(join(tmpdir(), 'latch-xattrs-'));
    disk = join(work, 'disk');
    mkdirSync(disk);
    writeFileSync(join(disk, 'probe'), '');
    if (spawnSync('setfattr', ['-n', 'user.probe', '-v', '1', join(disk, 'probe')]).status !== 0) {
      // A tmpfs without user attributes: an ext4 image on a loop device instead.
      sh('truncate', ['-s', '64M', join(work, 'ext4.img')]);
      sh('mkfs.ext4', ['-q', '-F', join(work, 'ext4.img')]);
      sh('mount', ['-o', 'loop', join(work, 'ext4.img'), disk]);
      loopMount = true;
    }
    rmSync(join(disk, 'probe'), { force: true });
  });

  after(() => {
    if (loopMount) spawnSync('umount', [disk]);
    rmSync(work, { recursive: true, force: true });
  });

  const tools = attrTools(30_000);

  async function archiveOf(root: string): Promise<{ image: Buffer; xattrEntries: number }> {
    const listing = await listTree(root, tools);
    return { image: (await archiveImage(root, listing, tools)).image, xattrEntries: listing.xattrEntries };
  }

  it('round-trips user attributes and ACLs of files and directories, and GNU tar reads them', async () => {
    const src = join(disk, 'src');
    mkdirSync(src);
    const names = ['plain', 'a b', 'new\nline', 'back\\slash', 'é-ü', 'k=v', `${'long-'.repeat(30)}name`];
    for (const name of names) writeFileSync(join(src, name), name);
    sh('setfattr', ['-n', 'user.text', '-v', 'hello', join(src, 'plain')]);
    sh('setfattr', ['-n', 'user.bin', '-v', '0sAAEC/w0KPSCA', join(src, 'a b')]);
    sh('setfattr', ['-n', 'user.empty', join(src, 'new\nline')]);
    sh('setfattr', ['-n', 'user.name with space=and equals', '-v', 'x', join(src, 'back\\slash')]);
    sh('setfattr', ['-n', 'user.ü', '-v', 'ü', join(src, 'é-ü')]);
    sh('setfacl', ['-m', 'u:1000:rw,g:2000:r', join(src, 'k=v')]);
    sh('setfattr', ['-n', 'user.long', '-v', '0s' + Buffer.alloc(3000, 7).toString('base64'), join(src, `${'long-'.repeat(30)}name`)]);
    // A directory with a default ACL: a file made in it inherits an access ACL; one has had it removed since.
    mkdirSync(join(src, 'team'));
    sh('setfacl', ['-m', 'g:3000:rwx', '-d', '-m', 'g:3000:rwx', join(src, 'team')]);
    sh('setfattr', ['-n', 'user.dir', '-v', 'yes', join(src, 'team')]);
    writeFileSync(join(src, 'team', 'inherited'), 'i');
    writeFileSync(join(src, 'team', 'bare'), 'b');
    sh('setfacl', ['-b', join(src, 'team', 'bare')]);
    mkdirSync(join(src, 'team', 'sub'));
    // The volume's root: a default ACL of its own (set last: nothing above inherited it).
    sh('setfacl', ['-d', '-m', 'g:4000:rx', src]);
    const before = keptAttributesDump(src);
    assert.match(before, /# file: \.\nsystem.posix_acl_default/);
    assert.match(before, /system.posix_acl_default/);
    assert.match(before, /# file: team\/inherited\nsystem.posix_acl_access/);

    const { image, xattrEntries } = await archiveOf(src);
    assert.equal(xattrEntries, 11, 'the root, the seven files, team, team/inherited and team/sub (which inherited its default ACL)');
    const dst = join(disk, 'dst');
    mkdirSync(dst);
    const report = await extractTree(once(image), dst, tools);
    assert.deepEqual([report.xattrEntries, report.skippedXattrs], [11, 0]);
    assert.equal(keptAttributesDump(dst), before, 'every attribute and ACL came back, and none more (team/bare inherited nothing)');

    // GNU tar lists and extracts the same archive, attributes and ACLs included.
    const archive = join(work, 'archive.tar');
    writeFileSync(archive, image);
    const listed = sh('tar', ['--xattrs', '--xattrs-include=*', '-tvf', archive]);
    assert.match(listed, /long-long-.*name/);
    const byTar = join(disk, 'by-tar');
    mkdirSync(byTar);
    sh('tar', ['--xattrs', '--xattrs-include=*', '-xf', archive, '-C', byTar]);
    assert.equal(keptAttributesDump(byTar), before, 'GNU tar restores the same attributes and ACLs');
    assert.match(sh('getfattr', ['-h', '-d', '-e', 'base64', '-m', 'user.bin', join(byTar, 'a b')]), /user.bin=0sAAEC\/w0KPSCA/);
  });
});
