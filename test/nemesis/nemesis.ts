// The faults the nemesis suite injects, each with its heal. Network faults use iproute2 (links taken down, blackhole
// routes) and nftables (a share of a link's packets dropped, `numgen`); daemons are SIGKILLed and restarted.
import { run } from '../../src/sys/run.js';
import { ETCD_MEMBERS, NODES, netnsOf, type Node, type Rig } from './rig.js';

export const FAULT_KINDS = [
  'isolate-node',
  'node-storage-cut',
  'node-etcd-cut',
  'one-way',
  'etcd-minority',
  'etcd-majority',
  'kill-osd',
  'kill-mon',
  'kill-agent',
  'kill-call',
  'packet-loss',
] as const;
export type FaultKind = (typeof FAULT_KINDS)[number];

export interface ActiveFault {
  kind: FaultKind;
  /** The node it targets, where it has one. */
  node?: Node;
  /** Nodes that cannot reach a majority of etcd's members while it lasts. */
  etcdCutNodes: string[];
  detail: string;
  heal(): Promise<void>;
}

export interface FaultHooks {
  killAgent(node: Node): Promise<void>;
  startAgent(node: Node): Promise<void>;
}

/** Starts a fault; `kill-call` is the controller's own (it SIGKILLs a call mid-operation) and needs nothing here. */
export async function startFault(rig: Rig, kind: FaultKind, node: Node, hooks: FaultHooks): Promise<ActiveFault> {
  const others = ETCD_MEMBERS.slice(1);
  switch (kind) {
    case 'isolate-node':
      await rig.link(node, false);
      return { kind, node, etcdCutNodes: [node], detail: `${node}'s link down`, heal: () => rig.link(node, true) };
    case 'node-storage-cut':
      await rig.blackhole(node, ['storage'], true);
      await rig.blackhole('storage', [node], true);
      return {
        kind,
        node,
        etcdCutNodes: [],
        detail: `${node} and the storage cannot reach each other`,
        heal: async () => {
          await rig.blackhole(node, ['storage'], false);
          await rig.blackhole('storage', [node], false);
        },
      };
    case 'node-etcd-cut':
      await rig.blackhole(node, [...ETCD_MEMBERS], true);
      return {
        kind,
        node,
        etcdCutNodes: [node],
        detail: `${node} cannot reach etcd`,
        heal: () => rig.blackhole(node, [...ETCD_MEMBERS], false),
      };
    case 'one-way':
      // The node hears everyone, and nothing it sends arrives.
      await rig.blackhole(node, ['switch', 'storage', ...ETCD_MEMBERS, ...NODES.filter((n) => n !== node)], true);
      return {
        kind,
        node,
        etcdCutNodes: [node],
        detail: `what ${node} sends is dropped`,
        heal: () => rig.blackhole(node, ['switch', 'storage', ...ETCD_MEMBERS, ...NODES.filter((n) => n !== node)], false),
      };
    case 'etcd-minority': {
      // etcd-0 and `node` on one side, etcd-1 and etcd-2 (the majority) with everyone else on the other.
      const split = async (on: boolean) => {
        await rig.blackhole('etcd-0', others, on);
        for (const m of others) await rig.blackhole(m, ['etcd-0', node], on);
        await rig.blackhole(node, others, on);
      };
      await split(true);
      return { kind, node, etcdCutNodes: [node], detail: `${node} with etcd-0, the minority`, heal: () => split(false) };
    }
    case 'etcd-majority':
      for (const m of others) await rig.link(m, false);
      return {
        kind,
        etcdCutNodes: [...NODES],
        detail: 'etcd-1 and etcd-2 cut off: no quorum anywhere',
        heal: async () => {
          for (const m of others) await rig.link(m, true);
        },
      };
    case 'kill-osd':
    case 'kill-mon': {
      const daemon = kind === 'kill-osd' ? 'osd' : 'mon';
      await rig.ceph.kill(daemon);
      return { kind, etcdCutNodes: [], detail: `${daemon} SIGKILLed`, heal: () => rig.ceph.start(daemon, 120_000) };
    }
    case 'kill-agent':
      await hooks.killAgent(node);
      return { kind, node, etcdCutNodes: [], detail: `${node}'s latch agent SIGKILLed`, heal: () => hooks.startAgent(node) };
    case 'kill-call':
      return { kind, node, etcdCutNodes: [], detail: `a driver call on ${node} SIGKILLed mid-operation`, heal: async () => undefined };
    case 'packet-loss': {
      const table = `latch_nemesis_loss_${node.replace('-', '_')}`;
      const port = `p-${node}`;
      const rules = [
        `table bridge ${table} {`,
        '  chain forward {',
        '    type filter hook forward priority 0; policy accept;',
        `    iifname "${port}" numgen random mod 100 < 30 drop`,
        `    oifname "${port}" numgen random mod 100 < 30 drop`,
        '  }',
        '}',
      ].join('\n');
      await run('nsenter', [`--net=/run/netns/${netnsOf('switch')}`, '--', 'nft', '-f', '-'], { input: rules, timeoutMs: 10_000 });
      return {
        kind,
        node,
        etcdCutNodes: [],
        detail: `30% of ${node}'s packets dropped each way`,
        heal: async () => {
          await run('nsenter', [`--net=/run/netns/${netnsOf('switch')}`, '--', 'nft', 'delete', 'table', 'bridge', table], {
            timeoutMs: 10_000,
          });
        },
      };
    }
  }
}
