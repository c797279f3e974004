// The nemesis rig: a small cluster on one machine, each part in its own network namespace, linked by veth pairs to a
// bridge in a switch namespace. Addresses only on those links, from 198.18.0.0/15 (the benchmarking range); no route
// out. Needs root, iproute2, nsenter, Debian's ceph packages, etcd and bin/latch.
//
//   switch   198.18.0.1   the bridge, and the admin's side (the controller's `latch node fence` runs here)
//   storage  198.18.0.10  the Ceph cluster (test/ceph/cluster.ts: monitor, manager, OSD)
//   etcd-N   198.18.0.2N  three etcd members over TLS (test/etcd/etcd.ts)
//   node-X   198.18.0.3N  the nodes: their driver calls and `latch agent` run in them
//
// Everything switches the network namespace only (`nsenter --net`), never the mount namespace (`ip netns exec`
// makes a private one): the nodes' mounts are in the one mount table the runner and the Ceph fixture's sweep read.
// All nodes share one kernel, so each node's mounts live under a mount dir of its own.
//
// Cleanup: stop() removes the namespaces (and with them the links), after the Ceph and etcd fixtures removed their
// processes, mounts and loop devices. A runner that was SIGKILLed leaves an owner file whose process is gone; the
// next start sweeps what it left (the Ceph fixture sweeps its own dirs the same way).
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { run, type RunResult } from '../../src/sys/run.js';
import { procStat, startCephCluster, type CephCluster, type CephClient } from '../ceph/cluster.js';
import { EtcdCluster, makeTestCertificates, type TlsFiles } from '../etcd/etcd.js';

export const NODES = ['node-a', 'node-b', 'node-c'] as const;
export type Node = (typeof NODES)[number];
export const ETCD_MEMBERS = ['etcd-0', 'etcd-1', 'etcd-2'] as const;

const PREFIX = 'latchnm-';
const OWNER_FILE = '/run/latch-nemesis-owner.json';
export const SUBNET = '198.18.0';
const ADDRESSES: Record<string, string> = {
  switch: `${SUBNET}.1`,
  storage: `${SUBNET}.10`,
  'etcd-0': `${SUBNET}.20`,
  'etcd-1': `${SUBNET}.21`,
  'etcd-2': `${SUBNET}.22`,
  'node-a': `${SUBNET}.31`,
  'node-b': `${SUBNET}.32`,
  'node-c': `${SUBNET}.33`,
};
const REPO = resolve(__dirname, '../..');
export const LATCH = join(REPO, 'bin/latch');

export const netnsOf = (part: string) => `${PREFIX}${part}`;
export const addressOf = (part: string): string => {
  const address = ADDRESSES[part];
  if (!address) throw new Error(`no such part of the rig: ${part}`);
  return address;
};

/** Why the rig cannot run here, or undefined. */
export function rigSkipReason(): string | undefined {
  if (process.getuid?.() !== 0) return 'the nemesis rig needs root (network namespaces, FUSE, loop devices)';
  if (!existsSync(LATCH)) return 'bin/latch is missing: run npm run build first';
  for (const tool of ['ip', 'nsenter', 'nft', 'curl', 'openssl', 'etcd', 'rbd-fuse', 'ceph-mon']) {
    if (spawnSync('sh', ['-c', `command -v ${tool}`], { env: { PATH: `${process.env.PATH}:/usr/sbin:/sbin` } }).status !== 0) {
      return `${tool} is not installed (scripts/setup.sh installs what the rig needs)`;
    }
  }
  return undefined;
}

async function ip(args: string[]): Promise<RunResult> {
  return run('ip', args, { timeoutMs: 10_000 });
}

/** The rig's network namespaces that exist now. */
function rigNamespaces(): string[] {
  try {
    return readdirSync('/run/netns').filter((n) => n.startsWith(PREFIX));
  } catch {
    return [];
  }
}

/** Kills what runs in the rig's namespaces and deletes them (their veths go with them). */
async function removeNamespaces(): Promise<void> {
  for (const ns of rigNamespaces()) {
    const { stdout } = await ip(['netns', 'pids', ns]).catch(() => ({ stdout: '' }));
    for (const pid of stdout.split('\n').filter(Boolean)) {
      try {
        process.kill(Number(pid), 'SIGKILL');
      } catch {
        // gone
      }
    }
    await ip(['netns', 'del', ns]).catch(() => undefined);
  }
}

/** Sweeps a rig whose runner is gone (SIGKILLed); refuses to start beside a live one. */
async function sweepAbandoned(): Promise<void> {
  if (existsSync(OWNER_FILE)) {
    const owner = JSON.parse(readFileSync(OWNER_FILE, 'utf8')) as { pid: number; start: string; dirs?: string[] };
    if (procStat(owner.pid)?.[19] === owner.start) throw new Error(`a nemesis rig of process ${owner.pid} is running`);
    await removeNamespaces();
    // Its etcd's data and the rig's own files (certificates); the Ceph fixture sweeps its dir itself.
    for (const dir of owner.dirs ?? []) if (dir.startsWith(`${tmpdir()}/latch-`)) rmSync(dir, { recursive: true, force: true });
    rmSync(OWNER_FILE, { force: true });
  }
  await removeNamespaces();
}

export interface NodeSetup {
  node: Node;
  netns: string;
  config: string;
  logFile: string;
  mountDir: string;
  /** Where the runner's "kubelet" makes the node's global mount paths. */
  kubeletDir: string;
  client: CephClient;
}

export class Rig {
  readonly nodes = {} as Record<Node, NodeSetup>;
  /** The admin's configuration (the fencer's identity), used from the switch namespace. */
  adminConfig = '';
  ceph!: CephCluster;
  etcd!: EtcdCluster;
  tls!: { ca: string; server: TlsFiles; client: TlsFiles };
  private stopped = false;

  private constructor(readonly dir: string) {}

  static async start(log: (line: string) => void = () => undefined): Promise<Rig> {
    await sweepAbandoned();
    const rig = new Rig(mkdtempSync(join(tmpdir(), 'latch-nemesis-')));
    rig.writeOwner();
    try {
      await rig.create(log);
      return rig;
    } catch (err) {
      await rig.stop().catch(() => undefined);
      throw err;
    }
  }

  /** The owner file: this process, and the dirs a sweep removes if it dies without stop(). */
  private writeOwner(): void {
    const dirs = [this.dir, ...(this.etcd ? [this.etcd.dir] : [])];
    writeFileSync(OWNER_FILE, JSON.stringify({ pid: process.pid, start: procStat(process.pid)?.[19], dirs }));
  }

  private async create(log: (line: string) => void): Promise<void> {
    const parts = ['switch', 'storage', ...ETCD_MEMBERS, ...NODES];
    for (const part of parts) await ip(['netns', 'add', netnsOf(part)]);
    const sw = netnsOf('switch');
    await ip(['-n', sw, 'link', 'add', 'br0', 'type', 'bridge']);
    await ip(['-n', sw, 'addr', 'add', `${addressOf('switch')}/24`, 'dev', 'br0']);
    await ip(['-n', sw, 'link', 'set', 'br0', 'up']);
    for (const part of parts) {
      const ns = netnsOf(part);
      await ip(['-n', ns, 'link', 'set', 'lo', 'up']);
      if (part === 'switch') continue;
      await ip(['-n', sw, 'link', 'add', `p-${part}`, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns]);
      await ip(['-n', sw, 'link', 'set', `p-${part}`, 'master', 'br0', 'up']);
      await ip(['-n', ns, 'addr', 'add', `${addressOf(part)}/24`, 'dev', 'eth0']);
      await ip(['-n', ns, 'link', 'set', 'eth0', 'up']);
    }
    log(`network: ${parts.length} namespaces on a bridge, ${SUBNET}.0/24`);

    const certs = makeTestCertificates(join(this.dir, 'tls'), ETCD_MEMBERS.map(addressOf));
    if (!certs) throw new Error('openssl is missing: the rig needs it for etcd TLS');
    this.tls = certs;
    this.etcd = await EtcdCluster.start({
      size: 3,
      clientTls: { server: certs.server, ca: certs.ca },
      hosts: ETCD_MEMBERS.map((m) => ({ netns: netnsOf(m), address: addressOf(m) })),
      clientNetns: sw,
      startTimeoutMs: 60_000,
    });
    this.writeOwner();
    log(`etcd: 3 members over TLS (${this.etcd.endpoints.join(' ')})`);

    this.ceph = await startCephCluster({ netns: { name: netnsOf('storage'), address: addressOf('storage') }, startTimeoutMs: 180_000 });
    log(`ceph: mon, mgr, osd at ${this.ceph.monHost}`);
    // A cut-off client's watch expires in 5 s rather than 30 s, so that the fencer finds nothing of it sooner.
    await this.ceph.ceph(['config', 'set', 'osd', 'osd_client_watch_timeout', '5']);

    const store = {
      type: 'etcd',
      endpoints: this.etcd.endpoints,
      timeoutMs: 3000,
      tls: { ca: certs.ca, cert: certs.client.cert, key: certs.client.key },
    };
    const fencer = await this.ceph.createClient('latch-fencer', { role: 'fencer' });
    for (const node of NODES) {
      const client = await this.ceph.createClient(`latch-${node}`);
      // Under the Ceph dir: its sweep (also after a SIGKILL) aborts the FUSE mounts and detaches the loops there.
      const base = join(this.ceph.dir, 'nodes', node);
      mkdirSync(base, { recursive: true, mode: 0o700 });
      const setup: NodeSetup = {
        node,
        netns: netnsOf(node),
        config: join(base, 'config.json'),
        logFile: join(base, 'latch.log'),
        mountDir: join(base, 'rbd'),
        kubeletDir: join(base, 'kubelet'),
        client,
      };
      const config = {
        nodeName: node,
        poolDir: join(base, 'pool'),
        stateDir: join(base, 'state'),
        logFile: setup.logFile,
        maxSize: '1Gi',
        waitForAttachTimeout: 10,
        commandTimeout: 10,
        store,
        agent: { listen: '127.0.0.1:9742', intervalSeconds: 5 },
        backend: {
          type: 'rbd',
          pool: this.ceph.pool,
          cephConf: client.confPath,
          clientId: client.id,
          keyring: client.keyringPath,
          mountDir: setup.mountDir,
          client: 'rbd-fuse',
        },
      };
      writeFileSync(setup.config, JSON.stringify(config, null, 2), { mode: 0o600 });
      this.nodes[node] = setup;
    }
    const adminBase = join(this.ceph.dir, 'nodes', 'admin');
    mkdirSync(adminBase, { recursive: true, mode: 0o700 });
    this.adminConfig = join(adminBase, 'config.json');
    const nodeA = this.nodes['node-a'];
    const admin = {
      nodeName: 'admin',
      poolDir: join(adminBase, 'pool'),
      stateDir: join(adminBase, 'state'),
      logFile: join(adminBase, 'latch.log'),
      commandTimeout: 10,
      store,
      backend: {
        type: 'rbd',
        pool: this.ceph.pool,
        cephConf: nodeA.client.confPath,
        clientId: nodeA.client.id,
        keyring: nodeA.client.keyringPath,
        mountDir: join(adminBase, 'rbd'),
        client: 'rbd-fuse',
        fencer: { clientId: fencer.id, keyring: fencer.keyringPath },
      },
    };
    writeFileSync(this.adminConfig, JSON.stringify(admin, null, 2), { mode: 0o600 });
  }

  // -------------------------------------------------------------------------------------------------------------
  // Faults on the network.

  /** Takes `part`'s link to the switch down (or up again): cut off from everything. */
  async link(part: string, up: boolean): Promise<void> {
    await ip(['-n', netnsOf('switch'), 'link', 'set', `p-${part}`, up ? 'up' : 'down']);
  }

  /** Drops what `part` sends to each of `to` (a blackhole route in its namespace): one-way, from `part`'s side. */
  async blackhole(part: string, to: string[], on: boolean): Promise<void> {
    for (const other of to) {
      await ip(['-n', netnsOf(part), 'route', on ? 'add' : 'del', 'blackhole', `${addressOf(other)}/32`]).catch((err: unknown) => {
        if (on) throw err;
      });
    }
  }

  /** Removes everything: the Ceph and etcd fixtures' processes, mounts and loops, then the namespaces. */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    const errors: unknown[] = [];
    await this.ceph?.stop().catch((err: unknown) => errors.push(err));
    await this.etcd?.stop().catch((err: unknown) => errors.push(err));
    await removeNamespaces().catch((err: unknown) => errors.push(err));
    rmSync(this.dir, { recursive: true, force: true });
    rmSync(OWNER_FILE, { force: true });
    if (errors.length > 0) throw new Error(`the rig left things behind: ${errors.map(String).join('; ')}`);
    if (rigNamespaces().length > 0) throw new Error(`network namespaces left: ${rigNamespaces().join(' ')}`);
  }
}
