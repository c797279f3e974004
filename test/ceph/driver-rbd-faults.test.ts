// Faults under the driver (bin/latch, from `npm run build`) with the rbd backend, on a real one-host Ceph cluster:
// the OSD stopped (SIGSTOP) during attach, detach and I/O; the monitor restarted between and during calls; a driver
// process SIGKILLed mid-attach; an rbd-fuse daemon that hangs (SIGSTOP: its mount stops answering, as a fenced
// one's metadata does). Every call must print one JSON reply and nothing on stderr, succeed or fail within a bound
// (CALL_BOUND_MS, from a small commandTimeout), and the same calls repeated once the fault ends must succeed, with
// the data written before the fault intact and nothing of the mapping left after the final unmountdevice.
// The bound is a hang check, not a performance figure. Needs root, Debian's ceph packages and bin/latch.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, it, type TestContext } from 'node:test';
import { rbdFusePids } from '../../src/sys/fuse.js';
import { listLoopDevices } from '../../src/sys/loop.js';
import { readMountInfo } from '../../src/sys/mounts.js';
import { run } from '../../src/sys/run.js';
import { cephSkipReason, procStat, startCephCluster, type CephCluster } from '../ceph/cluster.js';

const REPO = resolve(__dirname, '../..');
const LATCH = join(REPO, 'bin/latch');
const skip = cephSkipReason() ?? (existsSync(LATCH) ? undefined : 'bin/latch is missing: run npm run build first');

// Every step of a call that can wait on the cluster or a FUSE mount ends at commandTimeout (4 s later when its child
// is stuck in the kernel and must be abandoned); a stalled call fails at the first such step and then cleans up with
// short, fixed deadlines (abort, kill by PID, umount). The bound leaves room for two stalled steps and the cleanup.
const COMMAND_TIMEOUT_S = 10;
const CALL_BOUND_MS = 2 * COMMAND_TIMEOUT_S * 1000 + 15_000;
// How often a call is repeated after a fault ends before the test calls it stuck.
const MAX_ATTEMPTS = 5;
const NODES = ['node-a', 'node-b'] as const;
type Node = (typeof NODES)[number];

interface Reply {
  status: string;
  message?: string;
  device?: string;
}

interface CallResult {
  reply: Reply;
  /** The call's own duration, from its log line. */
  durationMs: number;
}

/** A driver call under way. */
interface Started {
  pid: number;
  /** When it started, in clock ticks since boot (/proc/PID/stat's field 22). */
  startTicks: number;
  done: Promise<CallResult>;
}

/** A process's start time in clock ticks since boot, or undefined once it is gone. */
function startTicks(pid: number): number | undefined {
  const started = procStat(pid)?.[19];
  return started === undefined ? undefined : Number(started);
}

describe('the driver with the rbd backend under faults', { skip }, () => {
  let ceph: CephCluster;
  const configs = {} as Record<Node, string>;
  const mountDirs = {} as Record<Node, string>;
  const logFiles = {} as Record<Node, string>;

  before(
    async () => {
      ceph = await startCephCluster();
      const stateDir = join(ceph.dir, 'latch-state');
      for (const node of NODES) {
        const client = await ceph.createClient(`latch-${node}`);
        mountDirs[node] = join(ceph.dir, 'mnt', node);
        logFiles[node] = join(ceph.dir, node, 'latch.log');
        const config = {
          nodeName: node,
          oneHost: true, // the simulated nodes share this host's file store
          poolDir: join(ceph.dir, node, 'pool'),
          stateDir,
          logFile: logFiles[node],
          maxSize: '4Gi',
          waitForAttachTimeout: 5,
          commandTimeout: COMMAND_TIMEOUT_S,
          backend: {
            type: 'rbd',
            pool: ceph.pool,
            cephConf: client.confPath,
            clientId: client.id,
            keyring: client.keyringPath,
            mountDir: mountDirs[node],
          },
        };
        mkdirSync(join(ceph.dir, node), { recursive: true });
        configs[node] = join(ceph.dir, node, 'config.json');
        writeFileSync(configs[node], JSON.stringify(config, null, 2));
      }
      for (const node of NODES) await call(node, ['init']);
    },
    { timeout: 120_000 },
  );

  after(async () => {
    await ceph?.stop();
  });

  /**
   * Starts one driver call as `node`. The reply must be exactly one JSON object on stdout with nothing on stderr, and
   * it must come within CALL_BOUND_MS (the test kills the call a little later, so that a hang fails the test rather
   * than stalling it).
   */
  function start(node: Node, args: string[], extraEnv: NodeJS.ProcessEnv = {}): Started {
    const started = performance.now();
    const child = spawn(LATCH, args, {
      env: { ...process.env, LATCH_CONFIG: configs[node], ...extraEnv },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const killer = setTimeout(() => child.kill('SIGKILL'), CALL_BOUND_MS + 30_000);
    const pid = child.pid;
    assert.ok(pid !== undefined, 'bin/latch started');
    // Read now: the forked child exists (its start time is set at fork) until the test has waited for it.
    const ticks = startTicks(pid);
    assert.ok(ticks !== undefined, 'the start time of the call');
    const done = new Promise<CallResult>((resolveDone, reject) => {
      child.once('error', reject);
      child.once('close', (code, signal) => {
        clearTimeout(killer);
        const elapsed = Math.round(performance.now() - started);
        try {
          const what = `${args[0]} on ${node}`;
          assert.equal(signal, null, `${what} was killed by ${signal} after ${elapsed} ms (stdout ${JSON.stringify(stdout)})`);
          assert.equal(stderr, '', `${what} wrote to stderr`);
          assert.equal(stdout.trim().split('\n').length, 1, `${what} printed one line: ${JSON.stringify(stdout)}`);
          const reply = JSON.parse(stdout) as Reply;
          assert.ok(reply.status === 'Success' || reply.status === 'Failure', `${what}: ${stdout}`);
          assert.equal(code, reply.status === 'Success' ? 0 : 1, `${what}: exit code ${code} for ${stdout}`);
          const durationMs = callDuration(node, pid);
          assert.ok(durationMs < CALL_BOUND_MS, `${what} took ${durationMs} ms, over the bound of ${CALL_BOUND_MS} ms: ${stdout}`);
          resolveDone({ reply, durationMs });
        } catch (err) {
          reject(err instanceof Error ? err : new Error(String(err)));
        }
      });
    });
    return { pid, startTicks: ticks, done };
  }

  /** The duration the call with `pid` logged for itself. */
  function callDuration(node: Node, pid: number): number {
    const lines = readFileSync(logFiles[node], 'utf8').trim().split('\n');
    for (const line of lines.reverse()) {
      const entry = JSON.parse(line) as { pid?: number; durationMs?: number };
      if (entry.pid === pid && typeof entry.durationMs === 'number') return entry.durationMs;
    }
    assert.fail(`no log line for call ${pid} in ${logFiles[node]}`);
  }

  async function call(node: Node, args: string[]): Promise<CallResult> {
    return start(node, args).done;
  }

  /** A call that must succeed. */
  async function ok(node: Node, args: string[]): Promise<Reply> {
    const { reply } = await call(node, args);
    assert.equal(reply.status, 'Success', `${args.join(' ')} on ${node}: ${JSON.stringify(reply)}`);
    return reply;
  }

  /** A call that must fail (cleanly: start() checked the reply and the bound). */
  async function fails(t: TestContext, node: Node, args: string[], why: string): Promise<CallResult> {
    const result = await call(node, args);
    assert.equal(result.reply.status, 'Failure', `${args[0]} on ${node} ${why}, yet: ${JSON.stringify(result.reply)}`);
    t.diagnostic(`${args[0]} on ${node} ${why}: Failure after ${result.durationMs} ms: ${result.reply.message}`);
    return result;
  }

  /**
   * Repeats a call, as kubelet does, until it succeeds: every attempt must reply cleanly within the bound, and it must
   * succeed within MAX_ATTEMPTS (or the `maxAttempts` given).
   */
  async function converge(t: TestContext, node: Node, args: string[], maxAttempts = MAX_ATTEMPTS): Promise<Reply & { attempts: number }> {
    for (let attempt = 1; ; attempt++) {
      const { reply, durationMs } = await call(node, args);
      if (reply.status === 'Success') return { ...reply, attempts: attempt };
      t.diagnostic(`${args[0]} on ${node}, attempt ${attempt}: Failure after ${durationMs} ms: ${reply.message}`);
      assert.ok(attempt < maxAttempts, `${args[0]} on ${node} still fails after ${attempt} attempts: ${reply.message}`);
      await sleep(1_000);
    }
  }

  function volumeOptions(pv: string): string {
    return JSON.stringify({
      'kubernetes.io/fsType': '',
      'kubernetes.io/pvOrVolumeName': pv,
      'kubernetes.io/readwrite': 'rw',
      size: '128Mi',
    });
  }

  function globalPath(node: Node, pv: string): string {
    const path = join(ceph.dir, `kubelet-${node}`, 'plugins/kubernetes.io/flexvolume/latch/rbd/mounts', pv);
    mkdirSync(path, { recursive: true, mode: 0o750 });
    return path;
  }

  /** attach + waitforattach + mountdevice; returns the device and the mount path. */
  async function mountOn(node: Node, pv: string): Promise<{ device: string; path: string }> {
    await ok(node, ['attach', volumeOptions(pv), node]);
    const { device } = await ok(node, ['waitforattach', '', volumeOptions(pv)]);
    assert.match(device ?? '', /^\/dev\/loop[0-9]+$/);
    const path = globalPath(node, pv);
    await ok(node, ['mountdevice', path, device ?? '', volumeOptions(pv)]);
    return { device: device ?? '', path };
  }

  /** unmountdevice + detach, then nothing of the node's mapping may be left. */
  async function releaseOn(node: Node, pv: string): Promise<void> {
    await ok(node, ['unmountdevice', globalPath(node, pv)]);
    await ok(node, ['detach', pv, node]);
    await assertNothingLeft(node);
  }

  /** What the kernel shows of `node`'s rbd mappings: rbd-fuse processes, FUSE mounts, loop devices. */
  async function mappings(node: Node): Promise<{ pids: number[]; mounts: string[]; loops: string[] }> {
    const dir = `${mountDirs[node]}/`;
    const pids: number[] = [];
    for (const entry of readdirSync('/proc')) {
      if (!/^[0-9]+$/.test(entry)) continue;
      let argv: string[];
      try {
        argv = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0');
        const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
        if (/^[ZX]/.test(stat.slice(stat.lastIndexOf(')') + 2))) continue;
      } catch {
        continue;
      }
      if (basename(argv[0] ?? '') === 'rbd-fuse' && argv.some((a) => a.startsWith(dir))) pids.push(Number(entry));
    }
    const mounts = (await readMountInfo()).filter((m) => m.mountPoint.startsWith(dir)).map((m) => m.mountPoint);
    const loops = (await listLoopDevices()).filter((l) => l.backingFile.startsWith(dir)).map((l) => l.device);
    return { pids, mounts, loops };
  }

  async function assertNothingLeft(node: Node): Promise<void> {
    assert.deepEqual(await mappings(node), { pids: [], mounts: [], loops: [] }, `nothing of ${node}'s rbd mappings is left`);
  }

  /** Exactly one rbd-fuse, one FUSE mount and one loop device for `pv` on `node`. */
  async function assertOneMapping(node: Node, pv: string): Promise<void> {
    const m = await mappings(node);
    const mountPoint = join(mountDirs[node], pv);
    assert.equal(m.pids.length, 1, `one rbd-fuse for ${pv}: ${JSON.stringify(m)}`);
    assert.deepEqual(m.mounts, [mountPoint], `one FUSE mount for ${pv}`);
    assert.equal(m.loops.length, 1, `one loop device for ${pv}: ${JSON.stringify(m)}`);
  }

  /**
   * The fault ends when the cluster serves again: an OSD resumed after a long stop can take a while (once, after a
   * 14-s stop, a fresh client's `rbd info` still timed out at 10 s), and once (a CI run of 2026-11-26) it had not
   * served 90 s later, which failed every test after it. Waits until `rbd ls` (which reads from the OSD) answers. An
   * OSD that still does not after 45 s is restarted, as an operator would, and the test says so with the daemons'
   * logs: what these tests check is latch's side of an OSD that comes back, not how this one-host cluster recovers
   * from SIGSTOP.
   */
  async function clusterServes(t: TestContext): Promise<void> {
    const since = performance.now();
    let restarted = false;
    for (;;) {
      try {
        await ceph.rbd(['ls', ceph.pool], { timeoutMs: 5_000 });
        break;
      } catch (err) {
        const waited = Math.round(performance.now() - since);
        if (!restarted && waited > 45_000) {
          t.diagnostic(`the cluster did not serve ${waited} ms after the fault ended; restarting the OSD. ${ceph.describe()}`);
          restarted = true;
          await ceph.restart('osd');
        } else if (waited > 150_000) {
          throw new Error(`the cluster did not serve again within 150 s, an OSD restart included\n${ceph.describe()}`, { cause: err });
        }
      }
    }
    const ms = Math.round(performance.now() - since);
    if (ms > 1_000) t.diagnostic(`the cluster served again after ${ms} ms`);
  }

  /** The addresses of the image's watchers (rbd status, as the admin). */
  async function watchers(image: string): Promise<string[]> {
    const { stdout } = await ceph.rbd(['status', '--format', 'json', `${ceph.pool}/${image}`]);
    return ((JSON.parse(stdout) as { watchers?: { address: string }[] }).watchers ?? []).map((w) => w.address);
  }

  /**
   * Polls every few ms until `ready` says so; for catching a call at one step. With `during`, fails at once, with its
   * reply, if that call ended without the step being seen.
   */
  async function whenSeen(
    what: string,
    ready: () => Promise<boolean> | boolean,
    { during, timeoutMs = 30_000 }: { during?: Started; timeoutMs?: number } = {},
  ): Promise<void> {
    let ended: string | undefined;
    during?.done.then(
      ({ reply }) => (ended = JSON.stringify(reply)),
      (err: unknown) => (ended = String(err)),
    );
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const endedBefore = ended;
      if (await ready()) return;
      if (endedBefore !== undefined) assert.fail(`never saw ${what}: the call ended first: ${endedBefore}`);
      if (Date.now() > deadline) assert.fail(`never saw ${what}`);
      await sleep(5);
    }
  }

  /**
   * Processes running `name` with an argument containing `argIncludes` that started no earlier than `call`. By start
   * time, not by pid: pids wrap around (at 32768 here), and once a CI run's rbd-fuse got a pid below its call's.
   */
  function processesNamed(name: string, argIncludes: string, call: Started): number[] {
    const pids: number[] = [];
    for (const entry of readdirSync('/proc')) {
      if (!/^[0-9]+$/.test(entry)) continue;
      try {
        const argv = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0');
        if (!argv.some((a) => basename(a) === name) || !argv.some((a) => a.includes(argIncludes))) continue;
        if ((startTicks(Number(entry)) ?? -1) >= call.startTicks) pids.push(Number(entry));
      } catch {
        // gone
      }
    }
    return pids;
  }

  /** A file's contents read with O_DIRECT-free plain reads: the page cache was dropped by the remount in between. */
  function readData(path: string, file: string): string {
    return readFileSync(join(path, file), 'utf8');
  }

  it('the OSD stopped while waitforattach starts rbd-fuse: the call fails in time, leaves nothing, and the repeat mounts the data', async (t) => {
    const pv = 'pv-osd-attach';
    const { path } = await mountOn('node-a', pv);
    writeFileSync(join(path, 'before.txt'), 'written before the fault\n');
    await releaseOn('node-a', pv);

    await ok('node-a', ['attach', volumeOptions(pv), 'node-a']);
    const attaching = start('node-a', ['waitforattach', '', volumeOptions(pv)]);
    await whenSeen('rbd-fuse starting', () => processesNamed('rbd-fuse', join(mountDirs['node-a'], pv), attaching).length > 0, {
      during: attaching,
    });
    ceph.pause('osd');
    let result: CallResult;
    try {
      result = await attaching.done;
    } finally {
      ceph.resume('osd');
    }
    await clusterServes(t);
    assert.equal(result.reply.status, 'Failure', `waitforattach with the OSD stopped: ${JSON.stringify(result.reply)}`);
    t.diagnostic(`waitforattach with the OSD stopped: Failure after ${result.durationMs} ms: ${result.reply.message}`);
    await assertNothingLeft('node-a');

    const { device } = await ok('node-a', ['waitforattach', '', volumeOptions(pv)]);
    await assertOneMapping('node-a', pv);
    await ok('node-a', ['mountdevice', path, device ?? '', volumeOptions(pv)]);
    assert.equal(readData(path, 'before.txt'), 'written before the fault\n');
    await releaseOn('node-a', pv);
  });

  it('the OSD stopped before waitforattach of a new volume: rbd info times out, the call fails in time, the repeat succeeds', async (t) => {
    const pv = 'pv-osd-new';
    await ok('node-a', ['attach', volumeOptions(pv), 'node-a']);
    ceph.pause('osd');
    try {
      await fails(t, 'node-a', ['waitforattach', '', volumeOptions(pv)], 'with the OSD stopped');
    } finally {
      ceph.resume('osd');
    }
    await clusterServes(t);
    await assertNothingLeft('node-a');
    const { device } = await ok('node-a', ['waitforattach', '', volumeOptions(pv)]);
    const path = globalPath('node-a', pv);
    await ok('node-a', ['mountdevice', path, device ?? '', volumeOptions(pv)]);
    writeFileSync(join(path, 'data.txt'), 'ok\n');
    await releaseOn('node-a', pv);
  });

  it('the OSD stopped during unmountdevice: the call fails in time; once it resumes the repeat releases everything', async (t) => {
    const pv = 'pv-osd-detach';
    const { path } = await mountOn('node-a', pv);
    writeFileSync(join(path, 'before.txt'), 'written before the fault\n');
    ceph.pause('osd');
    try {
      await fails(t, 'node-a', ['unmountdevice', path], 'with the OSD stopped');
    } finally {
      ceph.resume('osd');
    }
    await clusterServes(t);
    // kubelet repeats it for as long as it fails. How long rbd-fuse's writes held by the stopped OSD take to land once
    // it resumes is Ceph's recovery on two busy cores: most runs succeed at the first attempt, one took more than 5.
    const { attempts } = await converge(t, 'node-a', ['unmountdevice', path], 20);
    t.diagnostic(`unmountdevice after the OSD resumed: Success at attempt ${attempts}`);
    await releaseOn('node-a', pv);

    // The data is in the image: node-b mounts it.
    const b = await mountOn('node-b', pv);
    assert.equal(readData(b.path, 'before.txt'), 'written before the fault\n');
    await releaseOn('node-b', pv);
  });

  it('the OSD stopped under a writer: its writes wait, then complete; fsck passes and every acknowledged write is there', async (t) => {
    const pv = 'pv-osd-io';
    const { path } = await mountOn('node-a', pv);
    const file = join(path, 'log.txt');
    // Appends numbered lines, fdatasync after each, and reports each one acknowledged.
    const script =
      `const fs = require('fs'); const fd = fs.openSync(${JSON.stringify(file)}, 'a');` +
      `for (let i = 0; i < 60; i++) { fs.writeSync(fd, 'line ' + i + '\\n'); fs.fdatasyncSync(fd); process.stdout.write(i + '\\n');` +
      ` Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 50); }`;
    const writer = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'pipe'] });
    const acks: number[] = [];
    let writerErr = '';
    writer.stdout.setEncoding('utf8').on('data', (d: string) => acks.push(...d.trim().split('\n').map(Number)));
    writer.stderr.setEncoding('utf8').on('data', (d: string) => (writerErr += d));
    const exited = new Promise<number | null>((r) => writer.once('exit', (code) => r(code)));
    await whenSeen('the writer under way', () => acks.length >= 10);
    ceph.pause('osd');
    let duringPause: number;
    try {
      await sleep(1_000);
      const stalled = acks.length;
      await sleep(4_000);
      duringPause = acks.length - stalled;
    } finally {
      ceph.resume('osd');
    }
    await clusterServes(t);
    assert.equal(duringPause, 0, 'no write was acknowledged while the OSD was stopped');
    const code = await exited;
    t.diagnostic(`writer: exit ${code}, ${acks.length} lines acknowledged${writerErr ? `, ${writerErr.trim()}` : ''}`);
    assert.equal(code, 0, `the writer's writes completed after the OSD resumed: ${writerErr}`);
    await releaseOn('node-a', pv);

    await ok('node-b', ['attach', volumeOptions(pv), 'node-b']);
    const { device } = await ok('node-b', ['waitforattach', '', volumeOptions(pv)]);
    await run('e2fsck', ['-f', '-n', device ?? ''], { timeoutMs: 60_000 }); // exit 0: clean
    const b = globalPath('node-b', pv);
    await ok('node-b', ['mountdevice', b, device ?? '', volumeOptions(pv)]);
    const lines = readData(b, 'log.txt').trim().split('\n');
    for (const i of acks) assert.equal(lines[i], `line ${i}`, `acknowledged line ${i} is in the image`);
    await releaseOn('node-b', pv);
  });

  it('the monitor restarted between calls, down during one and killed during another: calls end in time and converge', async (t) => {
    const pv = 'pv-mon';
    const { path } = await mountOn('node-a', pv);
    writeFileSync(join(path, 'before.txt'), 'written before the restart\n');

    // Between calls: the mapped volume keeps working across a monitor restart, and so do the next calls.
    await ceph.restart('mon');
    writeFileSync(join(path, 'after.txt'), 'written after the restart\n');
    await run('sync', ['-f', join(path, 'after.txt')], { timeoutMs: 30_000 });
    await releaseOn('node-a', pv);

    // Down during a call: waitforattach needs it (rbd info) and fails in time, leaving nothing.
    await ok('node-b', ['attach', volumeOptions(pv), 'node-b']);
    await ceph.kill('mon', 'SIGTERM');
    try {
      await fails(t, 'node-b', ['waitforattach', '', volumeOptions(pv)], 'with the monitor down');
    } finally {
      await ceph.start('mon');
    }
    await assertNothingLeft('node-b');

    // Killed while the call talks to it, started again 3 s later: the call ends in time either way.
    const attaching = start('node-b', ['waitforattach', '', volumeOptions(pv)]);
    await whenSeen('rbd running for the call', () => processesNamed('rbd', `${ceph.pool}/${pv}`, attaching).length > 0, {
      during: attaching,
    });
    await ceph.kill('mon', 'SIGKILL');
    await sleep(3_000);
    await ceph.start('mon');
    const result = await attaching.done;
    t.diagnostic(`waitforattach with the monitor killed during it: ${result.reply.status} after ${result.durationMs} ms`);
    await clusterServes(t);

    const { device } = await ok('node-b', ['waitforattach', '', volumeOptions(pv)]);
    await assertOneMapping('node-b', pv);
    const b = globalPath('node-b', pv);
    await ok('node-b', ['mountdevice', b, device ?? '', volumeOptions(pv)]);
    assert.equal(readData(b, 'before.txt'), 'written before the restart\n');
    assert.equal(readData(b, 'after.txt'), 'written after the restart\n');
    await releaseOn('node-b', pv);
  });

  it('waitforattach SIGKILLed while rbd-fuse starts or the loop device is set up: the repeat reuses one mapping', async (t) => {
    const pv = 'pv-sigkill';
    const mountPoint = join(mountDirs['node-a'], pv);
    const steps: [string, (call: Started) => Promise<boolean> | boolean][] = [
      ['rbd-fuse started', (call) => processesNamed('rbd-fuse', mountPoint, call).length > 0],
      ['FUSE mounted', async () => (await readMountInfo()).some((m) => m.mountPoint === mountPoint)],
      ['losetup started', (call) => processesNamed('losetup', mountPoint, call).length > 0],
      ['loop device set up', async () => (await listLoopDevices()).some((l) => l.backingFile.startsWith(`${mountPoint}/`))],
    ];
    // losetup itself runs for a few milliseconds, less than a poll takes on a busy machine: for that step the call runs
    // a losetup that waits a second first (first on its PATH), so that the kill finds it running.
    const slowBin = join(ceph.dir, 'slow-losetup');
    mkdirSync(slowBin, { recursive: true });
    const realLosetup = (await run('sh', ['-c', 'PATH="$PATH:/usr/sbin:/sbin" command -v losetup'])).stdout.trim();
    writeFileSync(join(slowBin, 'losetup'), `#!/bin/sh\nsleep 1\nexec ${realLosetup} "$@"\n`, { mode: 0o755 });
    const slowLosetup = { PATH: `${slowBin}:${process.env.PATH ?? ''}` };
    await ok('node-a', ['attach', volumeOptions(pv), 'node-a']);
    for (const [step, ready] of steps) {
      const attaching = start('node-a', ['waitforattach', '', volumeOptions(pv)], step === 'losetup started' ? slowLosetup : {});
      await whenSeen(step, () => ready(attaching), { during: attaching });
      try {
        process.kill(attaching.pid, 'SIGKILL');
      } catch {
        // it replied and exited first (after the last step, it has little left to do)
      }
      const outcome = await attaching.done.then(
        ({ reply }) => `it finished first (${reply.status})`,
        (err: unknown) => {
          assert.match(String(err), /killed by SIGKILL/);
          return 'killed';
        },
      );
      const left = await mappings('node-a');
      t.diagnostic(`at "${step}": ${outcome}, left ${JSON.stringify(left)}`);
      const { device } = await ok('node-a', ['waitforattach', '', volumeOptions(pv)]);
      await assertOneMapping('node-a', pv);
      assert.equal((await mappings('node-a')).loops[0], device);
      // The repeat of the repeat finds the same device.
      assert.equal((await ok('node-a', ['waitforattach', '', volumeOptions(pv)])).device, device);
      await assertOneMapping('node-a', pv);
      await ok('node-a', ['unmountdevice', globalPath('node-a', pv)]);
      await assertNothingLeft('node-a');
    }
    // The daemon itself killed after the device was set up (its mount stays, dead): the repeat starts over. The killed
    // instance keeps the image's exclusive lock (the reads of the partition scan took it), and a new instance's first
    // I/O waits until the OSD drops the dead one's watch (30 s after its last ping); calls in between fail at their
    // guard (see the hung rbd-fuse below). Once the watch is gone the repeat succeeds at once.
    const { device } = await ok('node-a', ['waitforattach', '', volumeOptions(pv)]);
    const [daemon] = await rbdFusePids(mountPoint);
    assert.ok(daemon !== undefined);
    const [watcher, ...others] = await watchers(pv);
    assert.ok(watcher !== undefined && others.length === 0, 'the daemon is the one watcher of the image');
    process.kill(daemon, 'SIGKILL');
    const since = performance.now();
    await whenSeen('the dead watch expire', async () => !(await watchers(pv)).includes(watcher), { timeoutMs: 60_000 });
    t.diagnostic(`the killed rbd-fuse's watch expired after ${Math.round(performance.now() - since)} ms`);
    const repeated = await ok('node-a', ['waitforattach', '', volumeOptions(pv)]);
    await assertOneMapping('node-a', pv);
    assert.notDeepEqual(await rbdFusePids(mountPoint), [daemon]);
    assert.deepEqual((await mappings('node-a')).loops, [repeated.device]);
    t.diagnostic(`rbd-fuse killed under ${device}: the repeat set up ${repeated.device} over a new one`);
    const path = globalPath('node-a', pv);
    await ok('node-a', ['mountdevice', path, repeated.device ?? '', volumeOptions(pv)]);
    writeFileSync(join(path, 'data.txt'), 'ok\n');
    await releaseOn('node-a', pv);
  });

  it('a hung rbd-fuse (SIGSTOPped) under a mounted filesystem: unmountdevice fails in time, and succeeds once it answers', async (t) => {
    const pv = 'pv-hung-mounted';
    const { path } = await mountOn('node-a', pv);
    writeFileSync(join(path, 'before.txt'), 'written before the hang\n');
    const [pid, ...more] = await rbdFusePids(join(mountDirs['node-a'], pv));
    assert.ok(pid !== undefined && more.length === 0, `one rbd-fuse for ${pv}`);
    process.kill(pid, 'SIGSTOP');
    try {
      await fails(t, 'node-a', ['unmountdevice', path], 'with its rbd-fuse stopped');
    } finally {
      process.kill(pid, 'SIGCONT');
    }
    const { attempts } = await converge(t, 'node-a', ['unmountdevice', path]);
    t.diagnostic(`unmountdevice after rbd-fuse resumed: Success at attempt ${attempts}`);
    await releaseOn('node-a', pv);
    const b = await mountOn('node-b', pv);
    assert.equal(readData(b.path, 'before.txt'), 'written before the hang\n');
    await releaseOn('node-b', pv);
  });

  it('a hung rbd-fuse (SIGSTOPped) after the filesystem is off: unmountdevice aborts it through fusectl, kills it, cleans up', async (t) => {
    const pv = 'pv-hung-fuse';
    const { path } = await mountOn('node-a', pv);
    writeFileSync(join(path, 'before.txt'), 'written before the hang\n');
    // As if the previous unmountdevice had died right after unmounting the filesystem.
    await run('umount', [path], { timeoutMs: 30_000 });
    const [pid, ...more] = await rbdFusePids(join(mountDirs['node-a'], pv));
    assert.ok(pid !== undefined && more.length === 0, `one rbd-fuse for ${pv}`);
    process.kill(pid, 'SIGSTOP');
    try {
      const { reply, durationMs } = await call('node-a', ['unmountdevice', path]);
      t.diagnostic(`unmountdevice of a hung mapping: ${reply.status} after ${durationMs} ms ${reply.message ?? ''}`);
      assert.equal(reply.status, 'Success', JSON.stringify(reply));
    } finally {
      try {
        process.kill(pid, 'SIGCONT');
      } catch {
        // killed, as it should be
      }
    }
    await assertNothingLeft('node-a');
    await ok('node-a', ['detach', pv, 'node-a']);
    // node-a's release broke the lock its killed instance held, but that instance's watch lives on until the OSD times
    // it out (osd_client_watch_timeout, 30 s): until then node-b refuses to map the image read-write (a watcher the
    // ledger does not know of), each call failing at once, and kubelet's retries get it once the watch is gone.
    await ok('node-b', ['attach', volumeOptions(pv), 'node-b']);
    const since = performance.now();
    const { device, attempts } = await converge(t, 'node-b', ['waitforattach', '', volumeOptions(pv)], 60);
    t.diagnostic(`waitforattach on node-b succeeded at attempt ${attempts}, ${Math.round(performance.now() - since)} ms after the kill`);
    const bPath = globalPath('node-b', pv);
    await ok('node-b', ['mountdevice', bPath, device ?? '', volumeOptions(pv)]);
    assert.equal(readData(bPath, 'before.txt'), 'written before the hang\n');
    await releaseOn('node-b', pv);
  });
});
