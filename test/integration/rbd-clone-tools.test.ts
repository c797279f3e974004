// What a clone reads from the rbd tools is checked before it is used (src/backend/rbd.ts: snapshotDiff,
// allocatedExtents), run against a fake `rbd` on PATH (child processes) that answers with what the test wrote: a diff
// whose size or start is not the snapshot's is refused, and so is an allocation listing out of order, past the
// image's size, or with a line that is no extent. The real tools' output is read in test/ceph/rbd-incremental.test.ts.
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, beforeEach, describe, it } from 'node:test';
import { RbdBackend } from '../../src/backend/rbd.js';
import { fakeToolsOnPath, type FakeTools } from '../fixtures/fake-tools.js';

// `rbd snap ls` and `rbd info` answer a 64 MiB image with snapshot s1; `export-diff` and `diff` print the files
// `export-diff` and `diff` of the state directory.
const FAKE_RBD = `#!/usr/bin/env node
const fs = require('fs');
const path = require('path');
const state = process.env.FAKE_RBD_STATE;
const args = [];
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  if (['--conf', '--id', '--keyring', '--format'].includes(argv[i])) i++;
  else if (!argv[i].startsWith('--')) args.push(argv[i]);
}
const SIZE = 64 * 1024 * 1024;
if (args[0] === 'snap' && args[1] === 'ls') process.stdout.write(JSON.stringify([{ id: 4, name: 's1', size: SIZE }]));
else if (args[0] === 'info') process.stdout.write(JSON.stringify({ size: SIZE, features: [] }));
else if (args[0] === 'export-diff' || args[0] === 'diff') process.stdout.write(fs.readFileSync(path.join(state, args[0])));
else {
  process.stderr.write('fake rbd: unexpected ' + argv.join(' ') + '\\n');
  process.exit(22);
}
`;

const MiB = 1024 * 1024;

/** An rbd diff v1 stream: optional start, the size, the given records, the end. */
function diffStream(sizeBytes: number, options: { from?: string; data?: { offset: number; length: number } } = {}): Buffer {
  const parts = [Buffer.from('rbd diff v1\n', 'latin1')];
  const name = (tag: string, value: string) => {
    const length = Buffer.alloc(4);
    length.writeUInt32LE(Buffer.byteLength(value));
    parts.push(Buffer.from(tag, 'latin1'), length, Buffer.from(value));
  };
  if (options.from !== undefined) name('f', options.from);
  name('t', 's1');
  const size = Buffer.alloc(8);
  size.writeBigUInt64LE(BigInt(sizeBytes));
  parts.push(Buffer.from('s', 'latin1'), size);
  if (options.data) {
    const fields = Buffer.alloc(16);
    fields.writeBigUInt64LE(BigInt(options.data.offset), 0);
    fields.writeBigUInt64LE(BigInt(options.data.length), 8);
    parts.push(Buffer.from('w', 'latin1'), fields, Buffer.alloc(options.data.length, 7));
  }
  parts.push(Buffer.from('e', 'latin1'));
  return Buffer.concat(parts);
}

describe('a clone checks what the rbd tools report (fake rbd)', () => {
  let work: string;
  let state: string;
  let tools: FakeTools;
  let backend: RbdBackend;

  before(() => {
    tools = fakeToolsOnPath('latch-rbd-clone-tools-', { rbd: FAKE_RBD });
    work = tools.work;
    state = join(work, 'state');
    mkdirSync(state);
    process.env.FAKE_RBD_STATE = state;
    backend = new RbdBackend({
      pool: 'latch',
      cephConf: '/etc/ceph/ceph.conf',
      clientId: 'node',
      keyring: '/k',
      mountDir: join(work, 'mnt'),
      maxSize: 1024 * MiB,
      timeoutMs: 10_000,
    });
  });
  after(() => {
    delete process.env.FAKE_RBD_STATE;
    tools.restore();
  });
  beforeEach(() => {
    writeFileSync(join(state, 'diff'), '');
    writeFileSync(join(state, 'export-diff'), '');
  });

  async function readDiff(from?: string): Promise<number> {
    const diff = await backend.snapshotDiff('vol', 's1', from);
    let bytes = 0;
    for await (const record of diff.records) if (record.kind === 'data') bytes += record.data.length;
    await diff.finish();
    return bytes;
  }

  async function listed(): Promise<{ offset: number; length: number }[]> {
    const extents = [];
    for await (const extent of backend.allocatedExtents('vol')) extents.push(extent);
    return extents;
  }

  it("reads a diff of the snapshot's size from the image's creation", async () => {
    writeFileSync(join(state, 'export-diff'), diffStream(64 * MiB, { data: { offset: MiB, length: 4096 } }));
    assert.equal(await readDiff(), 4096);
  });

  it("refuses a diff whose size is not the snapshot's, or that starts elsewhere", async () => {
    writeFileSync(join(state, 'export-diff'), diffStream(32 * MiB));
    await assert.rejects(readDiff(), /reported 33554432 bytes, where the snapshot has 67108864/);
    writeFileSync(join(state, 'export-diff'), diffStream(64 * MiB, { from: 'older' }));
    await assert.rejects(readDiff(), /reported 67108864 bytes from snapshot older, where the snapshot has 67108864/);
    await assert.rejects(readDiff('base'), /where the snapshot has 67108864 and the diff starts at base/);
    // A name from a forged ledger document is refused before any tool runs.
    await assert.rejects(backend.snapshotDiff('vol', '../s1', undefined), /snapshot name/);
    await assert.rejects(backend.snapshotDiff('vol', 's1', '-x'), /snapshot name/);
  });

  it('reads the allocation listing, zero extents left out', async () => {
    writeFileSync(
      join(state, 'diff'),
      'Offset    Length   Type\n0         4194304  data\n8388608   4194304  zero\n62914560  4194304  data\n',
    );
    assert.deepEqual(await listed(), [
      { offset: 0, length: 4 * MiB },
      { offset: 60 * MiB, length: 4 * MiB },
    ]);
  });

  it('refuses an allocation listing out of order, past the size, or with a line that is no extent', async () => {
    writeFileSync(join(state, 'diff'), 'Offset Length Type\n8388608 4194304 data\n0 4194304 data\n');
    await assert.rejects(listed(), /listed "0 4194304 data", not an extent in order within its size/);
    writeFileSync(join(state, 'diff'), 'Offset Length Type\n65011712 4194304 data\n');
    await assert.rejects(listed(), /listed "65011712 4194304 data"/);
    writeFileSync(join(state, 'diff'), 'Offset Length Type\n0 4194304 data; rm -rf /\n');
    await assert.rejects(listed(), /not an extent/);
  });
});
