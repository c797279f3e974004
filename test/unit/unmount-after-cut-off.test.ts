// unmountTopOnceFree: right after a fenced mapping is cut off, the processes that waited on it let go of their files
// a moment later, and until then the kernel refuses the unmount as busy: it is tried again, and any other failure is
// not.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { Context } from '../../src/context.js';
import { LatchError } from '../../src/errors.js';
import { unmountTopOnceFree } from '../../src/node/device.js';

/** A context whose mount table has one mount at /g, and whose umount fails with `failures` in turn, then succeeds. */
function contextFailing(failures: string[]) {
  let calls = 0;
  const mount = { mountPoint: '/g', source: '/dev/loop7', fsType: 'ext4' };
  const ctx = {
    backend: { freedByUnmount: true },
    system: {
      readMountInfo: async () => [mount],
      mountsAt: async (path: string) => (path === '/g' ? [mount] : []),
      umount: async () => {
        const failure = failures[calls++];
        if (failure !== undefined) throw new LatchError(`umount /g failed (exit 32): umount: /g: ${failure}`);
        return true;
      },
    },
  } as unknown as Context;
  return { ctx, calls: () => calls };
}

describe('unmounting right after a cut-off', () => {
  it('tries again while the kernel says the target is busy, then unmounts', async () => {
    const { ctx, calls } = contextFailing(['target is busy.', 'target is busy.']);
    assert.equal(await unmountTopOnceFree(ctx, '/g'), true);
    assert.equal(calls(), 3);
  });

  it('does not try again after another failure', async () => {
    const { ctx, calls } = contextFailing(['not mounted.']);
    await assert.rejects(unmountTopOnceFree(ctx, '/g'), /not mounted/);
    assert.equal(calls(), 1);
  });
});
