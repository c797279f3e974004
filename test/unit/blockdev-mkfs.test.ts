// makeFs's failures: mkfs.btrfs's mount check trips over any dead or fenced FUSE mount under a mounted loop device on
// the node, whatever volume it belongs to, so its failure says so and points at doctor; other failures pass unchanged.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { makeFs } from '../../src/sys/blockdev.js';
import { fakeToolsOnPath, type FakeTools } from '../fixtures/fake-tools.js';

describe('makeFs failures', () => {
  let tools: FakeTools;
  before(() => {
    tools = fakeToolsOnPath('latch-mkfs-', {
      // What mkfs.btrfs prints when a mounted loop device's backing file is on a FUSE mount whose daemon died.
      'mkfs.btrfs': [
        '#!/bin/sh',
        'if [ "$2" = /dev/loop-hung ]; then exec sleep 30; fi',
        'echo "ERROR: cannot check mount status of $2: Transport endpoint is not connected" >&2',
        'exit 1',
      ].join('\n'),
      'mkfs.xfs': '#!/bin/sh\necho "mkfs.xfs: cannot open $2: Device or resource busy" >&2\nexit 1\n',
    });
  });
  after(() => tools.restore());

  it("names the dead FUSE mount and doctor when mkfs.btrfs cannot check the device's mount status", async () => {
    await assert.rejects(makeFs('/dev/loop-dead', 'btrfs'), (err: Error) => {
      assert.match(err.message, /Transport endpoint is not connected/, 'the tool’s own words stay');
      assert.match(err.message, /FUSE mount that is dead or fenced: latch doctor names/);
      return true;
    });
  });

  it('says the same when mkfs.btrfs hangs past its deadline (a fenced FUSE mount)', async () => {
    await assert.rejects(makeFs('/dev/loop-hung', 'btrfs', { timeoutMs: 300 }), (err: Error) => {
      assert.match(err.message, /mkfs\.btrfs/);
      assert.match(err.message, /FUSE mount that is dead or fenced/);
      return true;
    });
  });

  it("leaves another filesystem's failure as the tool said it", async () => {
    await assert.rejects(makeFs('/dev/loop-busy', 'xfs'), (err: Error) => {
      assert.match(err.message, /Device or resource busy/);
      assert.doesNotMatch(err.message, /FUSE/);
      return true;
    });
  });
});
