// Shared (ReadWriteMany) volumes through the driver (bin/latch) on a real one-host Ceph cluster with a CephFS file
// system (test/ceph/mds.ts): node-a, node-b and node-c run in non-attach mode, node-d in attach mode, each with its own
// cephx identity whose caps reach only latch's subvolume group, and all share the ledger. Three nodes mount one
// shared volume at once and write concurrently; each sees the others' files; the quota refuses writes past the size
// and `latch volume expand` lifts it; a block volume keeps its one-writer rule in the same run; a shared volume is
// refused where a block device is required; calls repeated after a SIGKILL converge; a SIGSTOPped ceph-fuse does not
// hold an unmount past its deadline; a node fenced while all three write has none of its late writes land; and a
// snapshot is taken by a node's agent through a snapshot ticket beside the pods.
// Every FUSE mount lives under the cluster's dir, whose teardown aborts them through fusectl, also after a failure.
// Needs root, Debian's ceph, ceph-mds and ceph-fuse packages and bin/latch; skips with a message otherwise.
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { after, before, beforeEach, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { parseConfig } from '../../src/config.js';
import { createContext } from '../../src/context.js';
import { readMountInfo } from '../../src/sys/mounts.js';
import { cephfsFencerCaps, cephfsNodeCaps } from '../../src/sys/cephfs.js';
import { fencerCaps } from '../../src/sys/rbd.js';
import { run } from '../../src/sys/run.js';
import { cephSkipReason, startCephCluster, type CephClient, type CephCluster } from '../ceph/cluster.js';
import { evictGoneClients } from '../ceph/mds.js';

const REPO = resolve(__dirname, '../..');
const LATCH = join(REPO, 'bin/latch');
const execFileAsync = promisify(execFile);
const which = (tool: string) => ['/usr/bin', '/usr/sbin', '/bin', '/sbin'].some((d) => existsSync(join(d, tool)));
const skip =
  cephSkipReason() ??
  (which('ceph-mds') && which('ceph-fuse') ? undefined : 'ceph-mds and ceph-fuse are not installed: run scripts/setup.sh') ??
  (existsSync(LATCH) ? undefined : 'bin/latch is missing: run npm run build first');

interface Reply {
  status: string;
  message?: string;
  device?: string;
}

const NODES = ['node-a', 'node-b', 'node-c'] as const;
const PV = 'pv-shared';
const MiB = 1024 * 1024;

describe('shared volumes on CephFS through the driver', { skip }, () => {
  let ceph: CephCluster;
  let fencer: CephClient;
  const configs: Record<string, string> = {};
  let stateDir = '';

  before(
    async () => {
      ceph = await startCephCluster({ cephfs: true });
      stateDir = join(ceph.dir, 'latch-state');
      fencer = await ceph.createClient('latch-fencer', { caps: cephfsFencerCaps(fencerCaps(ceph.pool)), role: 'fencer' });
      for (const node of [...NODES, 'node-d', 'admin']) {
        const client = await ceph.createClient(`latch-${node}`, { caps: cephfsNodeCaps(ceph.pool, 'cephfs', 'latch') });
        mkdirSync(join(ceph.dir, node), { recursive: true });
        const config = {
          nodeName: node,
          attach: node === 'node-d',
          oneHost: true,
          stateDir,
          logFile: join(ceph.dir, node, 'latch.log'),
          maxSize: '1Gi',
          waitForAttachTimeout: 10,
          commandTimeout: 8,
          backend: {
            type: 'rbd',
            pool: ceph.pool,
            cephConf: client.confPath,
            clientId: client.id,
            keyring: client.keyringPath,
            mountDir: join(ceph.dir, 'mnt', node, 'rbd'),
            cephfs: { fsName: 'cephfs', group: 'latch', client: 'ceph-fuse', mountDir: join(ceph.dir, 'mnt', node, 'cephfs') },
            ...(node === 'admin' && { fencer: { clientId: fencer.id, keyring: fencer.keyringPath } }),
          },
        };
        configs[node] = join(ceph.dir, node, 'config.json');
        writeFileSync(configs[node], JSON.stringify(config, null, 2));
      }
    },
    { timeout: 120_000 },
  );

  after(async () => {
    await ceph?.stop();
  });

  // A ceph-fuse this file kills (the SIGKILL, SIGSTOP and fence tests) keeps its MDS session until it times out.
  beforeEach(async () => {
    if (ceph) await evictGoneClients(ceph, fencer);
  });

  /** One driver call as `node`: one JSON object on stdout, nothing on stderr. */
  async function call(node: string, ...args: string[]): Promise<Reply> {
    const { stdout, stderr } = await execFileAsync(LATCH, args, {
      env: { ...process.env, LATCH_CONFIG: configs[node] },
      timeout: 60_000,
    }).catch((err: { stdout?: string; stderr?: string }) => ({ stdout: err.stdout ?? '', stderr: err.stderr ?? '' }));
    assert.equal(stderr, '', `${args[0]} on ${node} wrote to stderr`);
    return JSON.parse(stdout) as Reply;
  }

  async function admin(node: string, ...args: string[]): Promise<{ code: number; out: string }> {
    return execFileAsync(LATCH, args, { env: { ...process.env, LATCH_CONFIG: configs[node] }, timeout: 60_000 }).then(
      ({ stdout }) => ({ code: 0, out: stdout }),
      (err: { code?: number; stdout?: string; stderr?: string }) => ({
        code: err.code ?? 1,
        out: `${err.stdout ?? ''}${err.stderr ?? ''}`,
      }),
    );
  }

  /**
   * Repeats a call until it succeeds, as kubelet repeats a failed mount and an admin a failed command, for the calls
   * that follow this file's kills: a killed client's caps can hold the manager's subvolume calls past the 8 s
   * commandTimeout until the MDS lets them go (see beforeEach). Each attempt still ends within its own deadline.
   */
  async function repeated<T>(what: string, attempt: () => Promise<T>, done: (result: T) => boolean): Promise<T> {
    const giveUp = Date.now() + 120_000;
    for (;;) {
      const result = await attempt();
      if (done(result) || Date.now() > giveUp) return result;
      process.stderr.write(`# ${what} failed, repeated: ${JSON.stringify(result).slice(0, 300)}\n`);
      await new Promise((r) => setTimeout(r, 2_000));
    }
  }
  const adminUntilDone = (...args: string[]) =>
    repeated(
      `latch ${args.join(' ')}`,
      () => admin('admin', ...args),
      (r) => r.code === 0,
    );
  const mountUntilDone = (node: string, pv = PV, opts = options(node)) =>
    repeated(
      `mount on ${node}`,
      () => call(node, 'mount', podDir(node, pv), opts),
      (r) => r.status === 'Success',
    );

  const podDir = (node: string, pv = PV) => join(ceph.dir, 'kubelet', node, 'pods', `uid-${node}`, 'volumes', 'latch~latch', pv);
  const options = (node: string, extra: Record<string, string> = {}) =>
    JSON.stringify({
      'kubernetes.io/pvOrVolumeName': PV,
      'kubernetes.io/pod.uid': `uid-${node}`,
      'kubernetes.io/pod.namespace': 'default',
      accessMode: 'ReadWriteMany',
      size: '64Mi',
      ...extra,
    });
  const sh = (script: string, timeoutMs = 60_000) => run('sh', ['-c', script], { timeoutMs, okExitCodes: [1] });

  it('three nodes mount one shared volume at once, write concurrently, and each sees the others files', { timeout: 180_000 }, async () => {
    for (const node of NODES) {
      const reply = await call(node, 'mount', podDir(node), options(node));
      assert.equal(reply.status, 'Success', `mount on ${node}: ${reply.message}`);
    }
    const table = await readMountInfo();
    for (const node of NODES) {
      assert.ok(
        table.some((m) => m.mountPoint === podDir(node) && m.fsType === 'fuse.ceph-fuse'),
        `${node}'s pod dir shows the CephFS mount`,
      );
    }
    // Each writer its own files (appends to one file from several clients are not safe on CephFS: see the notes).
    await Promise.all(
      NODES.map((node) =>
        sh(`for i in $(seq 1 20); do echo "${node} $i" > "${podDir(node)}/${node}-$i"; sync "${podDir(node)}/${node}-$i"; done`),
      ),
    );
    for (const node of NODES) {
      const names = readdirSync(podDir(node)).sort();
      assert.equal(names.length, 60, `${node} sees every node's files: ${names.length}`);
      const { stdout } = await sh(`cat "${podDir(node)}/node-b-7"`);
      assert.equal(stdout.trim(), 'node-b 7');
    }
    // Repeating a mount changes nothing.
    assert.equal((await call('node-a', 'mount', podDir('node-a'), options('node-a'))).status, 'Success');
    const doc = JSON.parse((await admin('node-a', 'volume', 'inspect', PV, '-o', 'json')).out) as {
      spec: { shared?: boolean };
      status: { currentNodes: string[] };
    };
    assert.equal(doc.spec.shared, true);
    assert.deepEqual(doc.status.currentNodes, ['node-a', 'node-b', 'node-c']);
  });

  it("an ACL set through one node's pod mount is checked on another's, as the kernel client checks it", { timeout: 60_000 }, async () => {
    // Root-owned files: mode 0600 with an entry letting uid 1000 read; mode 0644 with one shutting uid 1001 out (its
    // mask keeps the group's r: with an empty mask Linux, and ceph-fuse, skip the ACL and check the mode bits). Mode
    // bits alone (a client that ignores ACLs) would give the opposite answers.
    const granted = join(podDir('node-a'), 'acl-granted');
    const denied = join(podDir('node-a'), 'acl-denied');
    writeFileSync(granted, 'for uid 1000\n', { mode: 0o600 });
    writeFileSync(denied, 'not for uid 1001\n', { mode: 0o644 });
    for (const [file, entry] of [
      [granted, 'u:1000:r'],
      [denied, 'u:1001:---'],
    ] as const) {
      const set = await run('setfacl', ['-m', entry, file], { timeoutMs: 30_000, okExitCodes: [1] });
      assert.equal(set.exitCode, 0, `setfacl -m ${entry} on node-a's pod mount: ${set.stderr}`);
    }
    /** What reading `name` in node-b's pod dir gives a process of `uid` (it enters the dir as root: its parents are 0700). */
    const readAs = async (uid: number, name: string) => {
      const script =
        `process.chdir(${JSON.stringify(podDir('node-b'))}); process.setgroups([${uid}]); process.setgid(${uid}); ` +
        `process.setuid(${uid}); try { require('fs').readFileSync(${JSON.stringify(name)}); console.log('read'); } ` +
        `catch (e) { console.log(e.code); }`;
      return (await run(process.execPath, ['-e', script], { timeoutMs: 30_000 })).stdout.trim();
    };
    assert.equal(await readAs(1000, 'acl-granted'), 'read', 'the named entry lets uid 1000 in on node-b');
    assert.equal(await readAs(1002, 'acl-granted'), 'EACCES', 'nobody else');
    assert.equal(await readAs(1001, 'acl-denied'), 'EACCES', 'the named entry shuts uid 1001 out on node-b');
    assert.equal(await readAs(1002, 'acl-denied'), 'read', 'the others read it');
  });

  it('doctor: the node client, the MDS as the node, quota use, and a stale mount with its fix', { timeout: 120_000 }, async () => {
    const doctor = await admin('node-a', 'doctor');
    assert.match(doctor.out, /node client: ceph-fuse/);
    assert.match(doctor.out, /file system cephfs has an active MDS \(as client\.latch-node-a\)/);
    // This file's 8 s commandTimeout is below the file system's session_timeout (60 s): doctor says what that costs.
    assert.match(doctor.out, /commandTimeout \(8 s\) is not above cephfs's session_timeout \(60 s\)/);
    assert.match(doctor.out, /shared volume pv-shared: [0-9.]+\w* of 64Mi used/);
    assert.doesNotMatch(doctor.out, /stale ticket: volume pv-shared/);
    assert.doesNotMatch(doctor.out, /stale CephFS mount/);
    // A mount of node-a's identity of a volume it does not hold: made by hand, as a leftover would be.
    const made = await admin('admin', 'volume', 'create', 'pv-other', '--size', '32Mi', '--shared');
    assert.equal(made.code, 0, made.out);
    assert.match(made.out, /shared volume pv-other created/);
    const path = (await ceph.ceph(['fs', 'subvolume', 'getpath', 'cephfs', 'pv-other', '--group_name', 'latch'])).stdout.trim();
    const stray = join(ceph.dir, 'mnt', 'stray');
    mkdirSync(stray, { recursive: true });
    await run(
      'ceph-fuse',
      [
        '--conf',
        join(ceph.dir, 'clients', 'client.latch-node-a.conf'),
        '--id',
        'latch-node-a',
        '--client_fs',
        'cephfs',
        '--client_mountpoint',
        path,
        stray,
      ],
      { timeoutMs: 30_000 },
    );
    try {
      const stale = await admin('node-a', 'doctor');
      assert.match(stale.out, new RegExp(`stale CephFS mount at ${stray} \\(volume pv-other\\)`));
      assert.match(stale.out, /fix: echo 1 > \/sys\/fs\/fuse\/connections\/[0-9]+\/abort; umount /);
      const other = await admin('node-b', 'doctor');
      assert.doesNotMatch(other.out, /stale CephFS mount/, "node-a's mount is not node-b's");
    } finally {
      await run('umount', [stray], { timeoutMs: 30_000 });
    }
    const removed = await admin('admin', 'volume', 'delete', 'pv-other');
    assert.equal(removed.code, 0, removed.out);
  });

  it('the quota refuses writes past the size with EDQUOT or ENOSPC, and expand lifts it', { timeout: 120_000 }, async () => {
    const big = join(podDir('node-a'), 'big');
    const first = await sh(`dd if=/dev/zero of="${big}" bs=1M count=128 conv=fsync 2>&1; echo "rc=$?"`);
    assert.match(first.stdout, /Disk quota exceeded|No space left on device/, first.stdout);
    assert.match(first.stdout, /rc=1/);
    await sh(`rm -f "${big}"`);
    const expanded = await admin('admin', 'volume', 'expand', PV, '--size', '256Mi');
    assert.equal(expanded.code, 0, expanded.out);
    // The new quota reaches the clients within a moment (the MDS pushes it with the caps).
    let second = { stdout: '' };
    for (let i = 0; i < 10; i++) {
      second = await sh(`dd if=/dev/zero of="${big}" bs=1M count=128 conv=fsync 2>&1; echo "rc=$?"`);
      if (/rc=0/.test(second.stdout)) break;
      await sh(`rm -f "${big}"; sleep 1`);
    }
    assert.match(second.stdout, /rc=0/, second.stdout);
    const df = await sh(`df -B1 --output=size "${podDir('node-b')}" | tail -1`);
    assert.equal(Number(df.stdout.trim()), 256 * MiB, 'node-b sees the new size too');
    await sh(`rm -f "${big}"`);
  });

  it(
    'a block volume keeps its one-writer rule in the same run, and a ReadWriteMany use of it is refused',
    { timeout: 120_000 },
    async () => {
      const block = (node: string, extra: Record<string, string> = {}) =>
        JSON.stringify({ 'kubernetes.io/pvOrVolumeName': 'pv-block', 'kubernetes.io/pod.uid': `uid-${node}`, size: '32Mi', ...extra });
      const a = await call('node-a', 'mount', podDir('node-a', 'pv-block'), block('node-a'));
      assert.equal(a.status, 'Success', a.message);
      const b = await call('node-b', 'mount', podDir('node-b', 'pv-block'), block('node-b'));
      assert.equal(b.status, 'Failure');
      assert.match(b.message ?? '', /attached to node node-a/);
      const rwx = await call(
        'node-a',
        'mount',
        podDir('node-a', 'pv-block2'),
        block('node-a', { accessMode: 'ReadWriteMany', volume: 'pv-block' }),
      );
      assert.equal(rwx.status, 'Failure');
      assert.match(rwx.message ?? '', /block \(ReadWriteOnce\) volume; it cannot be used ReadWriteMany/);
      assert.equal((await call('node-a', 'unmount', podDir('node-a', 'pv-block'))).status, 'Success');
    },
  );

  it(
    'attach mode: waitforattach names the shared volume, mountdevice refuses a block fsType, then mounts it',
    { timeout: 120_000 },
    async () => {
      const json = JSON.stringify({ 'kubernetes.io/pvOrVolumeName': PV, accessMode: 'ReadWriteMany' });
      assert.equal((await call('node-d', 'attach', json, 'node-d')).status, 'Success');
      const waited = await call('node-d', 'waitforattach', '', json);
      assert.equal(waited.status, 'Success', waited.message);
      assert.equal(waited.device, `/latch/shared/${PV}`);
      const global = join(ceph.dir, 'kubelet', 'node-d', 'plugins', 'latch', 'mounts', PV);
      const ext4 = JSON.stringify({ 'kubernetes.io/pvOrVolumeName': PV, 'kubernetes.io/fsType': 'ext4' });
      const refused = await call('node-d', 'mountdevice', global, waited.device ?? '', ext4);
      assert.equal(refused.status, 'Failure');
      assert.match(refused.message ?? '', /shared \(ReadWriteMany\) CephFS volume: it has no block device and no ext4 filesystem/);
      const wrongId = await call('node-d', 'mountdevice', global, '/dev/loop0', json);
      assert.equal(wrongId.status, 'Failure');
      const mounted = await call('node-d', 'mountdevice', global, waited.device ?? '', json);
      assert.equal(mounted.status, 'Success', mounted.message);
      assert.equal(readdirSync(global).filter((n) => n.startsWith('node-')).length, 60, 'node-d sees the files of the other nodes');
      assert.equal((await call('node-d', 'unmountdevice', global)).status, 'Success');
      assert.equal((await call('node-d', 'unmountdevice', global)).status, 'Success', 'repeated');
      assert.equal((await call('node-d', 'detach', PV, 'node-d')).status, 'Success');
      assert.ok(!(await readMountInfo()).some((m) => m.mountPoint === global));
    },
  );

  it('mount and unmount repeated after a SIGKILL converge', { timeout: 120_000 }, async () => {
    const node = 'node-c';
    assert.equal((await call(node, 'unmount', podDir(node))).status, 'Success');
    for (const delayMs of [150, 400, 800]) {
      const child = spawn(LATCH, ['mount', podDir(node), options(node)], {
        env: { ...process.env, LATCH_CONFIG: configs[node] },
        stdio: 'ignore',
      });
      // Listened for from the start: a call that finished before the kill has exited already.
      const childExited = new Promise((r) => child.once('exit', r));
      await new Promise((r) => setTimeout(r, delayMs));
      child.kill('SIGKILL');
      await childExited;
      const again = await call(node, 'mount', podDir(node), options(node));
      assert.equal(again.status, 'Success', `mount after a kill at ${delayMs} ms: ${again.message}`);
      assert.ok(readdirSync(podDir(node)).length >= 60);
      const killer = spawn(LATCH, ['unmount', podDir(node)], { env: { ...process.env, LATCH_CONFIG: configs[node] }, stdio: 'ignore' });
      const killerExited = new Promise((r) => killer.once('exit', r));
      await new Promise((r) => setTimeout(r, delayMs));
      killer.kill('SIGKILL');
      await killerExited;
      assert.equal((await call(node, 'unmount', podDir(node))).status, 'Success');
      const left = (await readMountInfo()).filter((m) => m.fsType === 'fuse.ceph-fuse' && m.mountPoint.includes(`/${node}/`));
      assert.deepEqual(left, [], `nothing of ${node}'s mounts is left after a kill at ${delayMs} ms`);
    }
    assert.equal((await call(node, 'mount', podDir(node), options(node))).status, 'Success');
  });

  it(
    'a mount SIGKILLed between its grant and its mount leaves a marker, and the agent releases that hold; one killed after its mount keeps it',
    { timeout: 180_000 },
    async () => {
      const node = 'node-c';
      const pv = 'pv-killed';
      const pod = podDir(node, pv);
      const opts = JSON.stringify({ ...(JSON.parse(options(node)) as object), 'kubernetes.io/pvOrVolumeName': pv });
      const staging = join(stateDir, 'staging', node, pv);
      const marker = join(stateDir, 'holds-to-check', node, pv);
      const ctx = createContext(parseConfig(JSON.parse(readFileSync(configs.admin ?? '', 'utf8')), 'test'));
      const phase = async () => (await ctx.ledger.get(pv))?.status.nodes[node]?.phase;
      const mountedHere = async () => (await readMountInfo()).some((m) => m.mountPoint === staging && m.fsType === 'fuse.ceph-fuse');
      // A ceph-fuse first on the call's PATH that says where it is (its pid in a file) and then waits: "never" before
      // mounting anything, "after" once the real ceph-fuse has mounted (the call then waits for it to exit).
      const realFuse = (await run('sh', ['-c', 'command -v ceph-fuse'])).stdout.trim();
      const wrapper = (mode: 'never' | 'after') => {
        const dir = join(ceph.dir, `fuse-${mode}`);
        mkdirSync(dir, { recursive: true });
        const pidFile = join(dir, 'pid');
        rmSync(pidFile, { force: true });
        const mountFirst = mode === 'after' ? `${realFuse} "$@" || exit 1\n` : '';
        writeFileSync(join(dir, 'ceph-fuse'), `#!/bin/sh\n${mountFirst}echo $$ > ${pidFile}\nexec sleep 120\n`, { mode: 0o755 });
        return { env: { PATH: `${dir}:${process.env.PATH ?? ''}` }, pidFile };
      };
      const killMountAt = async (mode: 'never' | 'after') => {
        const { env, pidFile } = wrapper(mode);
        const child = spawn(LATCH, ['mount', pod, opts], { env: { ...process.env, ...env, LATCH_CONFIG: configs[node] }, stdio: 'ignore' });
        const exited = new Promise((r) => child.once('exit', r));
        for (let i = 0; i < 600 && !existsSync(pidFile); i++) await new Promise((r) => setTimeout(r, 100));
        if (!existsSync(pidFile)) {
          const log = existsSync(join(ceph.dir, node, 'latch.log')) ? readFileSync(join(ceph.dir, node, 'latch.log'), 'utf8') : '';
          const ps = (await run('ps', ['-eo', 'pid,ppid,stat,wchan:24,args'])).stdout
            .split('\n')
            .filter((l) => /bin\/latch|ceph-fuse|\/ceph /.test(l))
            .join('\n');
          assert.fail(`the mount did not reach its ceph-fuse (${mode}): ${log.split('\n').slice(-2).join('\n')}\n${ps}`);
        }
        child.kill('SIGKILL');
        await exited;
        process.kill(Number(readFileSync(pidFile, 'utf8').trim()), 'SIGKILL');
      };

      // The subvolume first (the manager may take its time on a busy machine): the kills below are about the mount.
      const created = await adminUntilDone('volume', 'create', pv, '--size', '64Mi', '--shared');
      assert.equal(created.code, 0, created.out);
      // 1. Killed between the grant and the mount: attaching, the marker left, nothing mounted.
      await killMountAt('never');
      assert.equal(await phase(), 'attaching');
      assert.ok(existsSync(marker), 'the killed call left its hold-to-check marker');
      assert.equal(await mountedHere(), false);
      const agent = await admin(node, 'agent', '--once');
      assert.equal(agent.code, 0, agent.out);
      assert.equal(await phase(), 'granted', "the agent released the hold on the node's own evidence (the pod's ticket keeps the grant)");
      assert.match(JSON.stringify((await ctx.ledger.get(pv))?.status.automatic), /its hold was released/);

      // 2. The same, released by the node's next call (for any volume) through the marker.
      await killMountAt('never');
      assert.equal(await phase(), 'attaching');
      assert.ok(existsSync(marker));
      const other = await call(node, 'unmount', join(ceph.dir, 'kubelet', node, 'pods', 'uid-none', 'volumes', 'latch~latch', 'pv-none'));
      assert.equal(other.status, 'Success', other.message);
      assert.equal(await phase(), 'granted', 'the next call released the marked hold');
      assert.ok(!existsSync(marker), 'and removed the marker');

      // 3. Killed after the mount, before its record: the agent keeps the hold with its live mount.
      await killMountAt('after');
      assert.equal(await phase(), 'attaching');
      assert.equal(await mountedHere(), true, 'the killed call left its mount');
      const kept = await admin(node, 'agent', '--once');
      assert.equal(kept.code, 0, kept.out);
      assert.equal(await phase(), 'attaching', 'the agent keeps a hold whose mount is live');
      // kubelet's retry finds the mount and records it; the unmount takes everything down.
      const again = await call(node, 'mount', pod, opts);
      assert.equal(again.status, 'Success', again.message);
      assert.equal(await phase(), 'attached');
      assert.equal((await call(node, 'unmount', pod)).status, 'Success');
      assert.equal(await phase(), undefined);
      assert.equal(await mountedHere(), false);
      const removed = await adminUntilDone('volume', 'delete', pv);
      assert.equal(removed.code, 0, removed.out);
    },
  );

  it('a SIGSTOPped ceph-fuse never holds an unmount past its deadline', { timeout: 120_000 }, async () => {
    const node = 'node-c';
    const staging = join(stateDir, 'staging', node, PV);
    const { stdout } = await run('pgrep', ['-f', `ceph-fuse.*${staging}`], { okExitCodes: [1] });
    const pid = Number(stdout.trim().split('\n')[0]);
    assert.ok(pid > 0, 'node-c has a ceph-fuse for the volume');
    process.kill(pid, 'SIGSTOP');
    try {
      const started = Date.now();
      const reply = await call(node, 'unmount', podDir(node));
      const ms = Date.now() - started;
      // commandTimeout 8 s: the guard aborts the connection then, and the unmount finishes.
      assert.ok(ms < 40_000, `unmount took ${ms} ms`);
      assert.equal(reply.status, 'Success', reply.message);
      assert.ok(!(await readMountInfo()).some((m) => m.mountPoint === staging || m.mountPoint === podDir(node)));
    } finally {
      try {
        process.kill(pid, 'SIGKILL');
        process.kill(pid, 'SIGCONT');
      } catch {
        // gone
      }
    }
  });

  /**
   * node-a appends to a file node-b has seen, node-b and node-c write files of their own (`prefix`-NODE-N), and node-a
   * is fenced 1 s in. Returns the fence's output and `landed()`: once every writer is done, it checks that node-a's
   * writes failed and that none written after the fence landed (what node-b reads 1.5 s after it is all there is),
   * and returns the lines node-b reads.
   */
  async function fenceNodeAWhileAllWrite(
    file: string,
    prefix: string,
  ): Promise<{ fenced: { out: string }; landed: () => Promise<string[]> }> {
    const marker = join(podDir('node-a'), file);
    const seen = join(podDir('node-b'), file);
    await sh(`echo "a 0" > "${marker}"; sync "${marker}"`);
    for (let i = 0; i < 40 && !existsSync(seen); i++) await new Promise((r) => setTimeout(r, 250));
    assert.ok(existsSync(seen), "node-b sees node-a's file before the fence");
    const writerA = spawn(
      'sh',
      [
        '-c',
        `i=0; while [ $i -lt 400 ]; do i=$((i+1)); echo "a $i" >> "${marker}" && sync "${marker}" || echo "fail $i" >&2; sleep 0.05; done`,
      ],
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
    let errors = '';
    writerA.stderr.on('data', (chunk: Buffer) => (errors += chunk.toString()));
    const exited = new Promise<void>((r) => writerA.once('exit', () => r()));
    const others = Promise.all(
      ['node-b', 'node-c'].map((n) =>
        sh(
          `for i in $(seq 1 30); do echo "${n} $i" > "${podDir(n)}/${prefix}-${n}-$i"; sync "${podDir(n)}/${prefix}-${n}-$i"; sleep 0.05; done`,
        ),
      ),
    );
    await new Promise((r) => setTimeout(r, 1_000));
    const fenced = await admin('admin', 'node', 'fence', 'node-a', '--volume', PV);
    assert.equal(fenced.code, 0, fenced.out);
    const landed = async () => {
      await new Promise((r) => setTimeout(r, 1_500));
      const atFence = (await sh(`wc -l < "${seen}"`)).stdout.trim();
      await exited;
      await others;
      assert.match(errors, /fail/, "node-a's writes fail once it is fenced");
      const atEnd = (await sh(`wc -l < "${seen}"`)).stdout.trim();
      assert.equal(atEnd, atFence, "none of node-a's writes after the fence landed");
      assert.ok(Number(atEnd) < 400, `node-a's writer was cut off (${atEnd} lines of 401 landed)`);
      return (await sh(`cat "${seen}"`)).stdout.trim().split('\n');
    };
    return { fenced, landed };
  }

  it(
    'fencing node-a while all write: its hold goes only once confirmed, and none of its late writes land',
    { timeout: 180_000 },
    async () => {
      const node = 'node-c';
      const mounted = await mountUntilDone(node);
      assert.equal(mounted.status, 'Success', mounted.message);
      // All three write; node-a's writer keeps writing through the fence, to a file node-b has seen before it.
      const { fenced, landed } = await fenceNodeAWhileAllWrite('late', 'w');
      assert.match(fenced.out, /fenced off/);
      // What landed is a prefix of what node-a wrote, in order.
      (await landed()).forEach((line, i) => assert.equal(line, `a ${i}`));
      assert.equal(readdirSync(podDir('node-c')).filter((n) => n.startsWith('w-')).length, 60, 'node-b and node-c kept writing');
      // node-a is not granted the volume again until it has cleared its old mount: its unmount does that.
      const unmounted = await call('node-a', 'unmount', podDir('node-a'));
      assert.equal(unmounted.status, 'Success', unmounted.message);
      const back = await mountUntilDone('node-a');
      assert.equal(back.status, 'Success', back.message);
      assert.ok(readdirSync(podDir('node-a')).length > 60);
    },
  );

  it(
    'fencing node-a when the ledger lost its client record: its session is found on the MDS, cut off, and the others keep writing',
    { timeout: 180_000 },
    async () => {
      // node-a's ceph-fuse, as its admin socket names it; then its record goes from the ledger (a crash between its
      // mount and the record, or a hostile edit). node-b and node-c keep theirs (entity:ID@IP:PORT/NONCE).
      const asok = join(ceph.dir, 'mnt', 'node-a', 'cephfs', `${PV}.asok`);
      const status = JSON.parse((await run('ceph', ['--admin-daemon', asok, 'status'], { timeoutMs: 10_000 })).stdout) as {
        addr_str: string;
      };
      const real = status.addr_str;
      const ctx = createContext(parseConfig(JSON.parse(readFileSync(configs.admin ?? '', 'utf8')), 'test'));
      const before = await ctx.ledger.get(PV);
      for (const n of ['node-b', 'node-c'])
        assert.match(before?.status.nodes[n]?.client ?? '', new RegExp(`^entity:latch-${n}@[0-9.]+:[0-9]+/[0-9]+$`));
      assert.equal(before?.status.nodes['node-a']?.client, `entity:latch-node-a@${real}`);
      await ctx.ledger.update(PV, (d) => {
        const next = structuredClone(d);
        if (next?.status.nodes['node-a']) delete next.status.nodes['node-a'].client;
        return next;
      });
      assert.equal((await ctx.ledger.get(PV))?.status.nodes['node-a']?.client, undefined);
      const { landed } = await fenceNodeAWhileAllWrite('late-2', 'x');
      const after = await ctx.ledger.get(PV);
      assert.ok(after?.status.fences?.['node-a']?.clients.includes(real), `the fence names node-a's ceph-fuse ${real}`);
      assert.deepEqual(after?.status.currentNodes, ['node-b', 'node-c'], 'node-a lost its hold, the others kept theirs');
      await landed();
      assert.equal(readdirSync(podDir('node-b')).filter((n) => n.startsWith('x-')).length, 60, 'node-b and node-c kept writing');
      // Their sessions are untouched: the blocklist names none of their instances.
      const listed = await ceph.ceph(['osd', 'blocklist', 'ls']);
      const blocklist = listed.stdout + listed.stderr;
      for (const n of ['node-b', 'node-c']) {
        const address = /@(.+)$/.exec(after?.status.nodes[n]?.client ?? '')?.[1] ?? 'none';
        assert.ok(!blocklist.includes(address), `${n}'s ${address} is not blocklisted`);
      }
      // node-a comes back as before: its unmount clears the fence, and it mounts again.
      const unmounted = await call('node-a', 'unmount', podDir('node-a'));
      assert.equal(unmounted.status, 'Success', unmounted.message);
      const back = await mountUntilDone('node-a');
      assert.equal(back.status, 'Success', back.message);
    },
  );

  it(
    'a snapshot is a CephFS subvolume snapshot taken by the agent beside the pods: point in time, listed, deleted',
    { timeout: 120_000 },
    async () => {
      const file = join(podDir('node-b'), 'snap-me');
      await sh(`echo before > "${file}"; sync "${file}"`);
      // A snapshot ticket for node-b, taken by node-b's agent (one pass) while node-b's pod keeps the volume.
      const asked = await admin('node-b', 'snapshot', 'create', PV, 's1', '--no-wait');
      assert.equal(asked.code, 0, asked.out);
      const agent = await admin('node-b', 'agent', '--once');
      assert.equal(agent.code, 0, agent.out);
      const inspected = JSON.parse((await admin('admin', 'volume', 'inspect', PV, '-o', 'json')).out) as {
        spec: { tickets: Record<string, { type: string }> };
        status: { jobs?: { status: { state: string; message: string } }[]; currentNodes: string[] };
      };
      const job = inspected.status.jobs?.at(-1);
      assert.equal(job?.status.state, 'succeeded', job?.status.message);
      assert.match(job?.status.message ?? '', /snapshot s1 of shared volume pv-shared created/);
      assert.deepEqual(
        Object.values(inspected.spec.tickets).map((t) => t.type),
        ['workload', 'workload', 'workload'],
        'the snapshot ticket is finished; the pods keep theirs',
      );
      assert.deepEqual(inspected.status.currentNodes, ['node-a', 'node-b', 'node-c'], 'no node lost the volume');
      await sh(`echo after > "${file}"; sync "${file}"`);
      // The snapshot shows in the subvolume's .snap as _s1_<inode>, with the content of the moment it was cut.
      const entry = readdirSync(join(podDir('node-a'), '.snap')).find((n) => n.includes('s1'));
      assert.ok(entry, 'the snapshot shows under .snap');
      const { stdout } = await sh(`cat "${join(podDir('node-a'), '.snap', entry, 'snap-me')}"`);
      assert.equal(stdout.trim(), 'before');
      const again = await admin('node-b', 'snapshot', 'create', PV, 's1');
      assert.notEqual(again.code, 0, 'a taken name is refused');
      const listed = JSON.parse((await admin('admin', 'snapshot', 'list', PV, '-o', 'json')).out) as { name: string; sharing: string }[];
      assert.deepEqual(
        listed.map((l) => [l.name, l.sharing]),
        [['s1', 'native']],
      );
      const deleted = await admin('admin', 'snapshot', 'delete', PV, 's1');
      assert.equal(deleted.code, 0, deleted.out);
      assert.deepEqual(JSON.parse((await admin('admin', 'snapshot', 'list', PV, '-o', 'json')).out), []);
    },
  );

  it('every node unmounts; the volume is free, and delete removes its subvolume', { timeout: 120_000 }, async () => {
    for (const node of NODES) assert.equal((await call(node, 'unmount', podDir(node))).status, 'Success');
    const doc = JSON.parse((await admin('admin', 'volume', 'inspect', PV, '-o', 'json')).out) as { status: { state: string } };
    assert.equal(doc.status.state, 'detached');
    assert.deepEqual(
      (await readMountInfo()).filter((m) => m.fsType === 'fuse.ceph-fuse'),
      [],
      'no ceph-fuse mount is left',
    );
    const removed = await adminUntilDone('volume', 'delete', PV);
    assert.equal(removed.code, 0, removed.out);
    const info = await ceph.ceph(['fs', 'subvolume', 'info', 'cephfs', PV, '--group_name', 'latch'], { okExitCodes: [2] });
    assert.equal(info.exitCode, 2, 'the subvolume is gone');
  });
});
