// The nemesis suite (issue 35): a seeded schedule of faults against latch on the rig (test/nemesis/rig.ts), a
// controller that plays kube-controller-manager and kubelet, writers on every pod, one history file, and the checker's
// verdict on each property after each round.
//
//   npm run nemesis                              # a random schedule for 10 minutes; the seed is printed
//   npm run nemesis -- --seconds 120 --seed 7    # repeat a run
//   npm run nemesis -- --fixed                   # each fault kind once (what npm test runs)
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
import { FAULT_KINDS, startFault, type ActiveFault, type FaultKind } from './nemesis.js';
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
const SPARE = 'nm-spare';
/** doctor's checks that report on the machine rather than on latch's state: the rig has no kubelet and no KCM. */
const ENVIRONMENT_CHECKS = ['plugin-dir', 'kcm'];

export interface NemesisOptions {
  seconds: number;
  seed: number;
  /** Each fault kind once, in order, instead of a random schedule. */
  fixed?: boolean;
  /** The fixed schedule's kinds (default: all). */
  only?: FaultKind[];
  /** How long each fault lasts when the controller has nothing to do about it; default 10 s. */
  faultMs?: number;
  volumes?: number;
  historyFile?: string;
  log?: (line: string) => void;
}

export interface NemesisResult {
  seed: number;
  rounds: number;
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
  /** Nodes the spare volume was asked for: the controller withdraws each (detach) once the fault heals. */
  readonly pendingDetach: Node[] = [];
  /** Old nodes of volumes that moved: cleaned up once their fault heals. */
  readonly orphans: { volume: string; node: Node; writer: Writer; path: string }[] = [];

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
    await this.retry(this.admin, ['detach', volume, node], volume, 3);
    const fence = await this.retry(this.admin, ['node', 'fence', node, '--volume', volume], volume, 5);
    if (fence.event.exitCode !== 0) {
      this.log(`  the fence of ${node} failed: ${fence.event.stdout.trim()}`);
      this.pods.set(volume, pod); // it stays where it is; the controller tries again next tick
      return;
    }
    this.history.append({ kind: 'fence', node, volume, at: fence.event.end });
    this.orphans.push({ volume, node, writer: pod.writer, path: pod.path });
    await this.startPod(volume, to);
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
    }
    this.history.append({ kind: 'converged', at, holders, staleTickets, staleBlocklist, doctor });
    await lookAtKernel(this.history, this.rig.nodes);
  }
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
    // The spare volume is only ever asked for on a node cut off from etcd's majority: it must stay nowhere.
    history.append({ kind: 'intent', volume: SPARE, node: null, at: history.now() });
    const volumes = [...pods, SPARE];
    await sleep(3_000); // records to lose before the first fault
    log(`pods: ${[...cluster.pods.values()].map((p) => `${p.volume} on ${p.node}`).join(', ')}`);
    const schedule: FaultKind[] = options.fixed ? (options.only ?? [...FAULT_KINDS]) : [];
    const deadline = Date.now() + options.seconds * 1000;
    let previous: Verdict[] = PROPERTIES.map((property) => ({ property, passed: true, violations: [] }));
    for (let round = 1; options.fixed ? round <= schedule.length : Date.now() < deadline; round++) {
      const kind = options.fixed ? (schedule[round - 1] ?? 'isolate-node') : pick(FAULT_KINDS);
      const holders = [...cluster.pods.values()].map((p) => p.node);
      const node = holders.length > 0 ? pick(holders) : pick(NODES);
      await runRound(cluster, { kind, node, round, faultMs: options.faultMs ?? FAULT_MS }, volumes, rand, log);
      // The verdict of this round: a property fails here if the history so far shows a violation it did not before.
      const verdicts = check(parseHistory(readHistoryFile(historyFile)));
      for (const [i, v] of verdicts.entries()) {
        const fresh = v.violations.filter((x) => !previous[i]!.violations.includes(x));
        if (fresh.length === 0) result.passed++;
        else {
          result.failed++;
          result.failures.push({ round, fault: kind, property: v.property, violations: fresh });
          log(`  round ${round} (${kind}): ${v.property} FAILED:\n    ${fresh.slice(0, 5).join('\n    ')}`);
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
    `nemesis: seed ${result.seed}, ${result.rounds} rounds, ${history.counts.faults} faults, ${history.counts.calls} calls, ` +
      `${history.counts.records} records acknowledged, ${result.failures.reduce((n, f) => n + f.violations.length, 0)} violations, ` +
      `${result.lostAfterFence.length} records acknowledged on a fenced node after its fence and lost`,
  );
  log(`${result.passed} passed, ${result.failed} failed`);
  return result;
}

async function runRound(
  cluster: Cluster,
  { kind, node, round, faultMs }: { kind: FaultKind; node: Node; round: number; faultMs: number },
  volumes: string[],
  rand: () => number,
  log: (line: string) => void,
): Promise<void> {
  const { history, rig } = cluster;
  log(`round ${round}: ${kind} (${node})`);
  const id = round;
  let fault: ActiveFault | undefined;
  try {
    fault = await startFault(rig, kind, node, { killAgent: (n) => cluster.killAgent(n), startAgent: (n) => cluster.startAgent(n) });
    history.append({
      kind: 'fault',
      id,
      fault: kind,
      phase: 'start',
      at: history.now(),
      etcdCutNodes: fault.etcdCutNodes,
      detail: fault.detail,
    });
    const until = history.now() + faultMs;
    const silentSince = new Map<Node, number>();
    if (kind === 'kill-call') {
      // A pod moves, and the node's waitforattach or mountdevice is SIGKILLed mid-operation; kubelet's retry must succeed.
      const pod = [...cluster.pods.values()].find((p) => p.node === node);
      const to = NODES.find((n) => n !== node) ?? node;
      if (pod) {
        await cluster.stopPod(pod.volume, to);
        // Each takes 150-600 ms here when nothing is wrong: killed somewhere inside it.
        const op = rand() < 0.5 ? 'waitforattach' : 'mountdevice';
        const afterMs = 30 + Math.floor(rand() * (op === 'waitforattach' ? 250 : 120));
        log(`  ${op} of ${pod.volume} on ${to} to be SIGKILLed ${afterMs} ms in`);
        await cluster.startPod(pod.volume, to, { kill: { op, afterMs } });
      }
    }
    if (fault.etcdCutNodes.includes(node) && kind !== 'isolate-node' && kind !== 'one-way') {
      // Property 4: a node cut off from etcd's majority is asked to take a volume; its waitforattach must not succeed.
      const spare = SPARE;
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
      cluster.pendingDetach.push(node);
    }
    while (history.now() < until || [...cluster.pods.values()].some((p) => silentSince.has(p.node))) {
      await cluster.tick(silentSince);
      await lookAtKernel(history, rig.nodes);
      if (history.now() > until + 90_000) {
        log('  the controller did not finish within 90 s of the fault window');
        break;
      }
      await sleep(1_000);
    }
  } finally {
    await fault?.heal().catch((err: unknown) => log(`  heal of ${kind} failed: ${String(err)}`));
    history.append({ kind: 'fault', id, fault: kind, phase: 'end', at: history.now() });
  }
  await cluster.cleanOrphans();
  // The controller withdraws its request for the spare volume (retried after the heal, as KCM retries a detach).
  for (const spareNode of cluster.pendingDetach.splice(0)) await cluster.retry(cluster.admin, ['detach', SPARE, spareNode], SPARE, 10);
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
  runNemesis({ seed, seconds, fixed: process.argv.includes('--fixed') || only !== undefined, ...(only ? { only } : {}) }).then(
    (r) => process.exit(r.failed === 0 ? 0 : 1),
    (err: unknown) => {
      process.stderr.write(`nemesis: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
      process.exit(2);
    },
  );
}
