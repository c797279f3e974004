// The nemesis suite (issue 35): a seeded schedule of faults against latch on the rig (test/nemesis/rig.ts), a
// controller that plays kube-controller-manager and kubelet, writers on every pod, one history file, and the checker's
// verdict on each property after each round.
//
//   npm run nemesis                              # a random schedule for 10 minutes; the seed is printed
//   npm run nemesis -- --seconds 120 --seed 7    # repeat a run
//   npm run nemesis -- --fixed                   # each fault kind once, then three overlapping pairs (npm test)
//   npm run nemesis -- --pairs                   # the fixed schedule's overlapping pairs only
//
// The closing line is "N passed, M failed": the checker's properties across the rounds. Exit 1 if any failed.
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, mkdirSync, openSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { run } from '../../src/sys/run.js';
import { check, lostAfterFence, PROPERTIES, type Verdict } from './checker.js';
import { parseHistory } from './history.js';
import { FAULT_KINDS, overlapExclusion, startFault, type ActiveFault, type FaultKind } from './nemesis.js';
import { addressOf, LATCH, netnsOf, NODES, Rig, rigSkipReason, type Node } from './rig.js';
import { History, latchCall, lookAtKernel, readHistoryFile, readRecords, Writer, type Caller } from './workload.js';
import { seeded } from '../fixtures/seeded.js';

/** What kubelet gives a driver call here: two stalled steps of commandTimeout (10 s) and the cleanup. */
const DRIVER_DEADLINE_MS = 35_000;
const ADMIN_DEADLINE_MS = 60_000;
/** How long a node may not answer before the controller force-detaches its volumes and fences it. */
const NODE_DEADLINE_MS = 6_000;
/** How long a fault lasts when the controller has nothing to do about it (unless told otherwise). */
const FAULT_MS = 10_000;
const KUBELET_PORT = 10250;
/** Volumes only ever asked for on a node cut off from etcd's majority: one for each fault of a round. */
const SPARES = ['nm-spare', 'nm-spare2'] as const;
/** doctor's checks that report on the machine rather than on latch's state: the rig has no kubelet and no KCM. */
const ENVIRONMENT_CHECKS = ['plugin-dir', 'kcm'];

export interface NemesisOptions {
  seconds: number;
  seed: number;
  /** Each fault kind once, in order, then the overlapping pairs, instead of a random schedule. */
  fixed?: boolean;
  /** The fixed schedule's kinds (default: all, and the pairs); each alone. */
  only?: FaultKind[];
  /** The fixed schedule's overlapping pairs only. */
  pairs?: boolean;
  /** How long each fault lasts when the controller has nothing to do about it; default 10 s. */
  faultMs?: number;
  volumes?: number;
  historyFile?: string;
  log?: (line: string) => void;
}

export interface NemesisResult {
  seed: number;
  rounds: number;
  /** Rounds in which a second fault started while the first was active. */
  overlaps: number;
  passed: number;
  failed: number;
  failures: { round: number; fault: string; property: string; violations: string[] }[];
  counts: { calls: number; faults: number; records: number };
  /** Records a fenced node was told were durable (after its fence) that are not on the volume: a figure, not a failure. */
  lostAfterFence: string[];
  historyFile: string;
}

interface Pod {
  volume: string;
  node: Node;
  writer: Writer;
  path: string;
  /** When its writer last acknowledged a record. */
  lastAck: number;
}

class Cluster {
  readonly pods = new Map<string, Pod>();
  private readonly agents = new Map<Node, ChildProcess>();
  private readonly kubelets = new Map<Node, ChildProcess>();
  private writers = 0;
  /** Spare volumes and the nodes they were asked for: the controller withdraws each (detach) once the faults heal. */
  readonly pendingDetach: { volume: string; node: Node }[] = [];
  /** Old nodes of volumes that moved: cleaned up once their fault heals. */
  readonly orphans: { volume: string; node: Node; writer: Writer; path: string }[] = [];
  /** Nodes the controller is fencing now: a fault on one heals only after its fence (as the controller's tick ends). */
  readonly fencing = new Set<Node>();
  /**
   * Pods whose start failed (their new node was cut off by another fault): started again once every fault healed,
   * as kubelet and the controller retry without end.
   */
  readonly pendingStarts: { volume: string; node: Node }[] = [];

  constructor(
    readonly rig: Rig,
    readonly history: History,
    readonly log: (line: string) => void,
  ) {}

  caller(node: Node): Caller {
    return { name: node, netns: netnsOf(node), config: this.rig.nodes[node].config };
  }
  get admin(): Caller {
    return { name: 'admin', netns: netnsOf('switch'), config: this.rig.adminConfig };
  }

  // -------------------------------------------------------------------------------------------------------------
  // The nodes' daemons: latch agent, and a stand-in for kubelet's heartbeat (an HTTP answer on the node's address).

  private spawnIn(node: Node, args: string[], logName: string): ChildProcess {
    const out = openSync(join(this.rig.dir, `${node}.${logName}.log`), 'a');
    const child = spawn('setpriv', ['--pdeathsig', 'SIGKILL', '--', 'nsenter', `--net=/run/netns/${netnsOf(node)}`, '--', ...args], {
      env: { ...process.env, LATCH_CONFIG: this.rig.nodes[node].config },
      stdio: ['ignore', out, out],
    });
    closeSync(out);
    return child;
  }

  async startAgent(node: Node): Promise<void> {
    this.agents.set(node, this.spawnIn(node, [LATCH, 'agent'], 'agent'));
    await sleep(200);
  }

  async killAgent(node: Node): Promise<void> {
    const agent = this.agents.get(node);
    if (!agent || agent.exitCode !== null) return;
    const gone = new Promise((resolve) => agent.once('exit', resolve));
    agent.kill('SIGKILL');
    await gone;
  }

  startKubelet(node: Node): void {
    const source = `require('http').createServer((q, r) => r.end('ok')).listen(${KUBELET_PORT}, '${addressOf(node)}')`;
    this.kubelets.set(node, this.spawnIn(node, [process.execPath, '-e', source], 'kubelet'));
  }

  /** Whether the node answers the controller (from the switch side, as the API server would hear its kubelet). */
  async answers(node: Node): Promise<boolean> {
    const url = `http://${addressOf(node)}:${KUBELET_PORT}/`;
    return run('nsenter', [`--net=/run/netns/${netnsOf('switch')}`, '--', 'curl', '-s', '--max-time', '1', url], { timeoutMs: 3_000 }).then(
      () => true,
      () => false,
    );
  }

  async stopDaemons(): Promise<void> {
    for (const child of [...this.agents.values(), ...this.kubelets.values()]) child.kill('SIGKILL');
  }

  // -------------------------------------------------------------------------------------------------------------
  // Pods.

  volumeOptions(volume: string): string {
    return JSON.stringify({
      'kubernetes.io/fsType': '',
      'kubernetes.io/pvOrVolumeName': volume,
      'kubernetes.io/readwrite': 'rw',
      size: '128Mi',
    });
  }

  globalPath(node: Node, volume: string): string {
    const path = join(this.rig.nodes[node].kubeletDir, 'plugins/kubernetes.io/flexvolume/latch/rbd/mounts', volume);
    mkdirSync(path, { recursive: true, mode: 0o750 });
    return path;
  }

  /** Repeats a call as its caller would (kubelet, the controller) until it succeeds or `attempts` run out. */
  async retry(caller: Caller, args: string[], volume: string, attempts: number, options: { killAfterMs?: number } = {}) {
    for (let attempt = 1; ; attempt++) {
      const result = await latchCall(this.history, caller, args, {
        volume,
        deadlineMs: caller.name === 'admin' && args[0] !== 'attach' && args[0] !== 'detach' ? ADMIN_DEADLINE_MS : DRIVER_DEADLINE_MS,
        driverCall: !['node', 'volume', 'doctor'].includes(args[0] ?? ''),
        ...(attempt === 1 ? options : {}),
      });
      if (result.reply?.status === 'Success' || (result.event.exitCode === 0 && result.reply === undefined && args[0] === 'node'))
        return result;
      if (attempt >= attempts) return result;
      await sleep(1_000);
    }
  }

  /** The controller starts a pod of `volume` on `node`: attach, waitforattach, mountdevice, then its writer. */
  /** `kill`: SIGKILL this call's first attempt after `afterMs` (kubelet then retries it). */
  async startPod(
    volume: string,
    node: Node,
    options: { kill?: { op: 'waitforattach' | 'mountdevice'; afterMs: number } } = {},
  ): Promise<boolean> {
    this.history.append({ kind: 'intent', volume, node, at: this.history.now() });
    const attach = await this.retry(this.admin, ['attach', this.volumeOptions(volume), node], volume, 20);
    if (attach.reply?.status !== 'Success') {
      this.log(`  could not attach ${volume} to ${node}: ${attach.reply?.message ?? attach.event.stdout}`);
      return false;
    }
    const killIn = (op: string) => (options.kill?.op === op ? { killAfterMs: options.kill.afterMs } : {});
    const wait = await this.retry(
      this.caller(node),
      ['waitforattach', '', this.volumeOptions(volume)],
      volume,
      10,
      killIn('waitforattach'),
    );
    const device = wait.reply?.device;
    if (wait.reply?.status !== 'Success' || !device) {
      this.log(`  waitforattach of ${volume} on ${node} failed: ${wait.reply?.message ?? wait.event.stdout}`);
      return false;
    }
    const path = this.globalPath(node, volume);
    const mounted = await this.retry(
      this.caller(node),
      ['mountdevice', path, device, this.volumeOptions(volume)],
      volume,
      10,
      killIn('mountdevice'),
    );
    if (mounted.reply?.status !== 'Success') {
      this.log(`  mountdevice of ${volume} on ${node} failed: ${mounted.reply?.message ?? mounted.event.stdout}`);
      return false;
    }
    const writer = new Writer(this.history, volume, node, `${volume}.${node}.${++this.writers}`, path);
    const pod: Pod = { volume, node, writer, path, lastAck: this.history.now() };
    this.pods.set(volume, pod);
    return true;
  }

  /** The pod stops: its writer is killed, kubelet unmounts, the controller detaches. */
  async stopPod(volume: string, intentAfter: Node | null = null): Promise<void> {
    const pod = this.pods.get(volume);
    if (!pod) return;
    this.pods.delete(volume);
    pod.writer.kill();
    await Promise.race([pod.writer.exited, sleep(5_000)]);
    await this.retry(this.caller(pod.node), ['unmountdevice', pod.path], volume, 5);
    await this.retry(this.admin, ['detach', volume, pod.node], volume, 5);
    if (intentAfter === null) this.history.append({ kind: 'intent', volume, node: null, at: this.history.now() });
  }

  /**
   * The node of `pod` stopped answering for NODE_DEADLINE_MS: force-detach, fence it off the volume (the admin step,
   * from the switch side), then start the pod on `to`. The old node's mount stays until its fault heals.
   */
  async failover(pod: Pod, to: Node): Promise<void> {
    const { volume, node } = pod;
    this.log(`  ${node} does not answer: force-detach ${volume}, fence ${node}, start the pod on ${to}`);
    this.pods.delete(volume);
    this.fencing.add(node);
    try {
      await this.retry(this.admin, ['detach', volume, node], volume, 3);
      const fence = await this.retry(this.admin, ['node', 'fence', node, '--volume', volume], volume, 5);
      if (fence.event.exitCode !== 0) {
        this.log(`  the fence of ${node} failed: ${fence.event.stdout.trim()}`);
        this.pods.set(volume, pod); // it stays where it is; the controller tries again next tick
        return;
      }
      this.history.append({ kind: 'fence', node, volume, at: fence.event.end });
      this.orphans.push({ volume, node, writer: pod.writer, path: pod.path });
    } finally {
      this.fencing.delete(node);
    }
    if (!(await this.startPod(volume, to))) this.pendingStarts.push({ volume, node: to });
  }

  /** Once every fault healed: the pods whose start failed start where they were asked for. */
  async startPending(): Promise<void> {
    for (const { volume, node } of this.pendingStarts.splice(0)) {
      this.log(`  ${volume} starts again on ${node}`);
      if (!(await this.startPod(volume, node))) this.log(`  the pod of ${volume} did not start on ${node} after the heal`);
    }
  }

  /** Whether a fault on `node` waits before it heals: the controller is moving a volume off it. */
  busyWith(node: Node | undefined, silentSince: Map<Node, number>): boolean {
    if (node === undefined) return false;
    return this.fencing.has(node) || (silentSince.has(node) && [...this.pods.values()].some((p) => p.node === node));
  }

  /** After a heal: the old node of a moved volume lets go (kubelet unmounts the orphaned pod's device), then unfence. */
  async cleanOrphans(): Promise<void> {
    // The fenced writers go on writing for a while after the heal: none of that may land (property 3).
    if (this.orphans.length > 0) await sleep(3_000);
    for (const orphan of this.orphans.splice(0)) {
      orphan.writer.kill();
      await this.retry(this.caller(orphan.node), ['unmountdevice', orphan.path], orphan.volume, 5);
      await this.retry(this.admin, ['node', 'unfence', orphan.node], orphan.volume, 3);
    }
  }

  /** One tick of the controller: acks seen, nodes that stopped answering. */
  async tick(silentSince: Map<Node, number>): Promise<void> {
    for (const node of NODES) {
      if (await this.answers(node)) silentSince.delete(node);
      else if (!silentSince.has(node)) silentSince.set(node, this.history.now());
    }
    for (const pod of [...this.pods.values()]) {
      const since = silentSince.get(pod.node);
      if (since === undefined || this.history.now() - since < NODE_DEADLINE_MS) continue;
      const to = NODES.filter((n) => n !== pod.node && !silentSince.has(n)).sort(
        (a, b) => [...this.pods.values()].filter((p) => p.node === a).length - [...this.pods.values()].filter((p) => p.node === b).length,
      )[0];
      if (to) await this.failover(pod, to);
    }
  }

  /** What the ledger and each node's doctor say, once the faults healed. */
  async converged(volumes: string[]): Promise<void> {
    const at = this.history.now();
    const list = await latchCall(this.history, this.admin, ['volume', 'list', '-o', 'json'], {
      deadlineMs: ADMIN_DEADLINE_MS,
      driverCall: false,
    });
    const holders: Record<string, string[]> = {};
    const staleTickets: Record<string, string[]> = {};
    const staleBlocklist: string[] = [];
    try {
      const docs = JSON.parse(list.event.stdout) as {
        name: string;
        spec: { tickets: Record<string, { nodeID?: string; type?: string }> };
        status: { nodes: Record<string, unknown>; fences?: Record<string, { state?: string }> };
      }[];
      for (const doc of docs) {
        if (!volumes.includes(doc.name)) continue;
        holders[doc.name] = Object.keys(doc.status.nodes);
        const wanted = this.pods.get(doc.name)?.node;
        staleTickets[doc.name] = Object.values(doc.spec.tickets)
          .filter((t) => t.nodeID !== wanted)
          .map((t) => `${t.type ?? '?'} ticket of ${t.nodeID ?? '?'}`);
        for (const [node, fence] of Object.entries(doc.status.fences ?? {}))
          staleBlocklist.push(`${doc.name}: fence of ${node} (${fence.state ?? '?'})`);
      }
    } catch {
      staleBlocklist.push(`latch volume list printed no JSON: ${list.event.stdout.slice(0, 200)}`);
    }
    // Every fence in the rig is lifted once its node healed: no client may stay on the OSD blocklist.
    const blocklist = await this.rig.ceph.ceph(['osd', 'blocklist', 'ls', '--format', 'json']).catch(() => undefined);
    // Its JSON is the first line; "listed N entries" may follow.
    const entries = blocklist ? (JSON.parse(blocklist.stdout.split('\n')[0] || '[]') as { addr: string }[]) : [];
    for (const entry of entries) staleBlocklist.push(`OSD blocklist: ${entry.addr}`);
    const doctor: Record<string, string[]> = {};
    for (const node of NODES) {
      // Converged means it settles: a monitor restarted moments ago can fail a client's first authentication
      // ("monclient: get_auth_request but no auth handler is set up"), so a node whose doctor reports errors is asked
      // again, up to three times 2 s apart; what it says the last time is recorded, and an error that stays fails.
      for (let attempt = 1; attempt <= 3; attempt++) {
        if (attempt > 1) await sleep(2_000);
        const result = await latchCall(this.history, this.caller(node), ['doctor', '-o', 'json'], {
          deadlineMs: ADMIN_DEADLINE_MS,
          driverCall: false,
        });
        try {
          const report = JSON.parse(result.event.stdout) as { findings: { severity: string; check: string; message: string }[] };
          // The rig has no kubelet, so no plugin dir: doctor's plugin-dir check is about the machine, not latch's state.
          doctor[node] = report.findings
            .filter((f) => f.severity === 'error' && !ENVIRONMENT_CHECKS.includes(f.check))
            .map((f) => `${f.check}: ${f.message}`);
        } catch {
          doctor[node] = [`doctor printed no JSON: ${result.event.stdout.slice(0, 200)}`];
        }
        if (doctor[node]?.length === 0) break;
      }
    }
    this.history.append({ kind: 'converged', at, holders, staleTickets, staleBlocklist, doctor });
    await lookAtKernel(this.history, this.rig.nodes);
  }
}

/** How often a round of the random schedule starts a second fault while the first is active. */
const OVERLAP_CHANCE = 0.5;

/**
 * A second fault for a round of the random schedule, on any node, started while the first lasts; or none. Up to three
 * draws: a pair that may not overlap (overlapExclusion) is noted and drawn again.
 */
function randomSecond(
  first: PlannedFault,
  holders: Node[],
  faultMs: number,
  rand: () => number,
  pick: <T>(items: readonly T[]) => T,
  notes: string[],
): PlannedFault | undefined {
  if (rand() >= OVERLAP_CHANCE) return undefined;
  let kind: FaultKind | undefined;
  let node: Node = first.node;
  for (let draw = 0; draw < 3 && kind === undefined; draw++) {
    const k = pick(FAULT_KINDS);
    // kill-call moves a pod off its node: one that holds a pod.
    node = k === 'kill-call' && holders.length > 0 ? pick(holders) : pick(NODES);
    const why = overlapExclusion(first, { kind: k, node });
    if (why) notes.push(`(not ${k} (${node}) beside it: ${why})`);
    else kind = k;
  }
  if (kind === undefined) return undefined;
  const startMs = Math.round(faultMs * (0.1 + 0.6 * rand()));
  // It heals before the first (within the first's time) or after it, as chosen.
  const durationMs =
    rand() < 0.5 ? Math.round((faultMs - startMs) * (0.3 + 0.5 * rand())) : Math.round(faultMs - startMs + faultMs * (0.2 + 0.6 * rand()));
  return { kind, node, startMs, durationMs };
}

/** The second fault of a fixed round: on the first's node, or on a node without a pod (where a moved pod goes). */
interface FixedSecond {
  kind: FaultKind;
  on: 'same' | 'idle';
  /** When it starts and how long it lasts, in units of the first fault's time. */
  at: number;
  lasts: number;
}

interface FixedRound {
  kind: FaultKind;
  with?: FixedSecond;
}

/**
 * The fixed schedule's overlapping pairs, the ones that tell most (docs/reliability.md, "Overlapping faults"):
 * - a node isolated, and the monitor killed before the controller's deadline: the fence cannot reach the monitor,
 *   so it cannot show it cut the node off, and the volume must stay until the monitor is back (healed first);
 * - a node isolated, and the node its pod moves to cut off from etcd: the moved pod's waitforattach there must
 *   fail until that cut heals (after the isolation), and then succeed;
 * - a node on etcd's minority side, and its agent killed and restarted there (healed first): the restarted agent
 *   cannot reach quorum, and nothing may be granted to that node.
 */
const FIXED_PAIRS: FixedRound[] = [
  { kind: 'isolate-node', with: { kind: 'kill-mon', on: 'same', at: 0.33, lasts: 1.5 } },
  { kind: 'isolate-node', with: { kind: 'node-etcd-cut', on: 'idle', at: 0.17, lasts: 1.5 } },
  { kind: 'etcd-minority', with: { kind: 'kill-agent', on: 'same', at: 0.17, lasts: 0.5 } },
];

function fixedSecond(first: PlannedFault, second: FixedSecond | undefined, holders: Node[], faultMs: number): PlannedFault | undefined {
  if (!second) return undefined;
  const node = second.on === 'same' ? first.node : (NODES.find((n) => !holders.includes(n)) ?? first.node);
  const planned = { kind: second.kind, node, startMs: Math.round(faultMs * second.at), durationMs: Math.round(faultMs * second.lasts) };
  const why = overlapExclusion(first, planned);
  if (why) throw new Error(`the fixed pair ${first.kind} + ${second.kind} is excluded: ${why}`);
  return planned;
}

/** Runs the suite. Always tears the rig down, also on failure. */
export async function runNemesis(options: NemesisOptions): Promise<NemesisResult> {
  const log = options.log ?? ((line: string) => process.stdout.write(`${line}\n`));
  const reason = rigSkipReason();
  if (reason) throw new Error(reason);
  const historyFile = options.historyFile ?? join(tmpdir(), `latch-nemesis-${options.seed}-${Date.now()}.jsonl`);
  const history = new History(historyFile);
  const rand = seeded(options.seed);
  const pick = <T>(items: readonly T[]): T => items[Math.floor(rand() * items.length)] as T;
  log(`nemesis: seed ${options.seed}, ${options.fixed ? 'the fixed schedule' : `${options.seconds} s`}, history in ${historyFile}`);
  const rig = await Rig.start((line) => log(`rig: ${line}`));
  const cluster = new Cluster(rig, history, log);
  const result: NemesisResult = {
    seed: options.seed,
    rounds: 0,
    overlaps: 0,
    passed: 0,
    failed: 0,
    failures: [],
    counts: history.counts,
    lostAfterFence: [],
    historyFile,
  };
  try {
    for (const node of NODES) {
      cluster.startKubelet(node);
      await cluster.startAgent(node);
    }
    const pods = Array.from({ length: options.volumes ?? 2 }, (_, i) => `nm-v${i + 1}`);
    for (const [i, volume] of pods.entries()) {
      if (!(await cluster.startPod(volume, NODES[i % NODES.length] ?? 'node-a'))) throw new Error(`the pod of ${volume} did not start`);
    }
    // The spare volumes are only ever asked for on a node cut off from etcd's majority: they must stay nowhere.
    for (const spare of SPARES) history.append({ kind: 'intent', volume: spare, node: null, at: history.now() });
    const volumes = [...pods, ...SPARES];
    await sleep(3_000); // records to lose before the first fault
    log(`pods: ${[...cluster.pods.values()].map((p) => `${p.volume} on ${p.node}`).join(', ')}`);
    // The fixed schedule: each kind alone, then the overlapping pairs (unless only some kinds were asked for).
    const singles = options.pairs ? [] : (options.only ?? FAULT_KINDS).map((kind) => ({ kind }));
    const schedule: FixedRound[] = options.fixed ? [...singles, ...(options.only ? [] : FIXED_PAIRS)] : [];
    const faultMs = options.faultMs ?? FAULT_MS;
    const deadline = Date.now() + options.seconds * 1000;
    let faultIds = 0;
    let previous: Verdict[] = PROPERTIES.map((property) => ({ property, passed: true, violations: [] }));
    for (let round = 1; options.fixed ? round <= schedule.length : Date.now() < deadline; round++) {
      const kind = options.fixed ? (schedule[round - 1]?.kind ?? 'isolate-node') : pick(FAULT_KINDS);
      const holders = [...cluster.pods.values()].map((p) => p.node);
      const node = holders.length > 0 ? pick(holders) : pick(NODES);
      const first: PlannedFault = { kind, node, startMs: 0, durationMs: faultMs };
      const notes: string[] = [];
      const second = options.fixed
        ? fixedSecond(first, schedule[round - 1]?.with, holders, faultMs)
        : randomSecond(first, holders, faultMs, rand, pick, notes);
      const faults = second ? [first, second] : [first];
      if (second) result.overlaps++;
      await runRound(cluster, { round, faults, notes }, volumes, rand, log, () => ++faultIds);
      // The verdict of this round: a property fails here if the history so far shows a violation it did not before.
      const verdicts = check(parseHistory(readHistoryFile(historyFile)));
      for (const [i, v] of verdicts.entries()) {
        const fresh = v.violations.filter((x) => !previous[i]!.violations.includes(x));
        if (fresh.length === 0) result.passed++;
        else {
          result.failed++;
          const label = faults.map((f) => f.kind).join(' + ');
          result.failures.push({ round, fault: label, property: v.property, violations: fresh });
          log(`  round ${round} (${label}): ${v.property} FAILED:\n    ${fresh.slice(0, 5).join('\n    ')}`);
        }
      }
      previous = verdicts;
      result.rounds = round;
    }
  } finally {
    for (const pod of cluster.pods.values()) pod.writer.kill();
    for (const orphan of cluster.orphans) orphan.writer.kill();
    await cluster.stopDaemons();
    await rig.stop();
  }
  result.lostAfterFence = lostAfterFence(parseHistory(readHistoryFile(historyFile)));
  for (const lost of result.lostAfterFence) log(`acknowledged on a fenced node after its fence, not on the volume: ${lost}`);
  log(
    `nemesis: seed ${result.seed}, ${result.rounds} rounds (${result.overlaps} with two faults), ${history.counts.faults} faults, ${history.counts.calls} calls, ` +
      `${history.counts.records} records acknowledged, ${result.failures.reduce((n, f) => n + f.violations.length, 0)} violations, ` +
      `${result.lostAfterFence.length} records acknowledged on a fenced node after its fence and lost`,
  );
  log(`${result.passed} passed, ${result.failed} failed`);
  return result;
}

/** One fault of a round: when it starts (ms after the round began) and how long it lasts before it heals. */
interface PlannedFault {
  kind: FaultKind;
  node: Node;
  startMs: number;
  durationMs: number;
}

const describeFault = (f: PlannedFault) => `${f.kind} (${f.node})`;

async function runRound(
  cluster: Cluster,
  { round, faults, notes }: { round: number; faults: PlannedFault[]; notes: string[] },
  volumes: string[],
  rand: () => number,
  log: (line: string) => void,
  nextId: () => number,
): Promise<void> {
  const { history, rig } = cluster;
  log(
    `round ${round}: ${faults
      .map((f, i) =>
        i === 0 ? describeFault(f) : `${describeFault(f)} from ${f.startMs / 1000} s to ${(f.startMs + f.durationMs) / 1000} s`,
      )
      .join(' + ')}`,
  );
  for (const note of notes) log(`  ${note}`);
  const begin = history.now();
  const silentSince = new Map<Node, number>();
  const hooks = { killAgent: (n: Node) => cluster.killAgent(n), startAgent: (n: Node) => cluster.startAgent(n) };
  let ended = 0;

  /** One fault from its start to its heal; the faults of a round run side by side, beside the controller. */
  const lifecycle = async (planned: PlannedFault): Promise<void> => {
    const { kind, node } = planned;
    // Drawn now, in the order of the round's faults, so that a seed repeats the round whatever the timing.
    const killOp = rand() < 0.5 ? 'waitforattach' : 'mountdevice';
    const killAfterMs = 30 + Math.floor(rand() * (killOp === 'waitforattach' ? 250 : 120));
    const id = nextId();
    let fault: ActiveFault | undefined;
    try {
      await sleep(Math.max(0, begin + planned.startMs - history.now()));
      fault = await startFault(rig, kind, node, hooks);
      history.append({
        kind: 'fault',
        id,
        fault: kind,
        phase: 'start',
        at: history.now(),
        etcdCutNodes: fault.etcdCutNodes,
        detail: fault.detail,
      });
      if (planned.startMs > 0) log(`  ${kind} (${node}) starts`);
      if (kind === 'kill-call') {
        // A pod moves, and the node's waitforattach or mountdevice is SIGKILLed mid-operation; kubelet's retry must
        // succeed. Its new node is away from the round's other faults.
        const pod = [...cluster.pods.values()].find((p) => p.node === node);
        const others = faults.filter((f) => f !== planned).map((f) => f.node);
        const to = NODES.find((n) => n !== node && !others.includes(n));
        if (pod && to) {
          await cluster.stopPod(pod.volume, to);
          // Each takes 150-600 ms here when nothing is wrong: killed somewhere inside it.
          log(`  ${killOp} of ${pod.volume} on ${to} to be SIGKILLed ${killAfterMs} ms in`);
          const started = await cluster.startPod(pod.volume, to, { kill: { op: killOp, afterMs: killAfterMs } });
          if (!started) cluster.pendingStarts.push({ volume: pod.volume, node: to });
        }
      }
      if (fault.etcdCutNodes.includes(node) && kind !== 'isolate-node' && kind !== 'one-way') {
        // Property 4: a node cut off from etcd's majority is asked to take a volume; its waitforattach must not succeed.
        // A spare of its own: the other fault's probe may hold the first (attached, until the detach after the round).
        const spare = SPARES[faults.indexOf(planned)] ?? SPARES[0];
        const attach = await latchCall(history, cluster.admin, ['attach', cluster.volumeOptions(spare), node], {
          volume: spare,
          deadlineMs: DRIVER_DEADLINE_MS,
        });
        if (attach.reply?.status === 'Success') {
          const wait = await latchCall(history, cluster.caller(node), ['waitforattach', '', cluster.volumeOptions(spare)], {
            volume: spare,
            deadlineMs: DRIVER_DEADLINE_MS,
          });
          log(`  waitforattach of ${spare} on ${node}, cut off from etcd's majority: ${wait.reply?.status ?? 'no reply'}`);
        }
        cluster.pendingDetach.push({ volume: spare, node });
      }
      // It heals once its time is up and the controller is not moving a volume off its node (the fence comes first).
      const healAt = begin + planned.startMs + planned.durationMs;
      while (history.now() < healAt || cluster.busyWith(fault.node, silentSince)) {
        if (history.now() > healAt + 90_000) {
          log(`  the controller did not finish within 90 s of the end of ${kind}`);
          break;
        }
        await sleep(250);
      }
    } catch (err) {
      log(`  ${kind} (${node}) failed: ${String(err)}`);
    } finally {
      if (fault) {
        const healing = history.now();
        await fault.heal().catch((err: unknown) => log(`  heal of ${kind} failed: ${String(err)}`));
        history.append({ kind: 'fault', id, fault: kind, phase: 'end', at: healing });
        if (faults.length > 1) log(`  ${kind} (${node}) healed`);
      }
      ended++;
    }
  };

  const lives = faults.map(lifecycle);
  // The controller, meanwhile: every second it asks each node's heartbeat, and moves the pods of silent nodes.
  while (ended < faults.length) {
    await cluster.tick(silentSince);
    await lookAtKernel(history, rig.nodes);
    if (ended < faults.length) await sleep(1_000);
  }
  await Promise.all(lives);
  await cluster.cleanOrphans();
  await cluster.startPending();
  // The controller withdraws its requests for the spare volumes (retried after the heal, as KCM retries a detach).
  for (const { volume, node } of cluster.pendingDetach.splice(0)) await cluster.retry(cluster.admin, ['detach', volume, node], volume, 10);
  // Settle: every pod's writer acknowledges again (a writer stalled by a storage fault resumes by itself).
  const settleFrom = history.now();
  for (const pod of cluster.pods.values()) {
    const acked = () =>
      parseHistory(readHistoryFile(history.file)).some((e) => e.kind === 'ack' && e.writer === pod.writer.writer && e.at > settleFrom);
    for (let i = 0; i < 60 && !acked(); i++) await sleep(1_000);
    if (!acked()) log(`  ${pod.volume} on ${pod.node}: its writer has not acknowledged a record within 60 s of the heal`);
  }
  for (const pod of cluster.pods.values()) {
    const at = history.now();
    const records = await readRecords(pod.path).catch(() => undefined);
    if (records) history.append({ kind: 'final', volume: pod.volume, at, records });
  }
  await cluster.converged(volumes);
}

// ---------------------------------------------------------------------------------------------------------------

function arg(name: string): string | undefined {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : undefined;
}

if (require.main === module) {
  const seed = Number(arg('seed') ?? Math.floor(Math.random() * 2 ** 31));
  const seconds = Number(arg('seconds') ?? 600);
  const only = arg('only')?.split(',') as FaultKind[] | undefined;
  const pairs = process.argv.includes('--pairs');
  runNemesis({
    seed,
    seconds,
    fixed: process.argv.includes('--fixed') || only !== undefined || pairs,
    pairs,
    ...(only ? { only } : {}),
  }).then(
    (r) => process.exit(r.failed === 0 ? 0 : 1),
    (err: unknown) => {
      process.stderr.write(`nemesis: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
      process.exit(2);
    },
  );
}
