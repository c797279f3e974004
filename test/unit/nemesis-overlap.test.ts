// Which of the nemesis suite's faults may overlap (test/nemesis/nemesis.ts, overlapExclusion): pairs that change the
// same link, route, table or daemon, or that cannot be healed in either order, are refused with a reason; the
// fixed schedule's pairs and pairs on unrelated parts are allowed.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { FAULT_KINDS, overlapExclusion } from '../nemesis/nemesis.js';

describe('overlapping nemesis faults', () => {
  it('allows the fixed schedule pairs and unrelated faults, on one node or two', () => {
    const allowed = [
      [
        { kind: 'isolate-node', node: 'node-a' },
        { kind: 'kill-mon', node: 'node-a' },
      ],
      [
        { kind: 'isolate-node', node: 'node-a' },
        { kind: 'node-etcd-cut', node: 'node-c' },
      ],
      [
        { kind: 'etcd-minority', node: 'node-a' },
        { kind: 'kill-agent', node: 'node-a' },
      ],
      [
        { kind: 'isolate-node', node: 'node-a' },
        { kind: 'node-etcd-cut', node: 'node-a' },
      ],
      [
        { kind: 'one-way', node: 'node-a' },
        { kind: 'packet-loss', node: 'node-a' },
      ],
      [
        { kind: 'etcd-majority', node: 'node-a' },
        { kind: 'etcd-minority', node: 'node-b' },
      ],
      [
        { kind: 'kill-call', node: 'node-a' },
        { kind: 'isolate-node', node: 'node-b' },
      ],
      [
        { kind: 'kill-call', node: 'node-a' },
        { kind: 'kill-agent', node: 'node-a' },
      ],
    ] as const;
    for (const [a, b] of allowed) {
      assert.equal(overlapExclusion(a, b), undefined, `${a.kind} + ${b.kind}`);
      assert.equal(overlapExclusion(b, a), undefined, `${b.kind} + ${a.kind}`);
    }
  });

  it('refuses pairs that change the same thing or cannot heal, in either order, with the reason', () => {
    const refused = [
      [{ kind: 'one-way', node: 'node-a' }, { kind: 'node-etcd-cut', node: 'node-a' }, /both change route node-a>etcd-0/],
      [{ kind: 'etcd-minority', node: 'node-a' }, { kind: 'etcd-minority', node: 'node-b' }, /both change route etcd-0>etcd-1/],
      [{ kind: 'etcd-minority', node: 'node-a' }, { kind: 'node-etcd-cut', node: 'node-a' }, /both change route node-a>etcd-1/],
      [{ kind: 'node-storage-cut', node: 'node-b' }, { kind: 'one-way', node: 'node-b' }, /both change route node-b>storage/],
      [{ kind: 'packet-loss', node: 'node-c' }, { kind: 'packet-loss', node: 'node-c' }, /both change nftables node-c/],
      [{ kind: 'kill-osd', node: 'node-a' }, { kind: 'kill-mon', node: 'node-b' }, /the OSD's restart needs the monitor/],
      [{ kind: 'kill-call', node: 'node-a' }, { kind: 'etcd-majority', node: 'node-b' }, /a pod cannot move during etcd-majority/],
      [{ kind: 'kill-call', node: 'node-a' }, { kind: 'isolate-node', node: 'node-a' }, /kill-call's pod leaves node-a/],
    ] as const;
    for (const [a, b, reason] of refused) {
      assert.match(overlapExclusion(a, b) ?? 'allowed', reason, `${a.kind} + ${b.kind}`);
      assert.match(overlapExclusion(b, a) ?? 'allowed', reason, `${b.kind} + ${a.kind}`);
    }
  });

  it('never lets a fault overlap itself on the same node', () => {
    for (const kind of FAULT_KINDS) assert.notEqual(overlapExclusion({ kind, node: 'node-a' }, { kind, node: 'node-a' }), undefined, kind);
  });
});
