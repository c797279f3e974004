// Names that are not UTF-8 through a shared volume's backup archive and back (src/node/shared-files.ts), as root on
// the local disk: a tree with Latin-1 and other non-UTF-8 file, directory, symbolic link and hard link names, and a
// symbolic link target, is packed and extracted back byte for byte (owners and modes too), with the user attributes
// and ACLs of such entries (read and set by the attr tools through a descriptor); GNU tar lists the archive
// and extracts the same bytes from it (warning only that it does not know hdrcharset), Python's tarfile reads the
// same bytes; and a restore takes GNU tar's own archives of the tree
// (pax, which writes such names raw without hdrcharset, and gnu, with its long-name records) byte for byte. Needs root
// and GNU tar; skips otherwise.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import {
  chownSync,
  closeSync,
  lchownSync,
  linkSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { extractTree, listTree } from '../../src/node/shared-files.js';
import { archiveImage, keptAttributesDump, once } from '../fixtures/shared-archive.js';
import { attrTools } from '../../src/node/shared-xattrs.js';
import { pathOf, treeOf } from '../fixtures/byte-tree.js';

const gnuTar = /GNU tar/.test(spawnSync('tar', ['--version'], { encoding: 'utf8' }).stdout ?? '');
const skip = process.getuid?.() !== 0 ? 'needs root' : !gnuTar ? 'needs GNU tar' : undefined;

const latin1 = (s: string) => Buffer.from(s, 'latin1');

function tar(args: string[]): { stdout: string; stderr: string } {
  // The C locale: GNU tar then converts no name (it would from UTF-8 to the locale's charset).
  const r = spawnSync('tar', args, { encoding: 'utf8', timeout: 60_000, env: { ...process.env, LC_ALL: 'C' } });
  assert.equal(r.status, 0, `tar ${args.join(' ')}: ${r.stderr}`);
  return { stdout: r.stdout, stderr: r.stderr };
}

/** Runs `command ...args /proc/self/fd/3`, its fd 3 open on `path` (a name that is not text). */
function onDescriptor(path: Buffer, command: string, args: string[]): void {
  const fd = openSync(path, 'r');
  try {
    const r = spawnSync(command, [...args, '/proc/self/fd/3'], {
      stdio: ['ignore', 'pipe', 'pipe', fd],
      encoding: 'utf8',
      timeout: 30_000,
    });
    assert.equal(r.status, 0, `${command} ${args.join(' ')}: ${r.stderr}`);
  } finally {
    closeSync(fd);
  }
}

describe('names that are not UTF-8 through a shared volume archive, with GNU tar', { skip }, () => {
  let work = '';
  let src = '';
  let archive = Buffer.alloc(0);
  const xattrs = attrTools(30_000);

  before(async () => {
    work = mkdtempSync(join(tmpdir(), 'latch-names-'));
    src = join(work, 'src');
    mkdirSync(src);
    const dir = latin1('r\xe9pertoire');
    mkdirSync(pathOf(src, dir), { mode: 0o750 });
    chownSync(pathOf(src, dir), 1234, 2345);
    writeFileSync(pathOf(src, dir, latin1('caf\xe9.txt')), 'latin-1 name\n', { mode: 0o640 });
    chownSync(pathOf(src, dir, latin1('caf\xe9.txt')), 1234, 2345);
    writeFileSync(pathOf(src, latin1('\xff\xfe\x80 bytes')), 'no encoding at all\n');
    linkSync(pathOf(src, latin1('\xff\xfe\x80 bytes')), pathOf(src, latin1('hard-\xe0')));
    writeFileSync(join(src, 'déjà-utf8'), 'utf-8 name\n');
    symlinkSync(latin1('r\xe9pertoire/caf\xe9.txt'), pathOf(src, latin1('lien-\xe9')));
    lchownSync(pathOf(src, latin1('lien-\xe9')), 1234, 2345);
    symlinkSync(latin1('../cible-\xfe'), pathOf(src, dir, latin1('dangling')));
    // Longer than ustar's name field: the gnu format writes it in a long-name record.
    writeFileSync(pathOf(src, dir, latin1(`long-${'\xe9'.repeat(120)}`)), 'long\n');
    // Attributes and ACLs on entries whose names are not UTF-8, set through a descriptor (the tools take text paths).
    onDescriptor(pathOf(src, latin1('\xff\xfe\x80 bytes')), 'setfattr', ['-n', 'user.bytes', '-v', '0sAAEC/w==']);
    onDescriptor(pathOf(src, dir, latin1('caf\xe9.txt')), 'setfacl', ['-m', 'u:1000:rw']);
    onDescriptor(pathOf(src, dir), 'setfattr', ['-n', 'user.dir', '-v', 'yes']);
    onDescriptor(pathOf(src, dir), 'setfacl', ['-d', '-m', 'g:3000:rx']);

    const listing = await listTree(src, xattrs);
    archive = (await archiveImage(src, listing, xattrs)).image;
    writeFileSync(join(work, 'latch.tar'), archive);
  });
  after(() => rmSync(work, { recursive: true, force: true }));

  it('extracts the tree back byte for byte, owners and modes too', async () => {
    const dst = join(work, 'restored');
    mkdirSync(dst);
    const report = await extractTree(once(archive), dst, xattrs);
    assert.deepEqual([report.files, report.directories, report.symlinks, report.hardLinks], [4, 1, 2, 1]);
    assert.deepEqual(treeOf(dst, true), treeOf(src, true));
    assert.equal(treeOf(src).length, 8, 'every entry was compared');
  });

  it('keeps the user attributes and ACLs of entries whose names are not UTF-8, and restores them', async () => {
    const before = keptAttributesDump(src);
    for (const name of ['\xff\xfe\x80 bytes', 'r\xe9pertoire', 'r\xe9pertoire/caf\xe9.txt']) {
      assert.ok(before.includes(`# file: ${name}\n`), `set on ${JSON.stringify(name)}: ${JSON.stringify(before)}`);
    }
    const dst = join(work, 'restored-attributes');
    mkdirSync(dst);
    const report = await extractTree(once(archive), dst, xattrs);
    assert.equal(report.xattrEntries, 3);
    assert.equal(report.skippedXattrs, 0);
    assert.equal(keptAttributesDump(dst), before);
  });

  it('GNU tar lists the archive and extracts the same bytes (it warns that it does not know hdrcharset)', () => {
    // GNU tar (1.34) writes such names as raw bytes without hdrcharset, and ignores the record, with a warning, as it
    // takes any name as bytes; --warning=no-unknown-keyword silences it.
    const warnings = (stderr: string) =>
      stderr.split('\n').filter((l) => l !== '' && l !== "tar: Ignoring unknown extended header keyword 'hdrcharset'");
    const listed = tar(['-tvf', join(work, 'latch.tar')]);
    assert.deepEqual(warnings(listed.stderr), []);
    assert.equal(tar(['--warning=no-unknown-keyword', '-tvf', join(work, 'latch.tar')]).stderr, '');
    // GNU tar shows a byte it cannot print as a backslash and three octal digits.
    assert.match(listed.stdout, /r\\351pertoire\/caf\\351\.txt/);
    assert.match(listed.stdout, /lien-\\351 -> r\\351pertoire\/caf\\351\.txt/);
    assert.match(listed.stdout, /\\377\\376\\200 bytes link to hard-\\340/);
    const dst = join(work, 'gnu-extracted');
    mkdirSync(dst);
    const extracted = tar(['-xf', join(work, 'latch.tar'), '-C', dst]);
    assert.deepEqual(warnings(extracted.stderr), []);
    assert.deepEqual(treeOf(dst, true), treeOf(src, true));
  });

  it("Python's tarfile reads the names as the same bytes (hdrcharset=BINARY)", (t) => {
    if (spawnSync('python3', ['--version']).status !== 0) return t.skip('no python3 here');
    const script =
      'import os, sys, tarfile\nfor m in tarfile.open(sys.argv[1]):\n    print(os.fsencode(m.name).hex(), os.fsencode(m.linkname).hex())';
    const r = spawnSync('python3', ['-c', script, join(work, 'latch.tar')], { encoding: 'utf8', timeout: 60_000 });
    assert.equal(r.status, 0, r.stderr);
    const names = r.stdout.trim().split('\n');
    assert.ok(names.includes(`${latin1('lien-\xe9').toString('hex')} ${latin1('r\xe9pertoire/caf\xe9.txt').toString('hex')}`), r.stdout);
    assert.ok(
      names.some((l) => l.startsWith(`${latin1('r\xe9pertoire/long-').toString('hex')}${'e9'.repeat(120)} `)),
      r.stdout,
    );
  });

  for (const format of ['posix', 'gnu']) {
    it(`a restore takes GNU tar's own ${format} archive of the tree byte for byte`, async () => {
      const file = join(work, `gnu-${format}.tar`);
      tar([`--format=${format}`, '-cf', file, '-C', src, '.']);
      const dst = join(work, `from-gnu-${format}`);
      mkdirSync(dst);
      await extractTree(once(readFileSync(file)), dst, xattrs);
      assert.deepEqual(treeOf(dst, true), treeOf(src, true));
    });
  }
});
