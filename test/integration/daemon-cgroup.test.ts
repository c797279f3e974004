// The daemon a driver call starts (rbd-fuse, through startDaemon) survives what kills the call's cgroup: a
// `systemctl restart kubelet` kills every process of kubelet's cgroup (KillMode=control-group), and kubelet's calls
// run in it. Here a call runs in a cgroup the test makes, starts a daemon, and the cgroup is killed whole
// (cgroup.kill): the daemon must not have been in it. Needs root and a cgroup v2 hierarchy with cgroup.kill.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, describe, it } from 'node:test';
import { checkDaemonCache, checkDaemonCgroups } from '../../src/doctor/daemons.js';
import type { Finding } from '../../src/doctor/findings.js';
import { cgroupsOf, OWN_CGROUP, serviceOf } from '../../src/sys/cgroup.js';
import { daemonCommand } from '../../src/sys/run.js';

/** Where cgroup v2 is mounted here: /sys/fs/cgroup on a unified host, /sys/fs/cgroup/unified on a hybrid one. */
const v2 = ['/sys/fs/cgroup', '/sys/fs/cgroup/unified'].find((dir) => existsSync(join(dir, 'cgroup.controllers')));
const root = process.getuid?.() === 0;
const skip = !root
  ? 'needs root (it makes cgroups)'
  : v2 === undefined
    ? 'needs a cgroup v2 hierarchy'
    : !existsSync(join(v2, 'cgroup.procs'))
      ? 'the cgroup v2 hierarchy has no cgroup.procs'
      : false;

const work = mkdtempSync(join(tmpdir(), 'latch-cgroup-'));
const made: string[] = [];
const daemons: number[] = [];
after(() => {
  for (const pid of daemons) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone
    }
  }
  for (const dir of made.reverse()) {
    for (let i = 0; i < 50; i++) {
      try {
        rmdirSync(dir);
        break;
      } catch {
        spawnSync('sleep', ['0.05']);
      }
    }
  }
  rmSync(work, { recursive: true, force: true });
});

/** A cgroup of the test's own under the v2 root; removed after the tests. */
function testCgroup(name: string): string {
  const dir = join(v2 as string, name);
  mkdirSync(dir);
  made.push(dir);
  return dir;
}

function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const state = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0];
    return state !== 'Z' && state !== 'X';
  } catch {
    return false;
  }
}

async function until(what: string, ok: () => boolean, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!ok()) {
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

describe('a daemon started by a call outlives the cgroup of the call', { skip }, () => {
  it('is born outside the call cgroup, and survives the call and its whole cgroup being killed', async () => {
    const cgroup = testCgroup(`latch-test-call-${process.pid}`);
    const pidFile = join(work, 'daemon.pid');
    const call = spawn(process.execPath, ['--import', 'tsx', join(__dirname, '../fixtures/daemon-call.ts'), cgroup, pidFile], {
      detached: true,
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const callPid = call.pid as number;
    let out = '';
    call.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
    const exited = new Promise((resolve) => call.once('exit', resolve));
    try {
      await until('the call to start its daemon', () => out.includes('started') || call.exitCode !== null, 30_000);
      assert.equal(out, 'started\n', 'the call started its daemon');
      await until('the daemon to write its pid', () => existsSync(pidFile) && readFileSync(pidFile, 'utf8').endsWith('\n'));
      const daemon = Number(readFileSync(pidFile, 'utf8'));
      daemons.push(daemon);
      const relative = `/${cgroup.slice((v2 as string).length + 1)}`;

      assert.equal(cgroupsOf(callPid)?.get(''), relative, 'the call is back in its own cgroup after the start');
      assert.equal(cgroupsOf(daemon)?.get(''), `/${OWN_CGROUP}`, "the daemon is in latch's cgroup, not the call's");
      if (existsSync('/sys/fs/cgroup/systemd/cgroup.procs')) {
        assert.equal(cgroupsOf(daemon)?.get('name=systemd'), `/${OWN_CGROUP}`, "and in latch's cgroup of v1's name=systemd too");
      }
      assert.deepEqual(readFileSync(join(cgroup, 'cgroup.procs'), 'utf8').trim().split('\n'), [String(callPid)], 'only the call is in it');

      // The call's process group first (a deadline, killAllChildren), then its whole cgroup (a kubelet restart).
      process.kill(-callPid, 'SIGKILL');
      if (existsSync(join(cgroup, 'cgroup.kill'))) writeFileSync(join(cgroup, 'cgroup.kill'), '1');
      await exited;
      await until('the call cgroup to empty', () => readFileSync(join(cgroup, 'cgroup.procs'), 'utf8').trim() === '');
      await sleep(100);
      assert.ok(alive(daemon), 'the daemon survived');
    } finally {
      if (call.exitCode === null && call.signalCode === null) process.kill(-callPid, 'SIGKILL');
    }
  });

  it('doctor names an rbd-fuse in a .service cgroup with its service, and says nothing of one elsewhere', async () => {
    const name = `latch-test-${process.pid}.service`;
    const service = testCgroup(name);
    // A stand-in for an rbd-fuse (its command line is what doctor finds it by) that a service started.
    const child = spawn('sleep', ['600'], { stdio: 'ignore', argv0: 'rbd-fuse' });
    const pid = child.pid as number;
    const findings = async () => {
      const found: Finding[] = [];
      await checkDaemonCgroups((f) => found.push(f));
      return found.filter((f) => f.message.includes(`(pid ${pid},`));
    };
    try {
      assert.equal(serviceOf(pid), serviceOf(process.pid), "a child is in its parent's service, or none");
      if (serviceOf(pid) === undefined) assert.deepEqual(await findings(), [], 'doctor finds nothing to say of it');
      writeFileSync(join(service, 'cgroup.procs'), String(pid));
      assert.equal(serviceOf(pid), name);
      const [finding, ...more] = await findings();
      assert.deepEqual(more, []);
      assert.equal(finding?.severity, 'warning');
      assert.ok(finding?.message.includes(`runs in the cgroup of ${name}: restarting ${name} kills it`), finding?.message);
    } finally {
      child.kill('SIGKILL');
      await new Promise((resolve) => child.once('exit', resolve));
    }
  });
});

describe(
  "doctor's look at librbd's cache in running rbd-fuse daemons",
  { skip: process.platform === 'linux' ? false : 'reads /proc' },
  () => {
    it('warns of an rbd-fuse in the mount dir without --rbd-cache false on its command line, and of nothing else', async () => {
      // Stand-ins for rbd-fuse daemons: what doctor reads is their command line in /proc (the `; :` keeps bash from
      // exec-ing sleep in its place). Only those serving a mount in the node's mount dir are latch's.
      const standIn = (args: string[]) => spawn('bash', ['-c', 'sleep 600; :', ...args], { stdio: 'ignore', argv0: 'rbd-fuse' });
      const mountDir = join(work, 'rbd');
      mkdirSync(mountDir);
      const old = standIn(['--id', 'node', '-p', 'pool', '-r', 'cached', join(mountDir, 'cached')]);
      const current = standIn(['--id', 'node', '--rbd-cache', 'false', '-p', 'pool', '-r', 'fresh', join(mountDir, 'fresh')]);
      const halfway = standIn(['--rbd-cache', '-p', 'false', join(mountDir, 'odd')]);
      const elsewhere = standIn(['-p', 'pool', '-r', 'other', join(work, 'other-dir', 'other')]);
      const all = [old, current, halfway, elsewhere];
      try {
        await until('the stand-ins to start', () => all.every((c) => readFileSync(`/proc/${c.pid}/cmdline`, 'utf8').includes(work)));
        const found: Finding[] = [];
        await checkDaemonCache(mountDir, (f) => found.push(f));
        const about = (pid: number | undefined) => found.filter((f) => f.message.includes(`rbd-fuse pid ${pid} `));
        const [warning, ...more] = about(old.pid);
        assert.deepEqual(more, []);
        assert.equal(warning?.severity, 'warning');
        assert.equal(warning?.check, 'rbd-cache');
        assert.ok(warning?.message.includes(`serving ${join(mountDir, 'cached')}) runs with librbd's cache`), warning?.message);
        assert.deepEqual(about(current.pid), [], 'nothing of the one started with --rbd-cache false');
        assert.equal(about(halfway.pid).length, 1, "'--rbd-cache' without 'false' right after it is not the cache off");
        assert.deepEqual(about(elsewhere.pid), [], 'nothing of an rbd-fuse serving a mount outside the mount dir');
      } finally {
        for (const child of all) {
          child.kill('SIGKILL');
          if (child.exitCode === null && child.signalCode === null) await new Promise((resolve) => child.once('exit', resolve));
        }
      }
    });
  },
);

describe('the command line that starts a daemon', () => {
  it('under setpriv, inside a named systemd scope where systemd runs the host', () => {
    assert.deepEqual(daemonCommand('/usr/bin/rbd-fuse', ['-r', 'v'], { setpriv: '/usr/bin/setpriv', systemdRun: undefined }), [
      '/usr/bin/setpriv',
      ['--pdeathsig', 'SIGKILL', '--', '/usr/bin/rbd-fuse', '-r', 'v'],
    ]);
    assert.deepEqual(
      daemonCommand('/usr/bin/rbd-fuse', ['-r', 'v'], {
        setpriv: '/usr/bin/setpriv',
        systemdRun: '/usr/bin/systemd-run',
        scope: 'latch-rbd-fuse-p-v',
      }),
      [
        '/usr/bin/systemd-run',
        [
          '--scope',
          '--quiet',
          '--collect',
          '--unit=latch-rbd-fuse-p-v',
          '--',
          '/usr/bin/setpriv',
          '--pdeathsig',
          'SIGKILL',
          '--',
          '/usr/bin/rbd-fuse',
          '-r',
          'v',
        ],
      ],
    );
    assert.deepEqual(daemonCommand('/usr/bin/rbd-fuse', [], { setpriv: undefined, systemdRun: '/usr/bin/systemd-run' }), [
      '/usr/bin/systemd-run',
      ['--scope', '--quiet', '--collect', '--', '/usr/bin/rbd-fuse'],
    ]);
  });
});
