// backend.client "auto" (the default): the kernel client where the kernel has the rbd module, else rbd-fuse; made
// once per node and recorded, so a node keeps the client its mappings were made with. Explicit settings are kept.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { chooseRbdClient, kernelHasRbd, type KernelPaths } from '../../src/backend/client-choice.js';
import { parseConfig } from '../../src/config.js';

const work = mkdtempSync(join(tmpdir(), 'latch-client-choice-'));
after(() => rmSync(work, { recursive: true, force: true }));
let cases = 0;

/** A fake /sys and /lib/modules/<release>: with the module loaded, listed in modules.dep or modules.builtin, or none. */
function kernel(rbd: 'loaded' | 'loadable' | 'builtin' | 'none'): KernelPaths {
  const dir = join(work, `kernel-${++cases}`);
  const paths = { sys: join(dir, 'sys'), modules: join(dir, 'modules') };
  mkdirSync(join(paths.sys, 'bus', 'pci'), { recursive: true });
  mkdirSync(paths.modules, { recursive: true });
  writeFileSync(join(paths.modules, 'modules.dep'), 'kernel/drivers/block/loop.ko.zst:\nkernel/drivers/block/nbd.ko.zst:\n');
  writeFileSync(join(paths.modules, 'modules.builtin'), 'kernel/fs/ext4/ext4.ko\n');
  if (rbd === 'loaded') mkdirSync(join(paths.sys, 'bus', 'rbd'));
  if (rbd === 'loadable') {
    writeFileSync(
      join(paths.modules, 'modules.dep'),
      'kernel/drivers/block/loop.ko.zst:\nkernel/drivers/block/rbd.ko.zst: kernel/net/ceph/libceph.ko.zst\n',
    );
  }
  if (rbd === 'builtin') writeFileSync(join(paths.modules, 'modules.builtin'), 'kernel/fs/ext4/ext4.ko\nkernel/drivers/block/rbd.ko\n');
  return paths;
}

function mountDir(): string {
  return join(work, `mount-${++cases}`);
}

describe('the node client "auto" stands for', () => {
  it('krbd where the rbd module is loaded, loadable or built in; rbd-fuse where it is not (a module named like it does not count)', () => {
    assert.equal(kernelHasRbd(kernel('loaded')), true);
    assert.equal(kernelHasRbd(kernel('loadable')), true);
    assert.equal(kernelHasRbd(kernel('builtin')), true);
    assert.equal(kernelHasRbd(kernel('none')), false);
    const lookalike = kernel('none');
    writeFileSync(join(lookalike.modules, 'modules.dep'), 'kernel/drivers/block/xrbd.ko:\nkernel/drivers/block/rbd.kod:\n');
    assert.equal(kernelHasRbd(lookalike), false);
    assert.equal(kernelHasRbd({ sys: join(work, 'nothing'), modules: join(work, 'nothing') }), false, 'no /lib/modules at all');
  });

  it('is chosen once per node and recorded: a module that appears later does not change it', () => {
    const dir = mountDir();
    assert.equal(chooseRbdClient('auto', dir, { record: true, kernel: kernel('none') }), 'rbd-fuse');
    assert.equal(readFileSync(join(dir, '.node-client'), 'utf8'), 'rbd-fuse\n');
    assert.equal(chooseRbdClient('auto', dir, { record: true, kernel: kernel('loaded') }), 'rbd-fuse', 'the recorded choice stands');
    const other = mountDir();
    assert.equal(chooseRbdClient('auto', other, { record: true, kernel: kernel('loadable') }), 'krbd');
    assert.equal(chooseRbdClient('auto', other, { record: true, kernel: kernel('none') }), 'krbd');
  });

  it('without record (doctor) chooses but writes nothing; a recorded file that says something else is chosen again', () => {
    const dir = mountDir();
    assert.equal(chooseRbdClient('auto', dir, { record: false, kernel: kernel('loaded') }), 'krbd');
    assert.equal(existsSync(dir), false);
    mkdirSync(dir);
    writeFileSync(join(dir, '.node-client'), 'nbd\n');
    assert.equal(chooseRbdClient('auto', dir, { record: true, kernel: kernel('none') }), 'rbd-fuse');
    assert.equal(readFileSync(join(dir, '.node-client'), 'utf8'), 'rbd-fuse\n');
  });

  it('an explicit "krbd" or "rbd-fuse" is used as it is, whatever the kernel has or the node recorded', () => {
    const dir = mountDir();
    assert.equal(chooseRbdClient('rbd-fuse', dir, { record: true, kernel: kernel('loaded') }), 'rbd-fuse');
    assert.equal(chooseRbdClient('krbd', dir, { record: true, kernel: kernel('none') }), 'krbd');
    assert.equal(existsSync(dir), false, 'nothing recorded');
  });
});

describe('backend.client in the configuration', () => {
  const base = { nodeName: 'n', stateDir: '/tmp/x', poolDir: '/tmp/y', logFile: '/tmp/z.log' };
  it('is "auto" unless set; "rbd-fuse" and "krbd" are kept; anything else is refused', () => {
    const client = (backend: Record<string, unknown>) => {
      const config = parseConfig({ ...base, backend: { type: 'rbd', ...backend } }, 'test');
      return config.backend.type === 'rbd' ? config.backend.client : undefined;
    };
    assert.equal(client({}), 'auto');
    assert.equal(client({ client: 'rbd-fuse' }), 'rbd-fuse');
    assert.equal(client({ client: 'krbd' }), 'krbd');
    assert.throws(() => client({ client: 'nbd' }), /client/);
  });
});
