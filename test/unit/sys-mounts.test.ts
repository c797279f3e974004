import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { LatchError } from '../../src/errors.js';
import { checkMountOptions, isMountPoint, mount, mountsAt, parseMountInfo, unescapeMountField } from '../../src/sys/mounts.js';
import { findmnt } from '../fixtures/findmnt.js';

const FIXTURE = [
  '22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:5 - proc proc rw',
  '36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue',
  '100 22 7:3 / /var/lib/kubelet/plugins/latch/mounts/my\\040volume rw,relatime shared:60 master:2 - ext4 /dev/loop3 rw',
  '101 22 7:3 /sub\\011dir /tmp/back\\134slash\\012nl ro,relatime - ext4 /dev/loop3 ro,errors=remount-ro',
  '102 22 0:50 / /srv/nfs rw - nfs server:/export\\040dir rw,vers=4.2,addr=10.0.0.1',
  'garbage line',
  '',
].join('\n');

describe('mountinfo parsing', () => {
  it('decodes octal escapes', () => {
    assert.equal(unescapeMountField('a\\040b\\011c\\012d\\134e'), 'a b\tc\nd\\e');
    assert.equal(unescapeMountField('plain'), 'plain');
  });

  it('parses every field, with and without optional fields', () => {
    const entries = parseMountInfo(FIXTURE);
    assert.equal(entries.length, 5);
    assert.deepEqual(entries[1], {
      id: 36,
      parentId: 35,
      majorMinor: '98:0',
      root: '/mnt1',
      mountPoint: '/mnt2',
      options: ['rw', 'noatime'],
      optionalFields: ['master:1'],
      fsType: 'ext3',
      source: '/dev/root',
      superOptions: ['rw', 'errors=continue'],
    });
    assert.equal(entries[2]!.mountPoint, '/var/lib/kubelet/plugins/latch/mounts/my volume');
    assert.deepEqual(entries[2]!.optionalFields, ['shared:60', 'master:2']);
    assert.equal(entries[3]!.root, '/sub\tdir');
    assert.equal(entries[3]!.mountPoint, '/tmp/back\\slash\nnl');
    assert.deepEqual(entries[3]!.optionalFields, []);
    assert.deepEqual(entries[3]!.options, ['ro', 'relatime']);
    assert.equal(entries[4]!.source, 'server:/export dir');
    assert.deepEqual(entries[4]!.superOptions, ['rw', 'vers=4.2', 'addr=10.0.0.1']);
  });

  it('mountsAt matches the normalised path against a given table', async () => {
    const table = parseMountInfo(FIXTURE);
    assert.equal((await mountsAt('/mnt2/', table)).length, 1);
    assert.equal((await mountsAt('/mnt2/../mnt2', table)).length, 1);
    assert.equal((await mountsAt('/var/lib/kubelet/plugins/latch/mounts/my volume', table))[0]?.id, 100);
    assert.equal((await mountsAt('/mnt', table)).length, 0);
  });

  it('reads the real table', async () => {
    assert.equal(await isMountPoint('/proc'), true);
    assert.equal(await isMountPoint('/proc/self'), false);
  });

  it('checks mount options and paths', async () => {
    assert.deepEqual(checkMountOptions(['noatime', 'discard', 'errors=remount-ro']), ['noatime', 'discard', 'errors=remount-ro']);
    assert.throws(() => checkMountOptions(['rw,suid']), LatchError);
    assert.throws(() => checkMountOptions(['-o']), LatchError);
    assert.throws(() => checkMountOptions(['a b']), LatchError);
    await assert.rejects(mount('/dev/loop0', 'relative/path', { fsType: 'ext4' }), LatchError);
    await assert.rejects(mount('/dev/loop0', '/mnt', { fsType: 'ext4; rm' }), LatchError);
    await assert.rejects(findmnt('--help'), LatchError);
  });
});
