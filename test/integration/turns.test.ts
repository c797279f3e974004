// Turns (src/native/turns.c): a driver call that does a volume's work takes one of a few host-wide turns before Node
// starts, waiting for one when all are held. The helper's takeTurn, in processes of the test's own on names of their
// own in a lock directory of their own: a waiter sleeps until a holder ends (also by SIGKILL) or gives its turn back at
// its hold limit, and goes on without one at its wait limit; the turn count is clamped. Then bin/latch-sea: the ops
// that take a turn wait for one before Node starts, the others do not, and the log line says what a call waited; and
// a local user who holds the names turns used to be (abstract unix sockets) neither delays a call nor hands it a turn.
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { ATTACKER, LOCK_DIR, NATIVE_HELPER, NOBODY, PYTHON } from '../fixtures/native-helper.js';
import { trackChild } from '../fixtures/tracked-children.js';

const SEA = join(resolve(__dirname, '../..'), 'bin/latch-sea');
const helperMissing = existsSync(NATIVE_HELPER) ? false : `${NATIVE_HELPER} is not built (npm run build:sea)`;
const seaMissing = existsSync(SEA) ? helperMissing : `${SEA} is not built (npm run build:sea)`;

interface Taker {
  child: ChildProcess;
  /** What takeTurn returned: the ms it waited, or -1 when it went on without a turn. */
  took: Promise<number>;
  /** Ends the process (its turn with it, if it still holds one). */
  end(signal?: NodeJS.Signals): Promise<void>;
}

/** A node process that takes one of `turns` turns named `prefix`-N in `dir` through the helper, then lives until ended. */
function taker(dir: string, prefix: string, turns: number, waitMs: number, holdMs: number): Taker {
  const script = `
    const helper = { exports: {} };
    process.dlopen(helper, ${JSON.stringify(NATIVE_HELPER)});
    const took = helper.exports.takeTurn(${JSON.stringify(dir)}, ${JSON.stringify(prefix)}, ${turns}, ${waitMs}, ${holdMs});
    process.stdout.write(String(took) + '\\n');
    process.stdin.resume();
    process.stdin.on('end', () => process.exit(0));`;
  const child = spawn(process.execPath, ['-e', script], { stdio: ['pipe', 'pipe', 'inherit'] });
  trackChild(child);
  const exited = new Promise<void>((done) => child.once('exit', () => done()));
  const took = new Promise<number>((done, fail) => {
    let out = '';
    child.stdout?.on('data', (chunk: Buffer) => {
      out += chunk.toString();
      if (out.includes('\n')) done(Number(out.trim()));
    });
    child.once('exit', (code) => fail(new Error(`the taker exited (${code}) before it took a turn`)));
  });
  took.catch(() => undefined);
  return {
    child,
    took,
    end: async (signal) => {
      if (signal) child.kill(signal);
      else child.stdin?.end();
      await exited;
    },
  };
}

/** Whether `promise` settles within `ms`: for "still waiting", never as a measure of speed. */
async function settlesWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  return Promise.race([promise.then(() => true), sleep(ms).then(() => false)]);
}

/**
 * Whether the process `pid` waits for a turn: at the head of the queue, its main thread looks at the turns between
 * sleeps in nanosleep(2) (not epoll's, where an idle node sleeps); behind it, a thread of its own waits in flock(2).
 */
function waitsForTurn(pid: number): boolean {
  const main = readFileSync(`/proc/${pid}/wchan`, 'utf8');
  if (/nanosleep/.test(main)) return true;
  return readdirSync(`/proc/${pid}/task`).some((task) =>
    /^locks_lock_inode_wait|flock/.test(readFileSync(`/proc/${pid}/task/${task}/wchan`, 'utf8')),
  );
}

/** Waits until `child` waits for a turn (see waitsForTurn). */
async function queued(child: ChildProcess): Promise<void> {
  for (let i = 0; i < 250; i++) {
    if (waitsForTurn(child.pid ?? 0)) return;
    await sleep(20);
  }
  assert.fail(`process ${child.pid} is not waiting for a turn`);
}

const running = (t: Taker) => t.child.exitCode === null && t.child.signalCode === null;

describe('turns, through the native helper', { skip: helperMissing }, () => {
  let n = 0;
  const prefix = () => `test-turn-${n++}`;
  let dir: string;
  before(() => (dir = join(mkdtempSync(join(tmpdir(), 'latch-turns-')), 'locks')));
  after(() => rmSync(dirname(dir), { recursive: true, force: true }));

  it('a taker waits while every turn is held, and takes the one that a holder leaves, while the other still holds its own', async () => {
    const names = prefix();
    const first = taker(dir, names, 2, 0, 60_000);
    const second = taker(dir, names, 2, 0, 60_000);
    assert.deepEqual(
      [await first.took, await second.took].map((ms) => ms >= 0),
      [true, true],
      'both held a turn',
    );
    const waiter = taker(dir, names, 2, 60_000, 60_000);
    try {
      assert.equal(await settlesWithin(waiter.took, 500), false, 'the waiter took a turn while both were held');
      await first.end();
      assert.ok((await waiter.took) >= 0, 'the waiter went on without a turn');
      assert.ok(running(second), 'the other holder still runs');
    } finally {
      await Promise.all([first.end(), second.end(), waiter.end()]);
    }
  });

  it('a turn passes to its waiters one at a time, in the order they came, past one that is gone', async () => {
    const names = prefix();
    const holder = taker(dir, names, 1, 0, 60_000);
    assert.ok((await holder.took) >= 0);
    const waiters: Taker[] = [];
    try {
      for (let i = 0; i < 4; i++) {
        const waiter = taker(dir, names, 1, 60_000, 60_000);
        waiters.push(waiter);
        await queued(waiter.child);
      }
      const [first, gone, third, fourth] = waiters as [Taker, Taker, Taker, Taker];
      await gone.end('SIGKILL');
      const order: number[] = [];
      waiters.forEach(
        (w, i) =>
          void w.took.then(
            () => order.push(i),
            () => undefined,
          ),
      );
      await holder.end();
      await first.took;
      assert.equal(await settlesWithin(third.took, 300), false, 'the third took a turn while the first held it');
      await first.end();
      await third.took;
      await third.end();
      await fourth.took;
      assert.deepEqual(order, [0, 2, 3]);
    } finally {
      await Promise.all([holder.end(), ...waiters.map((w) => w.end())]);
    }
  });

  /** A holder of the one turn of fresh names, with its hold limit, then a waiter, with its wait limit: `check`, then both end. */
  const holderThenWaiter = async (
    limits: { holdMs: number; waitMs: number },
    check: (holder: Taker, waiter: Taker) => Promise<void>,
  ): Promise<void> => {
    const names = prefix();
    const holder = taker(dir, names, 1, 0, limits.holdMs);
    assert.ok((await holder.took) >= 0);
    const waiter = taker(dir, names, 1, limits.waitMs, 60_000);
    try {
      await check(holder, waiter);
    } finally {
      await Promise.all([holder.end(), waiter.end()]);
    }
  };

  it('a holder gives its turn back at its hold limit, while it still runs', () =>
    holderThenWaiter({ holdMs: 200, waitMs: 60_000 }, async (holder, waiter) => {
      assert.ok((await waiter.took) >= 0, 'the waiter went on without a turn');
      assert.ok(running(holder), 'the holder still runs');
    }));

  it('a waiter goes on without a turn at its wait limit', () =>
    holderThenWaiter({ holdMs: 60_000, waitMs: 200 }, async (holder, waiter) => {
      assert.equal(await waiter.took, -1);
      assert.ok(running(holder), 'the holder still runs, and holds its turn');
    }));

  it('the turn of a holder killed with SIGKILL is free at once', () =>
    holderThenWaiter({ holdMs: 60_000, waitMs: 60_000 }, async (holder, waiter) => {
      assert.equal(await settlesWithin(waiter.took, 300), false, 'the waiter took a held turn');
      await holder.end('SIGKILL');
      assert.ok((await waiter.took) >= 0);
    }));

  const loaded = () => {
    const helper = { exports: {} as { takeTurn: (...args: unknown[]) => number; turnCount: (set: string | null, cpus: number) => number } };
    process.dlopen(helper, NATIVE_HELPER);
    return helper.exports;
  };

  it('refuses a turn count out of 1-256, a missing or path-like name and a relative directory', () => {
    const helper = loaded();
    for (const args of [
      [dir, 'x', 0, 0, 0],
      [dir, 'x', 257, 0, 0],
      [dir, '', 1, 0, 0],
      [dir, 'a/b', 1, 0, 0],
      [dir, '..', 1, 0, 0],
      ['relative', 'x', 1, 0, 0],
      [dir, 'x', 1, -1, 0],
    ])
      assert.throws(() => helper.takeTurn(...args), TypeError, JSON.stringify(args));
  });

  it('clamps the turn count to 256, from LATCH_TURNS and from the CPU count alike', () => {
    const { turnCount } = loaded();
    // [LATCH_TURNS, usable CPUs, turns]
    for (const [set, cpus, turns] of [
      [null, 100_000, 256],
      [null, 256, 256],
      [null, 255, 256],
      [null, 254, 255],
      [null, 2, 3],
      [null, 0, 2],
      ['100000', 2, 256],
      ['99999999999999999999', 2, 256],
      ['257', 2, 256],
      ['256', 2, 256],
      ['3', 100_000, 3],
      ['0', 8, 0],
      ['-1', 2, 3],
      ['x', 2, 3],
    ] as const)
      assert.equal(turnCount(set, cpus), turns, `LATCH_TURNS=${set} with ${cpus} CPUs`);
  });

  it('takes one of 256 turns', async () => {
    const holder = taker(dir, prefix(), 256, 0, 60_000);
    try {
      assert.ok((await holder.took) >= 0);
    } finally {
      await holder.end();
    }
  });

  it('goes on without a turn, at once, in a lock directory that others may write or that is a link', async () => {
    const parent = dirname(dir);
    const open = join(parent, 'open');
    mkdirSync(open, { mode: 0o700 });
    chmodSync(open, 0o777);
    const link = join(parent, 'link');
    symlinkSync(dir, link);
    for (const where of [open, link]) {
      const started = Date.now();
      assert.equal(loaded().takeTurn(where, prefix(), 1, 5_000, 0), -1, where);
      assert.ok(Date.now() - started < 1_000, `${where}: waited ${Date.now() - started} ms`);
    }
    assert.deepEqual(readdirSync(open), [], 'no turn file made in the open directory');
  });
});

describe('turns of bin/latch-sea', { skip: seaMissing }, () => {
  let dir: string;
  let env: NodeJS.ProcessEnv;
  const json = (pv: string) =>
    JSON.stringify({ 'kubernetes.io/fsType': '', 'kubernetes.io/pvOrVolumeName': pv, 'kubernetes.io/readwrite': 'rw' });

  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'latch-turns-'));
    const config = { nodeName: 'node-a', stateDir: join(dir, 'state'), poolDir: join(dir, 'pool'), logFile: join(dir, 'latch.log') };
    writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
    // One turn, so that the test's holder of the host's first turn holds them all (the other tests' calls, with the
    // default count, take the others meanwhile).
    env = { PATH: process.env.PATH, LATCH_CONFIG: join(dir, 'config.json'), LATCH_TURNS: '1' };
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  function call(
    args: string[],
    extraEnv: NodeJS.ProcessEnv = {},
  ): { child: ChildProcess; reply: Promise<{ code: number | null; out: string }> } {
    const child = spawn(SEA, args, { env: { ...env, ...extraEnv }, stdio: ['ignore', 'pipe', 'pipe'] });
    trackChild(child);
    let out = '';
    child.stdout?.on('data', (chunk: Buffer) => (out += chunk.toString()));
    child.stderr?.on('data', (chunk: Buffer) => (out += `stderr: ${chunk.toString()}`));
    return { child, reply: new Promise((done) => child.once('close', (code) => done({ code, out }))) };
  }

  const logLines = () =>
    readFileSync(join(dir, 'latch.log'), 'utf8')
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line) as Record<string, unknown>);

  it('attach waits for the turn before Node starts; init, isattached and an admin command do not; the log line says the wait', async () => {
    // The host's own first turn, as a call takes it.
    const holder = taker(LOCK_DIR, 'turn', 1, 60_000, 60_000);
    assert.ok((await holder.took) >= 0);
    const attach = call(['attach', json('pv-turn'), 'node-a']);
    try {
      // Node not started: one thread, at the head of the queue in the helper's constructor (the thread that queued
      // for it is gone once it got there).
      const pid = attach.child.pid ?? 0;
      await queued(attach.child);
      let threads: string | undefined;
      for (let i = 0; i < 50 && threads !== '1'; i++, await sleep(20))
        threads = /^Threads:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1];
      assert.equal(threads, '1', 'attach waits before Node starts (which starts threads of its own)');
      for (const args of [['init'], ['isattached', json('pv-turn'), 'node-a'], ['--version']]) {
        const { code, out } = await call(args).reply;
        assert.equal(code, 0, `${args[0]}: ${out}`);
      }
      assert.equal(await settlesWithin(attach.reply, 0), false, 'attach answered while the turn was held');
      await holder.end();
      const { code, out } = await attach.reply;
      assert.equal(code, 0, out);
      assert.deepEqual(JSON.parse(out), { status: 'Success' });
      const line = logLines().find((l) => l.op === 'attach');
      const turn = line?.turn as { of: number; waitedMs: number } | undefined;
      assert.equal(turn?.of, 1, JSON.stringify(line));
      assert.ok((turn?.waitedMs ?? 0) > 0, JSON.stringify(line));
      assert.equal(logLines().find((l) => l.op === 'isattached')?.turn, undefined, 'isattached took no turn');
    } finally {
      await holder.end();
      attach.child.kill('SIGKILL');
    }
  });

  it('LATCH_TURNS=0 takes no turn, and a LATCH_TURN from the environment is not believed', async () => {
    const holder = taker(LOCK_DIR, 'turn', 1, 60_000, 60_000);
    assert.ok((await holder.took) >= 0);
    try {
      const { code, out } = await call(['detach', 'pv-turn', 'node-a'], { LATCH_TURNS: '0', LATCH_TURN: '7 1234' }).reply;
      assert.equal(code, 0, out);
      const { code: initCode } = await call(['init'], { LATCH_TURN: '7 1234' }).reply;
      assert.equal(initCode, 0);
      const lines = logLines().reverse();
      for (const op of ['detach', 'init']) assert.equal(lines.find((l) => l.op === op)?.turn, undefined, op);
    } finally {
      await holder.end();
    }
  });

  describe(
    'a local user who holds the names the turns used to be',
    { skip: PYTHON ? false : 'no /usr/bin/python3 for the attacker' },
    () => {
      /** The attacker (fixtures/native-helper.ts) as nobody, on every name a turn had: once it is ready, what it could open. */
      async function attacker(mode: 'listener' | 'linger'): Promise<{ child: ChildProcess; probe: string }> {
        const names = Array.from({ length: 257 }, (_, i) => `latch-turn-${i}`);
        const child = spawn(
          NOBODY[0] ?? 'setpriv',
          [...NOBODY.slice(1), PYTHON ?? '', '-c', ATTACKER, mode, join(LOCK_DIR, 'turn-0'), ...names],
          {
            stdio: ['ignore', 'pipe', 'inherit'],
          },
        );
        trackChild(child);
        let out = '';
        await new Promise<void>((done, fail) => {
          child.stdout?.on('data', (chunk: Buffer) => {
            out += chunk.toString();
            if (out.includes('ready')) done();
          });
          child.once('exit', (code) => fail(new Error(`the attacker exited (${code}): ${out}`)));
        });
        return { child, probe: out.split('\n')[0] ?? '' };
      }

      it('cannot open a turn, makes no call wait, and a lingering socket it hands over cannot hold a call at its exit', async () => {
        // The host's directory exists once a call has run.
        assert.equal((await call(['attach', json('pv-turn'), 'node-a']).reply).code, 0);
        const { child, probe } = await attacker('linger');
        try {
          assert.equal(probe, 'denied', 'nobody could open a turn file');
          for (let i = 0; i < 3; i++) {
            const started = Date.now();
            const { code, out } = await call(['attach', json('pv-turn'), 'node-a']).reply;
            const took = Date.now() - started;
            assert.equal(code, 0, out);
            assert.ok(took < 3_000, `the call took ${took} ms (the linger is 5 s, the turns' wait limit 10 s)`);
            // No turn in the log line: taken at once; else what it waited, which is not the 10 s of a turn nobody hands on.
            const turn = logLines()
              .reverse()
              .find((l) => l.op === 'attach')?.turn as { waitedMs?: number } | undefined;
            assert.ok(turn === undefined || (turn.waitedMs ?? 10_000) < 2_000, `it took a turn of its own: ${JSON.stringify(turn)}`);
          }
        } finally {
          child.kill('SIGKILL');
        }
      });

      it('a turn handed over by a process of another user is not taken: a call still waits for the holder of the turn', async () => {
        const holder = taker(LOCK_DIR, 'turn', 1, 60_000, 60_000);
        assert.ok((await holder.took) >= 0);
        const { child } = await attacker('listener');
        const attach = call(['attach', json('pv-turn'), 'node-a']);
        try {
          await queued(attach.child);
          assert.equal(await settlesWithin(attach.reply, 500), false, 'attach went on while the turn was held');
          await holder.end();
          const { code, out } = await attach.reply;
          assert.equal(code, 0, out);
        } finally {
          await holder.end();
          attach.child.kill('SIGKILL');
          child.kill('SIGKILL');
        }
      });
    },
  );
});
