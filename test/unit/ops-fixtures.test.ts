// The fixtures the op tests stand on: if the in-memory store or the fake node were more lenient than the real ones,
// the op tests would prove nothing. These check that they keep the promises of the interfaces they stand in for.
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { ConflictError, LatchError } from '../../src/errors.js';
import { Ledger } from '../../src/ledger/ledger.js';
import { CommandError } from '../../src/sys/run.js';
import { FakeNode, WITHOUT_SYS_RESOURCE } from '../fixtures/fake-node.js';
import { MemoryStore } from '../fixtures/memory-store.js';
import { Cluster, GiB, goJson, podOptions } from '../fixtures/op-harness.js';

describe('MemoryStore', () => {
  it('puts with compare-and-swap: 0 creates, the current revision updates, a stale one conflicts', async () => {
    const store = new MemoryStore();
    const r1 = await store.put('volumes/a', { n: 1 }, 0);
    await assert.rejects(store.put('volumes/a', { n: 2 }, 0), ConflictError);
    const r2 = await store.put('volumes/a', { n: 2 }, r1);
    assert.ok(r2 > r1);
    await assert.rejects(store.put('volumes/a', { n: 3 }, r1), ConflictError);
    assert.deepEqual(await store.get('volumes/a'), { value: { n: 2 }, revision: r2 });
  });

  it('never reuses a revision, not even after a delete and a re-create', async () => {
    const store = new MemoryStore();
    const r1 = await store.put('volumes/a', 1, 0);
    await store.delete('volumes/a', r1);
    assert.equal(await store.get('volumes/a'), undefined);
    const r2 = await store.put('volumes/a', 1, 0);
    assert.ok(r2 > r1);
  });

  it('deletes only at the current revision; deleting a missing key with 0 is a no-op', async () => {
    const store = new MemoryStore();
    await store.delete('volumes/none', 0);
    const r1 = await store.put('volumes/a', 1, 0);
    await assert.rejects(store.delete('volumes/a', 0), ConflictError);
    await assert.rejects(store.delete('volumes/a', r1 + 1), ConflictError);
    await store.delete('volumes/a', r1);
    await assert.rejects(store.delete('volumes/a', r1), ConflictError);
  });

  it('copies values in and out, lists one kind sorted, and checks keys', async () => {
    const store = new MemoryStore();
    const value = { list: [1] };
    await store.put('volumes/b', value, 0);
    value.list.push(2);
    const got = await store.get('volumes/b');
    (got?.value as { list: number[] }).list.push(3);
    assert.deepEqual((await store.get('volumes/b'))?.value, { list: [1] });
    await store.put('volumes/a', 1, 0);
    await store.put('pvs/c', 1, 0);
    assert.deepEqual(await store.list('volumes'), ['a', 'b']);
    assert.deepEqual(await store.list('pvs'), ['c']);
    for (const bad of ['volumes/../x', 'volumes/A', 'volumes', '/volumes/a', 'volumes/a/b']) {
      await assert.rejects(store.get(bad), /invalid store key/);
      await assert.rejects(store.put(bad, 1, 0), /invalid store key/);
    }
  });

  it('lets the ledger win a race against a concurrent writer (it re-reads on conflict)', async () => {
    const store = new MemoryStore();
    const ledger = new Ledger(store);
    await ledger.createVolume('a', { sizeBytes: GiB, fsType: 'ext4' });
    let raced = false;
    store.beforeWrite = async () => {
      if (raced) return;
      raced = true;
      await ledger.recordFilesystem('a', 'ext4'); // lands between the ledger's read and its write
    };
    await ledger.recordSize('a', 2 * GiB);
    const doc = await ledger.get('a');
    assert.deepEqual([doc?.spec.sizeBytes, doc?.status.filesystem], [2 * GiB, 'ext4']);
  });
});

describe('FakeNode', () => {
  const dir = (cluster: Cluster, name: string) => {
    const path = join(cluster.root, name);
    mkdirSync(path, { recursive: true });
    return path;
  };

  it('sets up one device per volume, the lowest free number, only for existing storage', async () => {
    const fake = new FakeNode({ maxSize: 10 * GiB });
    await assert.rejects(fake.backend.attach('a'), /no image/);
    await fake.backend.create('a', GiB);
    await fake.backend.create('b', GiB);
    assert.equal(await fake.backend.attach('a'), '/dev/fake0');
    assert.equal(await fake.backend.attach('a'), '/dev/fake0');
    assert.equal(await fake.backend.attach('b'), '/dev/fake1');
    await fake.backend.release('a');
    await fake.backend.release('a');
    assert.equal(await fake.backend.findDevice('a'), undefined);
    assert.equal(await fake.backend.volumeOfDevice('/dev/fake1'), 'b');
    await assert.rejects(fake.backend.delete('b'), /still set up as \/dev\/fake1/);
    await fake.backend.create('c', GiB);
    assert.equal(await fake.backend.attach('c'), '/dev/fake0');
  });

  it('refuses what the loop backend refuses: above maxSize, smaller existing storage, shrinking', async () => {
    const fake = new FakeNode({ maxSize: 2 * GiB });
    await assert.rejects(fake.backend.create('a', 3 * GiB), LatchError);
    await fake.backend.create('a', GiB);
    await fake.backend.create('a', GiB / 2);
    await assert.rejects(fake.backend.create('a', 2 * GiB), /already exists/);
    await assert.rejects(fake.backend.grow('a', GiB / 2), /shrink/);
    await assert.rejects(fake.backend.grow('a', 3 * GiB), /maxSize/);
    await assert.rejects(fake.backend.create('../x', GiB), LatchError);
  });

  it('mounts like the kernel: an existing directory, a set-up device, the fsType in the storage', async () => {
    const cluster = new Cluster();
    const fake = new FakeNode({ maxSize: 10 * GiB });
    const target = dir(cluster, 'mnt');
    await fake.backend.create('a', GiB);
    await assert.rejects(fake.system.mount('/dev/fake0', target, { fsType: 'ext4' }), /no such device/);
    const device = await fake.backend.attach('a');
    await assert.rejects(fake.system.mount(device, target, { fsType: 'ext4' }), /wrong fs type/);
    await assert.rejects(fake.system.mount(device, join(target, 'missing'), { fsType: 'ext4' }), /does not exist/);
    await fake.system.makeFs(device, 'xfs');
    await fake.system.makeFs(device, 'ext4');
    assert.equal(await fake.system.probeFsType(device), 'ext4', 'mkfs formats over whatever is there, as mkfs -F does');
    await fake.system.mount(device, target, { fsType: 'ext4', options: ['noatime'], readOnly: true });
    const top = (await fake.system.mountsAt(target)).at(-1);
    assert.deepEqual([top?.source, top?.mountPoint, top?.fsType, top?.options], [device, target, 'ext4', ['ro', 'noatime']]);
    assert.equal(await fake.system.isDeviceMounted(device), true);
    assert.equal((await fake.system.readMountInfo())[0]?.mountPoint, '/', "the host's root is always there");
  });

  it('binds a subdirectory with its root, refuses to unmount a mount with another under it, and defers a busy release', async () => {
    const cluster = new Cluster();
    const fake = new FakeNode({ maxSize: 10 * GiB });
    fake.addVolume('a', GiB, 'ext4');
    const device = fake.setUpDeviceDirectly('a');
    const staging = dir(cluster, 'staging');
    await fake.system.mount(device, staging, { fsType: 'ext4' });
    const sub = join(staging, 'sub');
    mkdirSync(sub);
    const pod = dir(cluster, 'pod');
    await fake.system.bindMount(sub, pod, true);
    assert.deepEqual([fake.topAt(pod)?.source, fake.topAt(pod)?.root, fake.topAt(pod)?.options], [device, '/sub', ['ro']]);
    const inner = join(staging, 'inner');
    mkdirSync(inner);
    fake.mountForeign('tmpfs', inner, 'tmpfs');
    await assert.rejects(fake.system.umount(staging), /target is busy/);
    assert.equal(await fake.system.umount(inner), true);
    assert.equal(await fake.system.umount(inner), false);

    await assert.rejects(fake.backend.release('a'), /deferred/);
    assert.equal(fake.devices.size, 1, 'still there while mounted');
    await fake.system.umount(staging);
    assert.equal(fake.devices.size, 1, 'the bind mount still holds it');
    await fake.system.umount(pod);
    assert.equal(fake.devices.size, 0, 'gone with its last unmount');
  });

  it('grows an ext filesystem only with CAP_SYS_RESOURCE, online, to the capacity the device has', async () => {
    const cluster = new Cluster();
    const fake = new FakeNode({ maxSize: 10 * GiB });
    fake.addVolume('a', GiB, 'ext4');
    const device = fake.setUpDeviceDirectly('a');
    const target = dir(cluster, 'mnt');
    await assert.rejects(fake.system.growFs(device, target, 'ext4'), /not mounted/);
    await fake.system.mount(device, target, { fsType: 'ext4' });
    await fake.backend.grow('a', 2 * GiB);
    fake.capabilities = WITHOUT_SYS_RESOURCE;
    await assert.rejects(
      fake.system.growFs(device, target, 'ext4'),
      (err: unknown) => err instanceof CommandError && /Permission denied/.test(err.stderrTail),
    );
    fake.capabilities = undefined;
    await fake.system.growFs(device, target, 'ext4');
    assert.equal(fake.volumes.get('a')?.fsBytes, 2 * GiB);
  });

  it('records calls and lets a test change their outcome, once or until removed', async () => {
    const fake = new FakeNode({ maxSize: 10 * GiB });
    fake.failNext('size', new LatchError('boom'));
    await assert.rejects(fake.backend.size('a'), /boom/);
    assert.equal(await fake.backend.size('a'), undefined);
    const remove = fake.intercept('size', () => ({ result: 42 }));
    assert.equal(await fake.backend.size('a'), 42);
    assert.equal(await fake.backend.size('b'), 42);
    remove();
    assert.equal(await fake.backend.size('a'), undefined);
    assert.deepEqual(fake.callsOf('size'), [['a'], ['a'], ['a'], ['b'], ['a']]);
  });
});

describe('the options JSON as Go marshals it', () => {
  it('sorts the keys and escapes <, > and &', () => {
    assert.equal(
      goJson({ 'kubernetes.io/readwrite': 'rw', 'kubernetes.io/pvOrVolumeName': 'pv-1', 'kubernetes.io/fsType': 'ext4' }),
      '{"kubernetes.io/fsType":"ext4","kubernetes.io/pvOrVolumeName":"pv-1","kubernetes.io/readwrite":"rw"}',
    );
    assert.equal(goJson({ b: '<&>', a: 'x' }), '{"a":"x","b":"\\u003c\\u0026\\u003e"}');
  });

  it("builds mount's options with the pod keys; user options override, and sort in", () => {
    assert.equal(
      podOptions('pv-1', { uid: 'u1', name: 'web-0', fsGroup: 2000 }, { readOnly: 'true' }),
      '{"kubernetes.io/fsType":"ext4","kubernetes.io/mounterArgs.FsGroup":"2000","kubernetes.io/pod.name":"web-0",' +
        '"kubernetes.io/pod.namespace":"default","kubernetes.io/pod.uid":"u1","kubernetes.io/pvOrVolumeName":"pv-1",' +
        '"kubernetes.io/readwrite":"rw","kubernetes.io/serviceAccount.name":"default","readOnly":"true"}',
    );
  });
});
