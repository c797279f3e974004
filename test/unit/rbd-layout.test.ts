// What the rbd backend keeps in a node's mount dir (src/backend/rbd-layout.ts): each path from one place, and the
// readers that recognise them (doctor, imageOf) agree with the writers.
import assert from 'node:assert/strict';
import { basename } from 'node:path';
import { test } from 'node:test';
import { leftoverOf } from '../../src/atomic-file.js';
import {
  clientRecordFile,
  fuseImageFile,
  fuseLogFile,
  fuseMountPoint,
  imageOfFuseFile,
  isFuseMountPoint,
  keyringFile,
  nodeClientFile,
  snapshotExportFile,
} from '../../src/backend/rbd-layout.js';

const DIR = '/var/lib/latch/rbd';

test('an image is mounted at <mountDir>/<image>, its file at <mountDir>/<image>/<image>', () => {
  assert.equal(fuseMountPoint(DIR, 'vol-a'), '/var/lib/latch/rbd/vol-a');
  assert.equal(fuseImageFile(DIR, 'vol-a'), '/var/lib/latch/rbd/vol-a/vol-a');
  assert.equal(imageOfFuseFile(DIR, fuseImageFile(DIR, 'vol-a')), 'vol-a');
  assert.ok(isFuseMountPoint(DIR, fuseMountPoint(DIR, 'vol-a')));
});

test("files that are not an image's rbd-fuse file or mount point are not taken for one", () => {
  for (const file of [
    '/var/lib/latch/rbd/vol-a/vol-b',
    '/var/lib/latch/rbd/vol-a',
    '/elsewhere/vol-a/vol-a',
    '/var/lib/latch/rbd/x/vol-a/vol-a',
  ]) {
    assert.equal(imageOfFuseFile(DIR, file), undefined, file);
  }
  for (const path of [
    DIR,
    'var/lib/latch/rbd/vol-a', // relative
    '/var/lib/latch/rbd/vol-a/vol-a', // below a mount point
    '/var/lib/latch/rbd/.logs', // the dot-names beside the mount points
    '/var/lib/latch/rbd/.clients',
    '/var/lib/latch/rbd/.keys',
    '/var/lib/latch/other',
  ]) {
    assert.equal(isFuseMountPoint(DIR, path), false, path);
  }
});

test('everything else is a dot-name directly below the mount dir or in a dot-directory, never below a mount point', () => {
  const others = [
    fuseLogFile(DIR, 'vol-a'),
    clientRecordFile(DIR, 'vol-a'),
    keyringFile(DIR, 'tenant'),
    nodeClientFile(DIR),
    snapshotExportFile(DIR, 'vol-a', 'snap-1'),
  ];
  assert.deepEqual(others.slice(0, 4), [
    '/var/lib/latch/rbd/.logs/vol-a.log',
    '/var/lib/latch/rbd/.clients/vol-a',
    '/var/lib/latch/rbd/.keys/client.tenant.keyring',
    '/var/lib/latch/rbd/.node-client',
  ]);
  for (const path of others) {
    const first = path.slice(DIR.length + 1).split('/')[0] ?? '';
    assert.ok(path.startsWith(`${DIR}/`) && first.startsWith('.'), path);
  }
  // A killed export is a recognisable leftover, and a second export of the same snapshot gets its own file.
  const exported = snapshotExportFile(DIR, 'vol-a', 'snap-1');
  assert.deepEqual(leftoverOf(basename(exported)), { name: 'export-vol-a@snap-1', pid: process.pid });
  assert.notEqual(snapshotExportFile(DIR, 'vol-a', 'snap-1'), exported);
});
