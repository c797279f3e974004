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

/** What a fault changes in the rig: links, blackhole routes (`from>to`), nftables tables, daemons, the controller. */
function footprint(kind: FaultKind, node: Node): string[] {
  const routes = (from: string, to: readonly string[]) => to.map((t) => `route ${from}>${t}`);
  const others = ETCD_MEMBERS.slice(1);
  switch (kind) {
    case 'isolate-node':
      return [`link ${node}`];
    case 'node-storage-cut':
      return [...routes(node, ['storage']), ...routes('storage', [node])];
    case 'node-etcd-cut':
      return routes(node, ETCD_MEMBERS);
    case 'one-way':
      return routes(node, ['switch', 'storage', ...ETCD_MEMBERS, ...NODES.filter((n) => n !== node)]);
    case 'etcd-minority':
      return [...routes('etcd-0', others), ...others.flatMap((m) => routes(m, ['etcd-0', node])), ...routes(node, others)];
    case 'etcd-majority':
      return others.map((m) => `link ${m}`);
    case 'kill-osd':
      return ['daemon osd'];
    case 'kill-mon':
      return ['daemon mon'];
    case 'kill-agent':
      return [`agent ${node}`];
    case 'kill-call':
      return ['the controller moves a pod'];
    case 'packet-loss':
      return [`nftables ${node}`];
  }
}

/** Faults that stop every node's new work: no quorum anywhere, or no Ceph for a new client. */
const WHOLE_CLUSTER: readonly FaultKind[] = ['etcd-majority', 'kill-osd', 'kill-mon'];

/**
 * Why two faults may not be active at once (the second starts while the first lasts), or undefined if they may.
 * Any other pair may overlap, on the same node or on two, and heal in either order.
 */
export function overlapExclusion(a: { kind: FaultKind; node: Node }, b: { kind: FaultKind; node: Node }): string | undefined {
  const shared = footprint(a.kind, a.node).filter((x) => footprint(b.kind, b.node).includes(x));
  // Two faults that change the same thing: the second cannot be set up (a route that exists, a daemon already dead),
  // and healing either would heal both.
  if (shared.length > 0) return `both change ${shared[0]}`;
  const kinds = [a.kind, b.kind];
  // The OSD's restart waits until it serves again, which needs the monitor: healed first, it would never finish.
  if (kinds.includes('kill-osd') && kinds.includes('kill-mon')) return "the OSD's restart needs the monitor";
  if (kinds.includes('kill-call')) {
    const [call, other] = a.kind === 'kill-call' ? [a, b] : [b, a];
    // kill-call checks that kubelet's retry of a killed call succeeds: with no quorum or no Ceph for a new client no
    // retry can, and the pod stop before it (unmountdevice, detach) is the controller's, with bounded retries.
    if (WHOLE_CLUSTER.includes(other.kind)) return `a pod cannot move during ${other.kind}: kill-call's retry could not succeed`;
    // The pod stops gracefully on its node and starts on a third: a fault on the node it leaves would leave its mount
    // while the controller detaches without a fence (the controller's mistake, not latch's); the pod's new node is
    // chosen away from the other fault (test/nemesis/run.ts).
    if (other.node === call.node && other.kind !== 'kill-agent') return `kill-call's pod leaves ${call.node}, which ${other.kind} cuts off`;
  }
  return undefined;
}
