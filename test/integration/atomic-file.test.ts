// The one careful file write (src/atomic-file.ts): concurrent writers, modes, leftovers, and a writer killed mid-write.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { leftoverOf, tempPathFor, tempTag, writeFileAtomic, writeFileAtomicSync } from '../../src/atomic-file.js';
import { bundleForNode } from '../fixtures/bundle.js';
import { trackChild } from '../fixtures/tracked-children.js';

let work: string;
let writerJs: string;

before(async () => {
  work = mkdtempSync(join(tmpdir(), 'latch-atomic-'));
  writerJs = join(work, 'atomic-writer.cjs');
  await bundleForNode('test/fixtures/atomic-writer.ts', writerJs);
});
after(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

let dirs = 0;
function freshDir(): string {
  const dir = join(work, `d${++dirs}`);
  mkdirSync(dir);
  return dir;
}

/** The fill byte of a file that is `size` bytes of one byte; throws on a torn or short file. */
function wholeFill(path: string, size: number): number {
  const data = readFileSync(path);
  assert.equal(data.length, size, `${path} has ${data.length} bytes, not ${size}: a torn write`);
  const fill = data[0];
  assert.ok(fill !== undefined);
  assert.ok(
    data.every((b) => b === fill),
    `${path} mixes two writers' bytes`,
  );
  return fill;
}

describe('temp names and leftovers', () => {
  it('temp tags are eight hex digits, and different from one call to the next', () => {
    const tags = Array.from({ length: 200 }, () => tempTag());
    for (const tag of tags) assert.match(tag, /^[0-9a-f]{8}$/);
    // 200 draws from 2^32: a repeat would mean the tag is not random.
    assert.equal(new Set(tags).size, tags.length);
    // Every digit position varies (a tag that is not padded or is cut short would fix some).
    for (let i = 0; i < 8; i++) assert.ok(new Set(tags.map((t) => t[i])).size > 4, `digit ${i} hardly varies`);
  });

  it('names a hidden temp file beside the target, with the pid and 8 random hex digits, new on every call', () => {
    const path = join('/pool', 'vol-a.img');
    const names = Array.from({ length: 200 }, () => tempPathFor(path));
    for (const name of names) {
      assert.match(name, new RegExp(`^/pool/\\.vol-a\\.img\\.${process.pid}\\.[0-9a-f]{8}\\.tmp$`));
      assert.deepEqual(leftoverOf(basename(name)), { name: 'vol-a.img', pid: process.pid });
    }
    assert.equal(new Set(names).size, names.length);
  });

  it("recognises only its own temp names, never anyone else's files", () => {
    assert.deepEqual(leftoverOf('.config.json.1.0a1b2c3d.tmp'), { name: 'config.json', pid: 1 });
    assert.deepEqual(leftoverOf('.a.b.c.4194304.ffffffff.tmp'), { name: 'a.b.c', pid: 4194304 });
    for (const other of [
      'vol-a.img', // a volume's image
      'vol-a.img.123.0a1b2c3d.tmp', // not hidden
      '.vol-a.img', // hidden, no temp suffix
      '.tmp-123-0a1b2c3d', // the file store's temp names (store/file.ts)
      '.vol-a.img.123.0a1b2c.tmp', // a short tag
      '.vol-a.img.123.0A1B2C3D.tmp', // upper-case hex
      '.vol-a.img.0.0a1b2c3d.tmp', // pid 0 is no writer
      '.vol-a.img.x123.0a1b2c3d.tmp',
      '.vol-a.img.123.0a1b2c3d.tmp.old',
      '..123.0a1b2c3d.tmp', // no name
      '.latch', // what install keeps beside the driver
      'runtime-0123456789ab',
    ]) {
      assert.equal(leftoverOf(other), undefined, other);
    }
  });
});

describe('writeFileAtomic', () => {
  it('replaces the file whole, fsyncs, and leaves no temp file', async () => {
    const dir = freshDir();
    const path = join(dir, 'f');
    writeFileSync(path, 'old');
    await writeFileAtomic(path, 'new');
    assert.equal(readFileSync(path, 'utf8'), 'new');
    await writeFileAtomic(path, Buffer.from('bytes'), { sync: 'file' });
    assert.equal(readFileSync(path, 'utf8'), 'bytes');
    await writeFileAtomic(path, 'cache', { sync: 'none' });
    assert.equal(readFileSync(path, 'utf8'), 'cache');
    assert.deepEqual(readdirSync(dir), ['f']);
  });

  it('sets the mode before the first byte is written, whatever the umask, and never keeps the old mode', async () => {
    const dir = freshDir();
    const path = join(dir, 'f');
    writeFileSync(path, 'old', { mode: 0o644 });
    const old = process.umask(0o077);
    try {
      const seen: number[] = [];
      await writeFileAtomic(
        path,
        async (handle) => {
          seen.push((await handle.stat()).mode & 0o777); // before any byte
          await handle.write('x');
          seen.push((await handle.stat()).mode & 0o777);
        },
        { mode: 0o755 },
      );
      assert.deepEqual(seen, [0o755, 0o755]);
      assert.equal(statSync(path).mode & 0o777, 0o755);
      // The default: owner only, also over a file that others could read.
      writeFileSync(join(dir, 'g'), 'old', { mode: 0o644 });
      process.umask(0o000);
      await writeFileAtomic(join(dir, 'g'), async (handle) => {
        assert.equal((await handle.stat()).mode & 0o777, 0o600);
        await handle.write('secret');
      });
      assert.equal(statSync(join(dir, 'g')).mode & 0o777, 0o600);
      writeFileAtomicSync(join(dir, 'h'), 'x', { mode: 0o640 });
      assert.equal(statSync(join(dir, 'h')).mode & 0o777, 0o640);
    } finally {
      process.umask(old);
    }
  });

  it('keeps the old file and removes its temp file when the content cannot be written', async () => {
    const dir = freshDir();
    const path = join(dir, 'f');
    writeFileSync(path, 'old');
    await assert.rejects(
      writeFileAtomic(path, async (handle) => {
        await handle.write('half');
        throw new Error('the source changed');
      }),
      /the source changed/,
    );
    assert.equal(readFileSync(path, 'utf8'), 'old');
    assert.deepEqual(readdirSync(dir), ['f']);
    // A target that cannot be replaced (a directory): the rename fails, the temp file goes.
    mkdirSync(join(dir, 'sub'));
    writeFileSync(join(dir, 'sub', 'x'), '');
    await assert.rejects(writeFileAtomic(join(dir, 'sub'), 'x'));
    assert.throws(() => writeFileAtomicSync(join(dir, 'sub'), 'x'));
    assert.deepEqual(readdirSync(dir).sort(), ['f', 'sub']);
  });

  it('writes the same way synchronously', () => {
    const dir = freshDir();
    const path = join(dir, 'f');
    writeFileSync(path, 'old');
    writeFileAtomicSync(path, 'new');
    assert.equal(readFileSync(path, 'utf8'), 'new');
    writeFileAtomicSync(path, Buffer.alloc(300_000, 7), { sync: 'none' });
    assert.equal(wholeFill(path, 300_000), 7);
    assert.deepEqual(readdirSync(dir), ['f']);
  });

  it('concurrent writers in one process never share a temp file, interleave or lose a rename', async () => {
    const dir = freshDir();
    const path = join(dir, 'f');
    const size = 200_000;
    const writers = 24;
    const pieces = (fill: number) => async (handle: FileHandle) => {
      const piece = Buffer.alloc(size / 8, fill);
      // Several writes with a turn of the event loop between them: the writers' writes interleave in time.
      for (let i = 0; i < 8; i++) {
        await handle.write(piece);
        await new Promise((r) => setImmediate(r));
      }
    };
    const renamed: number[] = [];
    await Promise.all(
      Array.from({ length: writers }, (_, i) =>
        writeFileAtomic(path, pieces(i + 1)).then(() => {
          // After its rename (and maybe others' since): the file is whole, and one writer's.
          renamed.push(wholeFill(path, size));
        }),
      ),
    );
    assert.equal(renamed.length, writers);
    assert.ok(wholeFill(path, size) >= 1 && wholeFill(path, size) <= writers);
    assert.deepEqual(readdirSync(dir), ['f']);
  });

  it('concurrent writers in several processes: a reader always sees one whole file', async () => {
    const dir = freshDir();
    const path = join(dir, 'f');
    const size = 256 * 1024;
    writeFileSync(path, Buffer.alloc(size, 9));
    const children = [1, 2, 3].map((fill) => {
      const child = spawn(process.execPath, [writerJs, path, String(fill), String(size), '30'], { stdio: ['ignore', 'pipe', 'pipe'] });
      trackChild(child);
      let out = '';
      child.stdout.on('data', (d: Buffer) => (out += d.toString()));
      child.stderr.on('data', (d: Buffer) => (out += d.toString()));
      return new Promise<string>((resolve) => child.once('exit', (code) => resolve(`${code} ${out}`)));
    });
    let running = true;
    const seen = new Set<number>();
    const reader = (async () => {
      while (running) {
        seen.add(wholeFill(path, size));
        await new Promise((r) => setImmediate(r));
      }
    })();
    const results = await Promise.all(children);
    running = false;
    await reader;
    for (const r of results) assert.match(r, /^0 writing\ndone\n$/);
    assert.ok([1, 2, 3].includes(wholeFill(path, size)));
    assert.ok(seen.size >= 2, `the reader saw only ${[...seen].join(', ')}`);
    assert.deepEqual(readdirSync(dir), ['f']);
  });
});

describe('a writer killed mid-write', () => {
  /** Starts a slow writer of `path` and SIGKILLs it `delayMs` after it started writing; returns its pid. */
  async function killWhileWriting(path: string, fill: number, size: number, delayMs: number): Promise<number> {
    const child = spawn(process.execPath, [writerJs, path, String(fill), String(size), '0', 'slow'], { stdio: ['ignore', 'pipe', 'pipe'] });
    trackChild(child);
    const exited = new Promise((resolve) => child.once('exit', resolve));
    await new Promise<void>((resolve, reject) => {
      let out = '';
      child.stdout.on('data', (d: Buffer) => {
        out += d.toString();
        if (out.includes('writing')) setTimeout(resolve, delayMs);
      });
      child.once('exit', (code) => reject(new Error(`the writer exited (${code}) before it was killed: ${out}`)));
    });
    child.kill('SIGKILL');
    await exited;
    assert.ok(child.pid !== undefined);
    return child.pid;
  }

  it('leaves the old file whole and a leftover that names the file and the dead writer', async () => {
    const dir = freshDir();
    const path = join(dir, 'f');
    const size = 64 * 1024 * 64; // 64 pieces, 1 ms apart: killed well before the end
    writeFileSync(path, Buffer.alloc(size, 9));
    const pid = await killWhileWriting(path, 1, size, 5);
    assert.equal(wholeFill(path, size), 9);
    const others = readdirSync(dir).filter((n) => n !== 'f');
    assert.equal(others.length, 1, `left behind: ${others.join(', ')}`);
    assert.deepEqual(leftoverOf(others[0] ?? ''), { name: 'f', pid });
  });

  it('killed at any moment of repeated writes: the old or a new file, whole, and only recognisable leftovers', async () => {
    const dir = freshDir();
    const path = join(dir, 'f');
    const size = 64 * 1024 * 4; // short writes: some kills land between rounds, after a rename
    writeFileSync(path, Buffer.alloc(size, 9));
    const killed: number[] = [];
    for (let round = 0; round < 6; round++) {
      killed.push(await killWhileWriting(path, round + 1, size, Math.floor(Math.random() * 20)));
      const fill = wholeFill(path, size);
      assert.ok(fill === 9 || fill <= round + 1, `fill ${fill} after round ${round}`);
      for (const name of readdirSync(dir).filter((n) => n !== 'f')) {
        const leftover = leftoverOf(name);
        assert.ok(leftover?.name === 'f' && killed.includes(leftover.pid), `an unrecognisable file left behind: ${name}`);
      }
    }
  });
});
