// The configuration of freezes and manual mounts: the freeze bound's default and range, the manual mount root's
// defaults. The freezes themselves, on a real loop-mounted ext4 (root), are in test/integration/freeze-bounded.test.ts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseConfig } from '../../src/config.js';

describe('the configuration of freezes and manual mounts', () => {
  it('defaults to a 5 s bound and a root-only manual mount root with noexec; refuses what is out of range', () => {
    const c = parseConfig({}, 'test');
    assert.equal(c.freezeSeconds, 5);
    assert.deepEqual(c.manualAttach, { mountRoot: '/var/lib/latch/manual', exec: false });
    assert.equal(parseConfig({ freezeSeconds: 0 }, 'test').freezeSeconds, 0);
    assert.throws(() => parseConfig({ freezeSeconds: 61 }, 'test'), /field "freezeSeconds"/);
    assert.throws(() => parseConfig({ freezeSeconds: 1.5 }, 'test'), /field "freezeSeconds"/);
    assert.throws(
      () => parseConfig({ manualAttach: { mountRoot: 'relative/dir' } }, 'test'),
      /field "manualAttach.mountRoot": must be an absolute path/,
    );
    assert.throws(
      () => parseConfig({ manualAttach: { mountRoot: '/mnt', suid: true } }, 'test'),
      /field "manualAttach": unknown field\(s\) "suid"/,
    );
  });
});
