// latch doctor with the rbd backend. First the stale-mapping logic on planted kernel states (no Ceph needed), then
// doctor itself against a real one-host Ceph cluster (test/ceph/cluster.ts): a healthy node, a keyring others can
// read, identities with the wrong caps or settings, a missing pool, mappings left behind (an unheld one, a dead
// one) whose printed fix is run and must clear them, and a cluster that does not answer.
// The Ceph part needs root and Debian's ceph packages (scripts/setup.sh); it skips with a message otherwise.
import assert from 'node:assert/strict';
import { chmodSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it, test } from 'node:test';
import { chooseRbdClient } from '../../src/backend/client-choice.js';
import { RbdBackend } from '../../src/backend/rbd.js';
import { krbdMappingFindings, rbdMappingFindings, type RbdNodeState } from '../../src/doctor/rbd/mappings.js';
import type { DoctorReport, Finding } from '../../src/doctor/findings.js';
import { runDoctor } from '../../src/doctor/run.js';
import { parseConfig } from '../../src/config.js';
import { addTicket, newVolume } from '../../src/ledger/arbitrate.js';
import { ticketId } from '../../src/ledger/ids.js';
import { volumeKey } from '../../src/ledger/keys.js';
import { Ledger } from '../../src/ledger/ledger.js';
import type { NodePhase, VolumeDoc } from '../../src/ledger/types.js';
import { openStore } from '../../src/store/index.js';
import { rbdFuseProcesses, rbdFusePids } from '../../src/sys/fuse.js';
import { listLoopDevices } from '../../src/sys/loop.js';
import { readMountInfo } from '../../src/sys/mounts.js';
import { run } from '../../src/sys/run.js';
import { cephSkipReason, startCephCluster, type CephClient, type CephCluster } from '../ceph/cluster.js';
import { defined } from '../fixtures/defined.js';

const SINCE = '2030-01-01T11:00:00.000Z';

/** A volume document with `node` in `phase`, as the ledger would have it. */
function held(name: string, node: string, phase: NodePhase): VolumeDoc {
  let doc = newVolume(name, 64 * 1024 ** 2, 'ext4', SINCE);
  const id = ticketId('workload', name, 'latch/loop', node);
  doc = addTicket(doc, { id, type: 'workload', nodeID: node, parameters: { readOnly: false }, requestedBy: { pvName: name } }, SINCE);
  doc.status.nodes[node] = { phase, readOnly: false, since: SINCE, device: '/dev/loop7' };
  doc.status.currentNodes = [node];
  return doc;
}

const DIR = '/var/lib/latch/rbd';

/** A complete, healthy mapping of `image`: FUSE mount (connection `conn`), its process, a loop device. */
function mapped(image: string, pid: number, conn: number, loop: string, mountPoints: string[] = []): Partial<RbdNodeState> {
  return {
    mounts: [{ mountPoint: `${DIR}/${image}`, connection: conn }],
    processes: [{ pid, mountPoint: `${DIR}/${image}` }],
    loops: [{ device: loop, backingFile: `${DIR}/${image}/${image}`, mountPoints }],
  };
}

function state(...parts: Partial<RbdNodeState>[]): RbdNodeState {
  return {
    mountDir: DIR,
    fusectlMounted: true,
    mounts: parts.flatMap((p) => p.mounts ?? []),
    processes: parts.flatMap((p) => p.processes ?? []),
    loops: parts.flatMap((p) => p.loops ?? []),
  };
}

describe('doctor: rbd mappings against the ledger (planted kernel states)', () => {
  test('held mappings and no leftovers: nothing to report', () => {
    const s = state(mapped('vol-a', 100, 41, '/dev/loop3', ['/kubelet/vol-a']), mapped('vol-b', 101, 42, '/dev/loop4'));
    assert.deepEqual(rbdMappingFindings(s, 'node-a', [held('vol-a', 'node-a', 'attached'), held('vol-b', 'node-a', 'detaching')]), []);
    assert.deepEqual(rbdMappingFindings(undefined, 'node-a', []), []);
  });

  test('a mapping the ledger does not explain: an error with the commands that clear it, in the order that cannot hang', () => {
    const s = state(mapped('vol-a', 100, 41, '/dev/loop3'));
    const [f, ...rest] = rbdMappingFindings(s, 'node-a', [held('vol-a', 'node-b', 'attached')]);
    assert.deepEqual(rest, []);
    assert.equal(f?.severity, 'error');
    assert.equal(f?.check, 'rbd-mappings');
    assert.match(
      f?.message ?? '',
      /^stale rbd mapping of vol-a \(\/dev\/loop3, FUSE mount \/var\/lib\/latch\/rbd\/vol-a, rbd-fuse pid 100\): the ledger has no hold of node node-a on volume vol-a$/,
    );
    assert.equal(
      f?.fix,
      'losetup -d /dev/loop3; echo 1 > /sys/fs/fuse/connections/41/abort; kill -KILL 100; umount /var/lib/latch/rbd/vol-a || umount -l /var/lib/latch/rbd/vol-a; rmdir /var/lib/latch/rbd/vol-a',
    );
  });

  test('an unheld mapping whose filesystem is mounted: unmount first (a mounts finding), then clear', () => {
    const s = { ...state(mapped('vol-a', 100, 41, '/dev/loop3', ['/mnt/x y'])), fusectlMounted: false };
    const findings = rbdMappingFindings(s, 'node-a', []);
    assert.deepEqual(
      findings.map((f) => [f.check, f.severity]),
      [
        ['mounts', 'error'],
        ['rbd-mappings', 'error'],
      ],
    );
    assert.equal(findings[0]?.fix, "umount '/mnt/x y'");
    assert.match(findings[1]?.fix ?? '', /^losetup -d \/dev\/loop3; mount -t fusectl fusectl \/sys\/fs\/fuse\/connections; echo 1 > /);
    assert.match(findings[1]?.note ?? '', /^after unmounting \/mnt\/x y/);
  });

  test('dead mappings of held volumes: a mount without its process, stacked mounts; a lone process is only a warning', () => {
    const deadMount = { mounts: [{ mountPoint: `${DIR}/vol-a`, connection: 41 }] };
    const stacked = {
      ...mapped('vol-b', 102, 43, '/dev/loop5'),
      mounts: [
        { mountPoint: `${DIR}/vol-b`, connection: 43 },
        { mountPoint: `${DIR}/vol-b`, connection: 44 },
      ],
    };
    const lone = { processes: [{ pid: 103, mountPoint: `${DIR}/vol-c` }] };
    const holds = ['vol-a', 'vol-b', 'vol-c'].map((v) => held(v, 'node-a', 'attached'));
    const findings = rbdMappingFindings(state(deadMount, stacked, lone), 'node-a', holds);
    const byVolume = (v: string) => findings.filter((f) => f.message.includes(` ${v} `) || f.message.includes(` ${v}:`));

    // vol-a: held, its mapping dead and without a loop device: the hold is stale, and the mount must go.
    assert.deepEqual(
      byVolume('vol-a').map((f) => [f.check, f.severity]),
      [
        ['ledger', 'error'],
        ['rbd-mappings', 'error'],
      ],
    );
    assert.equal(byVolume('vol-a')[0]?.fix, 'latch volume release vol-a --node node-a --node-is-down');
    assert.match(byVolume('vol-a')[1]?.message ?? '', /^dead rbd mapping of vol-a .*its FUSE mount has no rbd-fuse process/);
    assert.equal(
      byVolume('vol-a')[1]?.fix,
      `echo 1 > /sys/fs/fuse/connections/41/abort; umount ${DIR}/vol-a || umount -l ${DIR}/vol-a; rmdir ${DIR}/vol-a`,
    );

    const [b] = byVolume('vol-b');
    assert.match(b?.message ?? '', /2 FUSE mounts are stacked/);
    assert.match(
      b?.fix ?? '',
      /abort; echo 1 > \/sys\/fs\/fuse\/connections\/44\/abort; kill -KILL 102; umount (\S+) \|\| umount -l \1; umount \1 \|\| umount -l \1; rmdir/,
    );

    const c = byVolume('vol-c').filter((f) => f.check === 'rbd-mappings');
    assert.deepEqual(
      c.map((f) => [f.severity, f.fix]),
      [['warning', `kill -KILL 103; rmdir ${DIR}/vol-c`]],
    );
  });

  test('a held volume whose dead mapping still carries its mounted filesystem: no blind fix, restart the pod', () => {
    const s = state({ ...mapped('vol-a', 100, 41, '/dev/loop3', ['/kubelet/vol-a']), processes: [] });
    const [f, ...rest] = rbdMappingFindings(s, 'node-a', [held('vol-a', 'node-a', 'attached')]);
    assert.deepEqual(rest, []);
    assert.equal(f?.fix, undefined);
    assert.match(f?.note ?? '', /mounted at \/kubelet\/vol-a and gets I\/O errors: delete the pod/);
  });

  test('holds without a device: error when attached, warning while attaching, nothing while detaching', () => {
    const holds = [held('vol-a', 'node-a', 'attached'), held('vol-b', 'node-a', 'attaching'), held('vol-c', 'node-a', 'detaching')];
    const findings = rbdMappingFindings(state(), 'node-a', holds);
    assert.deepEqual(
      findings.map((f) => [f.severity, f.fix]),
      [
        ['error', 'latch volume release vol-a --node node-a --node-is-down'],
        ['warning', 'latch volume release vol-b --node node-a --node-is-down'],
      ],
    );
  });
});

describe('doctor: krbd mappings against the ledger (planted /sys/bus/rbd listings)', () => {
  const krbd = (image: string, id: number, mountPoints: string[] = []) => ({ image, device: `/dev/rbd${id}`, mountPoints });

  test('held mappings: nothing to report; a hold without a mapping is a stale ticket', () => {
    const holds = [held('vol-a', 'node-a', 'attached'), held('vol-b', 'node-a', 'attached'), held('vol-c', 'node-a', 'detaching')];
    const findings = krbdMappingFindings([krbd('vol-a', 0, ['/kubelet/vol-a'])], 'node-a', holds);
    assert.deepEqual(
      findings.map((f) => [f.check, f.severity, f.fix]),
      [['ledger', 'error', 'latch volume release vol-b --node node-a --node-is-down']],
    );
    assert.match(
      findings[0]?.message ?? '',
      /^stale ticket: volume vol-b is attached on node node-a .*but the kernel maps no image of it here$/,
    );
  });

  test('a mapping the ledger does not explain: unmount first, then unmap', () => {
    const findings = krbdMappingFindings([krbd('vol-a', 3, ['/mnt/x y'])], 'node-a', [held('vol-a', 'node-b', 'attached')]);
    assert.deepEqual(
      findings.map((f) => [f.check, f.severity, f.fix]),
      [
        ['mounts', 'error', "umount '/mnt/x y'"],
        ['rbd-mappings', 'error', 'rbd device unmap /dev/rbd3'],
      ],
    );
    assert.match(
      findings[1]?.message ?? '',
      /^stale rbd mapping of vol-a \(\/dev\/rbd3 \(mounted at \/mnt\/x y\)\): the ledger has no hold/,
    );
    assert.match(findings[1]?.note ?? '', /^after unmounting \/mnt\/x y/);
  });

  test('an unmounted second mapping of a held image is a warning, whichever comes first', () => {
    const holds = [held('vol-a', 'node-a', 'attached'), held('vol-b', 'node-a', 'attached')];
    const maps = [krbd('vol-a', 0, ['/kubelet/vol-a']), krbd('vol-a', 4), krbd('vol-b', 1), krbd('vol-b', 2, ['/kubelet/vol-b'])];
    const findings = krbdMappingFindings(maps, 'node-a', holds);
    assert.deepEqual(
      findings.map((f) => [f.severity, f.fix]),
      [
        ['warning', 'rbd device unmap /dev/rbd4'],
        ['warning', 'rbd device unmap /dev/rbd1'],
      ],
    );
    assert.match(
      findings[0]?.message ?? '',
      /^\/dev\/rbd4 is a second mapping of rbd volume vol-a besides \/dev\/rbd0, left over from a crash/,
    );
    assert.match(findings[1]?.message ?? '', /^\/dev\/rbd1 is a second mapping of rbd volume vol-b besides \/dev\/rbd2/);
  });
});

// ---------------------------------------------------------------------------------------------------------------

const skip = cephSkipReason();

describe('doctor on a one-host Ceph cluster', { skip }, () => {
  let ceph: CephCluster;
  let node: CephClient;
  let base: string;
  let n = 0;

  before(
    async () => {
      ceph = await startCephCluster();
      node = await ceph.createClient('latch-node-a');
      base = mkdtempSync(join(tmpdir(), 'latch-doctor-rbd-'));
    },
    { timeout: 120_000 },
  );
  after(async () => {
    await ceph?.stop();
    if (base) rmSync(base, { recursive: true, force: true });
  });

  interface Setup {
    env: NodeJS.ProcessEnv;
    self: string;
    mountDir: string;
    ledger: Ledger;
    backend: RbdBackend;
  }

  /** A node's config with the rbd backend as `client`, an installed "driver" identical to self, a file ledger. */
  async function setup(client: CephClient, backend: Record<string, unknown> = {}): Promise<Setup> {
    const dir = join(base, `env-${++n}`);
    const plugins = join(dir, 'plugins');
    mkdirSync(join(plugins, 'latch~loop'), { recursive: true });
    writeFileSync(join(plugins, 'latch~loop/loop'), 'a build\n', { mode: 0o755 });
    const self = join(dir, 'self');
    writeFileSync(self, 'a build\n', { mode: 0o755 });
    // Mounts under the cluster's dir: its teardown sweeps whatever a failed test leaves there.
    const mountDir = join(ceph.dir, 'mnt', `doctor-${n}`);
    const raw = {
      nodeName: 'node-a',
      singleNode: 'node-a', // the rbd backend on this node's own file store: one node only
      stateDir: join(dir, 'state'),
      poolDir: join(dir, 'pool'),
      logFile: join(dir, 'latch.log'),
      allowedFsTypes: ['ext4'],
      backend: {
        type: 'rbd',
        pool: ceph.pool,
        cephConf: client.confPath,
        clientId: client.id,
        keyring: client.keyringPath,
        mountDir,
        ...backend,
      },
    };
    writeFileSync(join(dir, 'config.json'), JSON.stringify(raw));
    const config = parseConfig(raw, 'test');
    const ledger = new Ledger(await openStore(config), () => SINCE);
    const rbd = defined(config.backend.type === 'rbd' ? config.backend : undefined, 'the rbd backend');
    return {
      env: { PATH: process.env.PATH, LATCH_CONFIG: join(dir, 'config.json'), LATCH_VOLUME_PLUGIN_DIR: plugins },
      self,
      mountDir,
      ledger,
      backend: new RbdBackend({
        ...rbd,
        client: chooseRbdClient(rbd.client, mountDir, { record: false }),
        maxSize: 1024 ** 3,
        timeoutMs: 30_000,
      }),
    };
  }

  function doctor(s: Setup): Promise<DoctorReport> {
    return runDoctor({ env: s.env, self: s.self });
  }

  const problems = (r: DoctorReport) => r.findings.filter((f) => f.severity !== 'ok');
  const show = (fs: Finding[]) => JSON.stringify(fs, null, 1);

  async function hold(s: Setup, name: string): Promise<void> {
    await s.ledger.update(name, () => held(name, 'node-a', 'attached'));
  }

  /** What the kernel still has of the mount dir. */
  async function leftovers(mountDir: string): Promise<{ mounts: string[]; loops: string[]; pids: number[] }> {
    const mounts = (await readMountInfo()).filter((m) => m.mountPoint.startsWith(`${mountDir}/`)).map((m) => m.mountPoint);
    const loops = (await listLoopDevices()).filter((l) => l.backingFile.startsWith(`${mountDir}/`)).map((l) => l.device);
    const pids = (await rbdFuseProcesses()).filter((p) => p.argv.some((a) => a.startsWith(`${mountDir}/`))).map((p) => p.pid);
    return { mounts, loops, pids };
  }

  it('a healthy node with a held, mapped volume: no warnings or errors; caps and setting reported', { timeout: 120_000 }, async () => {
    const s = await setup(node);
    await s.backend.create('vol-healthy', 64 * 1024 ** 2);
    const device = await s.backend.attach('vol-healthy');
    await hold(s, 'vol-healthy');
    const report = await doctor(s);
    assert.deepEqual(problems(report), [], show(problems(report)));
    const messages = report.findings.map((f) => f.message).join('\n');
    assert.match(messages, /the cluster answers client\.latch-node-a: pool latch has 1 image\(s\)/);
    assert.match(messages, /cluster health: HEALTH_OK/);
    assert.match(messages, /client\.latch-node-a may write to pool latch/);
    assert.match(messages, /cannot read cephx keys or caps \(as it should\)/);
    assert.match(messages, /rbd_blocklist_on_break_lock = false/);
    assert.match(messages, /node client rbd-fuse\+loop/);
    assert.match(messages, /ledger and kernel agree on node node-a: 1 rbd mapping/);
    assert.match(messages, /1 rbd-fuse daemon\(s\) under .*, all with librbd's cache off/);
    assert.ok(device.startsWith('/dev/loop'));

    // Its ledger document damaged: one error naming it, and its mapping is not called stale (nor cleared).
    const stored = await s.ledger.store.get(volumeKey('vol-healthy'));
    assert.ok(stored);
    await s.ledger.store.put(volumeKey('vol-healthy'), { apiVersion: 'latch/v0' }, stored.revision);
    const damaged = problems(await doctor(s));
    assert.deepEqual(
      damaged.map((f) => [f.check, f.severity]),
      [['ledger', 'error']],
      show(damaged),
    );
    assert.match(damaged[0]?.message ?? '', /the ledger document of volume vol-healthy cannot be read/);
    await s.backend.release('vol-healthy');
  });

  it(
    'with the kernel client on a kernel without the rbd module: one error, with the fix; rbd-fuse not needed',
    { timeout: 120_000 },
    async () => {
      const s = await setup(node, { client: 'krbd' });
      const tools = join(base, 'krbd-tools');
      mkdirSync(tools, { recursive: true });
      // Every tool of the host but rbd-fuse (/bin is /usr/bin on Debian 12).
      const path = `${tools}:${process.env.PATH ?? ''}`.split(':').filter((d) => d !== '/usr/bin' && d !== '/bin');
      for (const tool of readdirSync('/usr/bin')) if (tool !== 'rbd-fuse') symlinkSync(`/usr/bin/${tool}`, join(tools, tool));
      const report = await runDoctor({ env: { ...s.env, PATH: path.join(':'), LATCH_TOOL_PATH: path.join(':') }, self: s.self });
      const rbdProblems = problems(report).filter((f) => f.check === 'rbd-client' || f.check === 'tools' || f.check === 'ceph');
      assert.deepEqual(
        rbdProblems.map((f) => [f.check, f.severity, f.fix]),
        [['rbd-client', 'error', 'modprobe rbd && echo rbd > /etc/modules-load.d/latch-rbd.conf']],
        show(rbdProblems),
      );
      assert.match(rbdProblems[0]?.message ?? '', /^node client krbd: the kernel has no rbd module/);
      assert.ok(
        report.findings.some((f) => f.message === 'found the Ceph tools rbd, ceph, rados'),
        'rbd-fuse is not looked for',
      );
      assert.match(
        report.findings.map((f) => f.message).join('\n'),
        /ledger and kernel agree on node node-a: 0 rbd mapping\(s\) of pool latch in \/sys\/bus\/rbd/,
      );
    },
  );

  it('a keyring others can read is a warning with the fix, and the key is never in the report', { timeout: 60_000 }, async () => {
    const s = await setup(node);
    chmodSync(node.keyringPath, 0o644);
    try {
      const report = await doctor(s);
      const [f, ...rest] = problems(report);
      assert.deepEqual(rest, [], show(problems(report)));
      assert.equal(f?.severity, 'warning');
      assert.match(f?.message ?? '', /keyring .* is not private to root \(mode 0644, owner uid 0\)/);
      assert.equal(f?.fix, `chown root:root ${node.keyringPath} && chmod 600 ${node.keyringPath}`);
      const key = defined(/key = (\S+)/.exec(readFileSync(node.keyringPath, 'utf8'))?.[1], 'the key');
      assert.ok(!JSON.stringify(report).includes(key));
    } finally {
      chmodSync(node.keyringPath, 0o600);
    }
  });

  it(
    'identities that cannot write, that can read keys, or that would blocklist on lock break; a missing pool; a missing keyring',
    { timeout: 120_000 },
    async () => {
      const readOnly = await ceph.createClient('latch-ro', {
        caps: ['mon', 'allow service mon r, allow service osd r, allow service pg r', 'osd', `profile rbd-read-only pool=${ceph.pool}`],
      });
      const broad = await ceph.createClient('latch-broad', { caps: ['mon', 'allow *', 'osd', 'allow *'] });
      const breaker = await ceph.createClient('latch-breaker', { settings: { rbd_blocklist_on_break_lock: 'true' } });
      const cases: [CephClient, Record<string, unknown>, RegExp][] = [
        [readOnly, {}, /client\.latch-ro may read pool latch but not write to it/],
        [broad, {}, /client\.latch-broad can read cephx keys \(its caps: .*mon 'allow \*'.*\): far more than a node needs/],
        [breaker, {}, /rbd_blocklist_on_break_lock is true for client\.latch-breaker .* fails/],
        [node, { pool: 'nopool' }, /the cluster answers client\.latch-node-a, but has no pool nopool/],
        [
          node,
          { keyring: join(base, 'missing.keyring') },
          /the keyring of client\.latch-node-a, .*missing\.keyring, cannot be read: it does not exist/,
        ],
      ];
      for (const [client, backend, expected] of cases) {
        const report = await doctor(await setup(client, backend));
        const errors = report.findings.filter((f) => f.severity === 'error');
        assert.equal(errors.length, 1, `${String(expected)}: ${show(problems(report))}`);
        assert.match(errors[0]?.message ?? '', expected);
        assert.ok(errors[0]?.fix || errors[0]?.note, 'says how to fix it');
        const keys = [...readFileSync(client.keyringPath, 'utf8').matchAll(/key = (\S+)/g)].map((m) => m[1] ?? '');
        for (const key of keys) assert.ok(!JSON.stringify(report).includes(key), 'no key in the report');
      }
    },
  );

  it(
    'mappings left behind without a hold (one of them hung), and a dead one: errors whose fixes clear them',
    { timeout: 120_000 },
    async () => {
      const s = await setup(node);
      // Left behind: mapped by the backend, but the ledger never learnt of it (a driver whose state was lost).
      await s.backend.create('vol-left', 64 * 1024 ** 2);
      const device = await s.backend.attach('vol-left');
      // Hung: the same, its rbd-fuse stopped; like a fenced one it answers nothing, and a stat of its mount would hang.
      await s.backend.create('vol-hung', 64 * 1024 ** 2);
      await s.backend.attach('vol-hung');
      const [hungPid] = await rbdFusePids(join(s.mountDir, 'vol-hung'));
      process.kill(defined(hungPid, 'the rbd-fuse of vol-hung'), 'SIGSTOP');
      // Dead: an rbd-fuse of the layout's kind, killed, its mount left behind.
      await ceph.rbd(['create', '--size', '64M', `${ceph.pool}/vol-dead`]);
      const fuse = await ceph.startRbdFuse(node, join(s.mountDir, 'vol-dead'), { image: 'vol-dead' });
      process.kill(fuse.pid, 'SIGKILL');
      while ((await rbdFusePids(fuse.mountpoint)).length > 0) await new Promise((r) => setTimeout(r, 50));

      const report = await doctor(s);
      const found = problems(report);
      assert.deepEqual(
        found.map((f) => [f.check, f.severity]),
        [
          ['rbd-mappings', 'error'],
          ['rbd-mappings', 'error'],
          ['rbd-mappings', 'error'],
        ],
        show(found),
      );
      const left = defined(found.find((f) => f.message.includes('vol-left')));
      assert.match(
        left.message,
        new RegExp(`^stale rbd mapping of vol-left \\(${device}, FUSE mount \\S+, rbd-fuse pid \\d+\\): the ledger has no hold`),
      );
      const hung = defined(found.find((f) => f.message.includes('vol-hung')));
      assert.match(hung.message, new RegExp(`rbd-fuse pid ${hungPid}\\): the ledger has no hold`));
      const dead = defined(found.find((f) => f.message.includes('vol-dead')));
      assert.match(dead.message, /^stale rbd mapping of vol-dead \(FUSE mount \S+\): .*its FUSE mount has no rbd-fuse process/);

      // The printed fixes, run as they are, clear all three.
      for (const f of [left, hung, dead]) await run('sh', ['-c', defined(f.fix)], { timeoutMs: 30_000, okExitCodes: [1] });
      assert.deepEqual(await leftovers(s.mountDir), { mounts: [], loops: [], pids: [] });
      const again = await doctor(s);
      assert.deepEqual(problems(again), [], show(problems(again)));
    },
  );

  it('a cluster that does not answer: an error within the deadline, not a hang', { timeout: 90_000 }, async (t) => {
    // The node's conf, its monitor moved to a port nothing listens on.
    const conf = readFileSync(node.confPath, 'utf8').replace(/^mon_host = .*$/m, 'mon_host = [v2:127.0.0.1:9,v1:127.0.0.1:7]');
    const confPath = join(base, 'unreachable.conf');
    writeFileSync(confPath, conf, { mode: 0o600 });
    const started = performance.now();
    const report = await doctor(await setup(node, { cephConf: confPath }));
    const errors = report.findings.filter((f) => f.severity === 'error');
    assert.equal(errors.length, 1, show(problems(report)));
    assert.match(errors[0]?.message ?? '', /^the Ceph cluster did not answer client\.latch-node-a within 10 s/);
    assert.match(errors[0]?.note ?? '', /mon_host/);
    // A figure for the record, not a timing assertion.
    t.diagnostic(`doctor against an unreachable cluster: ${Math.round(performance.now() - started)} ms`);
  });
});
