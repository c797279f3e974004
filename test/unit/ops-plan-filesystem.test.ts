// planFilesystem (src/node/filesystem.ts): the pure "may we mkfs?" decision behind mountdevice and mount. It uses the
// filesystem found, formats only a blank device of a volume that never held one, for a read-write request, on the only
// node holding it, and refuses everything else with a message that says why.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { LatchError } from '../../src/errors.js';
import type { FsType } from '../../src/filesystems.js';
import { newVolume } from '../../src/ledger/arbitrate.js';
import type { NodeAttachment, VolumeDoc } from '../../src/ledger/types.js';
import { planFilesystem, type FilesystemPlan } from '../../src/node/filesystem.js';

const NOW = '2026-01-01T00:00:00.000Z';

function doc(options: { fsType?: FsType; held?: string; nodes?: string[] } = {}): VolumeDoc {
  const d = newVolume('vol-1', 1024 ** 3, options.fsType ?? 'ext4', NOW);
  if (options.held !== undefined) d.status.filesystem = options.held;
  for (const node of options.nodes ?? ['node-a']) {
    const entry: NodeAttachment = { phase: 'attached', readOnly: false, since: NOW, device: '/dev/fake0' };
    d.status.nodes[node] = entry;
  }
  return d;
}

interface Case {
  name: string;
  doc: VolumeDoc;
  found: string | undefined;
  wanted: FsType | undefined;
  mayFormat: boolean;
  expect: FilesystemPlan | RegExp;
}

const CASES: Case[] = [
  {
    name: 'uses the filesystem found',
    doc: doc({ held: 'ext4' }),
    found: 'ext4',
    wanted: undefined,
    mayFormat: true,
    expect: { use: 'ext4' },
  },
  { name: 'uses it when it is the one asked for', doc: doc(), found: 'xfs', wanted: 'xfs', mayFormat: true, expect: { use: 'xfs' } },
  {
    name: 'uses it for a read-only request',
    doc: doc({ held: 'btrfs' }),
    found: 'btrfs',
    wanted: undefined,
    mayFormat: false,
    expect: { use: 'btrfs' },
  },
  {
    name: 'uses it while other nodes hold the volume too (read-only-many)',
    doc: doc({ held: 'ext4', nodes: ['node-a', 'node-b'] }),
    found: 'ext4',
    wanted: 'ext4',
    mayFormat: false,
    expect: { use: 'ext4' },
  },
  {
    name: 'uses a filesystem made outside latch (ext2), when none is asked for',
    doc: doc(),
    found: 'ext2',
    wanted: undefined,
    mayFormat: true,
    expect: { use: 'ext2' },
  },
  {
    name: 'refuses another fsType than the one found: never reformats',
    doc: doc(),
    found: 'xfs',
    wanted: 'ext4',
    mayFormat: true,
    expect: /^volume vol-1 holds a xfs filesystem, but ext4 was asked for; latch never reformats a volume$/,
  },
  {
    name: 'formats a blank device with the fsType asked for',
    doc: doc({ fsType: 'ext4' }),
    found: undefined,
    wanted: 'xfs',
    mayFormat: true,
    expect: { format: 'xfs' },
  },
  {
    name: "formats a blank device with the volume's fsType when none is asked for",
    doc: doc({ fsType: 'btrfs' }),
    found: undefined,
    wanted: undefined,
    mayFormat: true,
    expect: { format: 'btrfs' },
  },
  {
    name: 'refuses to format a blank device of a volume that held a filesystem',
    doc: doc({ held: 'ext4' }),
    found: undefined,
    wanted: 'ext4',
    mayFormat: true,
    expect: /^volume vol-1 held a ext4 filesystem but its device shows none now; refusing to format it/,
  },
  {
    name: 'refuses to format for a read-only request',
    doc: doc(),
    found: undefined,
    wanted: undefined,
    mayFormat: false,
    expect: /^volume vol-1 is blank and was asked for read-only: there is nothing to mount/,
  },
  {
    name: 'refuses to format while another node holds the volume',
    doc: doc({ nodes: ['node-a', 'node-b'] }),
    found: undefined,
    wanted: 'ext4',
    mayFormat: true,
    expect: /^volume vol-1 is blank but also held by node-b; refusing to format it$/,
  },
  {
    name: 'refuses to format while another node holds it even when this node has no entry',
    doc: doc({ nodes: ['node-c'] }),
    found: undefined,
    wanted: undefined,
    mayFormat: true,
    expect: /also held by node-c/,
  },
];

describe('planFilesystem', () => {
  for (const c of CASES) {
    it(c.name, () => {
      const facts = { doc: c.doc, found: c.found, wanted: c.wanted, mayFormat: c.mayFormat, node: 'node-a' };
      const refusal = c.expect;
      if (refusal instanceof RegExp) {
        assert.throws(
          () => planFilesystem(facts),
          (err: unknown) => err instanceof LatchError && refusal.test(err.message),
        );
      } else assert.deepEqual(planFilesystem(facts), c.expect);
    });
  }

  it('is pure: it changes nothing in the document it is given', () => {
    const d = doc({ nodes: ['node-a', 'node-b'] });
    const before = structuredClone(d);
    assert.throws(() => planFilesystem({ doc: d, found: undefined, wanted: 'ext4', mayFormat: true, node: 'node-a' }));
    planFilesystem({ doc: d, found: 'ext4', wanted: undefined, mayFormat: true, node: 'node-a' });
    assert.deepEqual(d, before);
  });
});
