import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmodSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { parseConfig } from '../../src/config.js';
import { createContext } from '../../src/context.js';
import { LatchError } from '../../src/errors.js';
import { useNativeHelper } from '../../src/sys/native.js';
import { CommandError, killAllChildren, run, runningChildren } from '../../src/sys/run.js';
import { helperWays } from '../fixtures/native-helper.js';

const REPO = resolve(__dirname, '../..');
/** Both ways run() starts children: through the native helper (a driver's), and through node:child_process and setpriv. */
const WAYS = helperWays('node:child_process and setpriv');

/** A unique sleep duration, so the processes a test starts can be found in /proc and nothing else is. */
function uniqueSleep(): string {
  return `300.${Date.now() % 100000}${randomBytes(3).readUIntBE(0, 3)}`;
}

/** Live (not zombie) processes whose command line contains `marker`. */
function processesWith(marker: string): number[] {
  const found: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^[0-9]+$/.test(entry)) continue;
    try {
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0').join(' ');
      if (!cmdline.includes(marker)) continue;
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
      if (state !== 'Z') found.push(Number(entry));
    } catch {
      // exited while we looked
    }
  }
  return found;
}

async function waitFor(condition: () => boolean, ms: number): Promise<boolean> {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    if (condition()) return true;
    await new Promise((r) => setTimeout(r, 25));
  }
  return condition();
}

/** Kills anything a failed test left behind (only processes carrying one of our markers). */
const markers: string[] = [];
after(() => {
  for (const marker of markers) {
    for (const pid of processesWith(marker)) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
  }
});

for (const way of WAYS)
  describe(`run, through ${way.name}`, { skip: way.skip }, () => {
    before(() => useNativeHelper(way.helper));
    after(() => useNativeHelper(undefined));

    it('captures stdout and stderr separately', async () => {
      const result = await run('sh', ['-c', 'echo out; echo err >&2']);
      assert.equal(result.stdout, 'out\n');
      assert.equal(result.stderr, 'err\n');
      assert.equal(result.exitCode, 0);
      assert.ok(result.durationMs >= 0);
    });

    it('never lets a child write to our own stdout or stderr', () => {
      const dir = mkdtempSync(join(tmpdir(), 'latch-run-'));
      try {
        const script = join(dir, 'child.ts');
        writeFileSync(
          script,
          `import { run } from ${JSON.stringify(join(REPO, 'src/sys/run'))};\n` +
            `import { useNativeHelper } from ${JSON.stringify(join(REPO, 'src/sys/native'))};\n` +
            `useNativeHelper(${JSON.stringify(way.helper)});\n` +
            `(async () => {\n` +
            `  await run('sh', ['-c', 'echo LOUD-OUT; echo LOUD-ERR >&2; exit 0']);\n` +
            `  await run('sh', ['-c', 'echo LOUD-FAIL; echo LOUD-FAIL-ERR >&2; exit 4']).catch(() => undefined);\n` +
            `  process.stdout.write(JSON.stringify({ status: 'Success' }));\n` +
            `})();\n`,
        );
        const child = spawnSync(process.execPath, ['--import', 'tsx', script], { cwd: REPO, encoding: 'utf8', timeout: 60_000 });
        assert.equal(child.status, 0, child.stderr);
        assert.equal(child.stdout, '{"status":"Success"}');
        assert.equal(child.stderr, '');
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });

    it("collects a child's output through files that have no name, whole, and leaves no file behind", async () => {
      const shm = () => new Set(readdirSync('/dev/shm'));
      const before = shm();
      // Output well over a pipe's 64 KiB and over several reads, with a marker at the end: nothing cut or reordered.
      const result = await run('sh', ['-c', 'head -c 300000 /dev/zero | tr "\\0" x; echo END; echo E >&2']);
      assert.equal(result.stdout.length, 300_004);
      assert.ok(result.stdout.endsWith('xEND\n'));
      assert.equal(result.stderr, 'E\n');
      // The child's own view: its stdout and stderr are unlinked files in /dev/shm (where the files are made), not pipes.
      const fds = await run('sh', ['-c', 'readlink /proc/$$/fd/1; readlink /proc/$$/fd/2']);
      const targets = fds.stdout.trim().split('\n');
      assert.equal(targets.length, 2);
      for (const target of targets) assert.match(target, /^\/dev\/shm\/#\d+ \(deleted\)$/);
      assert.deepEqual(
        [...shm()].filter((name) => !before.has(name)),
        [],
      );
    });

    it('fails a child whose output is over 16 MiB', async () => {
      await assert.rejects(run('head', ['-c', String(17 * 1024 * 1024), '/dev/zero']), (err: unknown) => {
        assert.ok(err instanceof CommandError);
        assert.match(err.message, /produced more than 16777216 bytes of output/);
        return true;
      });
      assert.equal((await run('head', ['-c', String(1024 * 1024), '/dev/zero'])).stdout.length, 1024 * 1024);
    });

    it('passes input on stdin, and stdin is /dev/null otherwise', async () => {
      assert.equal((await run('cat', [], { input: 'hello\n' })).stdout, 'hello\n');
      const started = Date.now();
      const result = await run('sh', ['-c', 'cat; echo done'], { timeoutMs: 10_000 });
      assert.equal(result.stdout, 'done\n');
      assert.ok(Date.now() - started < 5_000);
    });

    it('runs with LC_ALL=C and the sbin directories on PATH', async () => {
      const result = await run('sh', ['-c', 'echo "$LC_ALL"; echo "$PATH"']);
      const [lcAll, path] = result.stdout.split('\n');
      assert.equal(lcAll, 'C');
      const dirs = (path ?? '').split(':');
      for (const dir of ['/usr/local/sbin', '/usr/sbin', '/sbin']) assert.ok(dirs.includes(dir), `${dir} in ${path}`);
    });

    it("runs with the environment it is given instead of this process's, LC_ALL and PATH set over it", async () => {
      process.env.LATCH_TEST_OWN = 'this process';
      try {
        const result = await run('sh', ['-c', 'echo "${LATCH_TEST_OWN-unset} | $LATCH_TEST_GIVEN | $LC_ALL | $PATH"'], {
          env: { LATCH_TEST_GIVEN: 'given', LC_ALL: 'en_US.UTF-8', PATH: '/nowhere' },
        });
        const [own, given, lcAll, path] = result.stdout.trim().split(' | ');
        assert.equal(own, 'unset');
        assert.equal(given, 'given');
        assert.equal(lcAll, 'C');
        assert.ok((path ?? '').split(':').includes('/usr/sbin'), `the search path, not the given one: ${path}`);
      } finally {
        delete process.env.LATCH_TEST_OWN;
      }
    });

    it('throws CommandError naming the command, exit code and last stderr line', async () => {
      await assert.rejects(run('sh', ['-c', 'echo first >&2; echo "the real reason" >&2; exit 3']), (err: unknown) => {
        assert.ok(err instanceof CommandError);
        assert.ok(err instanceof LatchError);
        assert.equal(err.exitCode, 3);
        assert.equal(err.command, 'sh');
        assert.equal(err.timedOut, false);
        assert.match(err.message, /^sh -c .* failed \(exit 3\): the real reason$/);
        assert.match(err.stderrTail, /first\nthe real reason/);
        return true;
      });
    });

    it('accepts exit codes listed in okExitCodes', async () => {
      const result = await run('sh', ['-c', 'echo partial; exit 2'], { okExitCodes: [2] });
      assert.equal(result.exitCode, 2);
      assert.equal(result.stdout, 'partial\n');
      await assert.rejects(run('sh', ['-c', 'exit 1'], { okExitCodes: [2] }), CommandError);
    });

    it('reports a command that does not exist', async () => {
      await assert.rejects(run('latch-no-such-command', ['x']), (err: unknown) => {
        assert.ok(err instanceof CommandError);
        assert.equal(err.exitCode, undefined);
        assert.match(err.message, /latch-no-such-command x could not be started: command not found/);
        return true;
      });
    });

    it('refuses arguments with NUL bytes', async () => {
      await assert.rejects(run('echo', ['a\0b']), LatchError);
    });

    it('starts the child in a session of its own, with no signal ignored or blocked (node ignores SIGPIPE)', async () => {
      const status = (await run('cat', ['/proc/self/status'])).stdout;
      assert.match(status, /^SigIgn:\s+0+$/m);
      assert.match(status, /^SigBlk:\s+0+$/m);
      const stat = (await run('cat', ['/proc/self/stat'])).stdout;
      // pid (comm) state ppid pgrp session
      const [pid, , , , pgrp, session] = stat.replace(/\(.*\)/, 'comm').split(' ');
      assert.equal(pgrp, pid);
      assert.equal(session, pid);
    });

    it('reports a file that cannot be executed', async () => {
      const dir = mkdtempSync(join(tmpdir(), 'latch-run-'));
      try {
        const notAProgram = join(dir, 'not-a-program');
        writeFileSync(notAProgram, 'neither ELF nor a #! line\n');
        chmodSync(notAProgram, 0o755);
        await assert.rejects(run(notAProgram, []), (err: unknown) => {
          assert.ok(err instanceof CommandError);
          assert.equal(err.exitCode === undefined || err.exitCode === 126 || err.exitCode === 127, true, String(err.exitCode));
          assert.match(err.message, /could not be started: ENOEXEC|failed \(exit 12[67]\)/);
          return true;
        });
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });

    it('kills the whole process group when the deadline passes', async () => {
      const a = uniqueSleep();
      const b = uniqueSleep();
      markers.push(a, b);
      const started = Date.now();
      await assert.rejects(run('sh', ['-c', `sleep ${a} & sleep ${b}`], { timeoutMs: 300 }), (err: unknown) => {
        assert.ok(err instanceof CommandError);
        assert.equal(err.timedOut, true);
        assert.match(err.message, /^sh -c .* timed out after 300 ms$/);
        return true;
      });
      assert.ok(Date.now() - started < 1_500, 'SIGTERM was enough, no grace period needed');
      assert.ok(await waitFor(() => processesWith(a).length === 0 && processesWith(b).length === 0, 2_000), 'no sleep survives');
      assert.equal(runningChildren(), 0);
    });

    it('follows up with SIGKILL when the group ignores SIGTERM', async () => {
      const a = uniqueSleep();
      const b = uniqueSleep();
      markers.push(a, b);
      const started = Date.now();
      // The background sleep ignores SIGTERM and holds no pipe: only the SIGKILL 2 s later can end it.
      await assert.rejects(
        run('sh', ['-c', `trap '' TERM; sleep ${a} >/dev/null 2>&1 & sleep ${b}`], { timeoutMs: 300 }),
        (err: unknown) => err instanceof CommandError && err.timedOut,
      );
      const elapsed = Date.now() - started;
      assert.ok(elapsed >= 2_000 && elapsed < 5_000, `took ${elapsed} ms`);
      assert.ok(await waitFor(() => processesWith(a).length === 0 && processesWith(b).length === 0, 2_000), 'no sleep survives');
    });

    it('killAllChildren kills every running child group at once', async () => {
      const a = uniqueSleep();
      const b = uniqueSleep();
      markers.push(a, b);
      const first = run('sh', ['-c', `sleep ${a} & wait`]);
      const second = run('sleep', [b]);
      const outcomes = Promise.allSettled([first, second]);
      assert.ok(await waitFor(() => processesWith(a).length > 0 && processesWith(b).length > 0, 5_000), 'children started');
      assert.equal(runningChildren(), 2);
      killAllChildren();
      const [r1, r2] = await outcomes;
      for (const r of [r1, r2]) {
        assert.equal(r?.status, 'rejected');
        const reason: unknown = r.reason;
        assert.ok(reason instanceof CommandError);
        assert.match(reason.message, /killed by SIGKILL/);
      }
      assert.ok(await waitFor(() => processesWith(a).length === 0 && processesWith(b).length === 0, 2_000), 'no sleep survives');
      assert.equal(runningChildren(), 0);
    });
  });

for (const way of WAYS)
  describe(`a child never outlives a SIGKILLed driver, through ${way.name}`, { skip: way.skip }, () => {
    it('the kernel kills the child when its parent dies (PR_SET_PDEATHSIG)', async () => {
      const { spawn } = await import('node:child_process');
      const { readdirSync, readFileSync } = await import('node:fs');
      const marker = `${300 + Math.floor(Math.random() * 1000)}.${process.pid}`; // a unique "sleep N.M"
      const sleeping = () =>
        readdirSync('/proc')
          .filter((p) => /^\d+$/.test(p))
          .some((p) => {
            try {
              const argv = readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0');
              return /(^|\/)sleep$/.test(argv[0] ?? '') && argv.includes(marker); // not the parent, whose argv has it too
            } catch {
              return false;
            }
          });
      const parent = spawn(process.execPath, ['--import', 'tsx', 'test/fixtures/run-then-wait.ts', marker, String(way.helper)], {
        stdio: 'ignore',
      });
      try {
        for (let i = 0; i < 100 && !sleeping(); i++) await new Promise((r) => setTimeout(r, 100));
        assert.equal(sleeping(), true, 'the child started');
        parent.kill('SIGKILL');
        for (let i = 0; i < 20 && sleeping(); i++) await new Promise((r) => setTimeout(r, 100));
        assert.equal(sleeping(), false, 'the child died with its parent');
      } finally {
        parent.kill('SIGKILL');
      }
    });
  });

describe("the configured commandTimeout reaches a driver call's children through its context", () => {
  let dir: string;
  let path: string | undefined;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'latch-deadline-'));
    path = process.env.PATH;
  });
  after(() => {
    process.env.PATH = path;
    rmSync(dir, { recursive: true, force: true });
  });

  it('ctx.system runs mount with the deadline of commandTimeout, not the default 120 s', async () => {
    const marker = uniqueSleep();
    // A mount that never finishes, found first on the search path.
    writeFileSync(join(dir, 'mount'), `#!/bin/sh\nexec sleep ${marker}\n`);
    chmodSync(join(dir, 'mount'), 0o755);
    process.env.PATH = `${dir}:${path ?? ''}`;
    const config = parseConfig(
      { nodeName: 'node-a', stateDir: join(dir, 'state'), poolDir: join(dir, 'pool'), logFile: join(dir, 'latch.log'), commandTimeout: 1 },
      'test',
    );
    const ctx = createContext(config);
    const started = Date.now();
    await assert.rejects(ctx.system.mount('/dev/null', join(dir, 'target'), { fsType: 'ext4' }), (err: unknown) => {
      assert.ok(err instanceof CommandError && err.timedOut, `a timeout, not ${String(err)}`);
      assert.match(err.message, /timed out after 1 s/);
      return true;
    });
    const took = Date.now() - started;
    assert.ok(took >= 1000 && took < 10_000, `ended by the 1 s deadline (took ${took} ms)`);
    assert.ok(await waitFor(() => processesWith(marker).length === 0, 5000), 'the hung mount was killed');
  });
});
