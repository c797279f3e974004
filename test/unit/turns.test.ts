// Turns (src/native/helper.c): a driver call that does a volume's work takes one of a few host-wide turns before Node
// starts, waiting for one when all are held. The helper's takeTurn, in processes of the test's own on names of their
// own: a waiter sleeps until a holder ends (also by SIGKILL) or gives its turn back at its hold limit, and goes on
// without one at its wait limit. Then bin/latch-sea: the ops that take a turn wait for one before Node starts, the
// others do not, and the log line says what a call waited.
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { NATIVE_HELPER } from '../fixtures/native-helper.js';
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

/** A node process that takes one of `turns` turns named `prefix`-N through the helper, then lives until ended. */
function taker(prefix: string, turns: number, waitMs: number, holdMs: number): Taker {
  const script = `
    const helper = { exports: {} };
    process.dlopen(helper, ${JSON.stringify(NATIVE_HELPER)});
    const took = helper.exports.takeTurn(${JSON.stringify(prefix)}, ${turns}, ${waitMs}, ${holdMs});
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

/** The kernel function a thread asleep in poll(2) shows in /proc/PID/wchan (not epoll's, where an idle node sleeps). */
const IN_POLL = /^(poll_schedule_timeout|do_sys_poll)/;

/** Waits until `child`'s main thread sleeps in poll(2): a taker queued for a turn. */
async function asleepInPoll(child: ChildProcess): Promise<void> {
  let wchan = '';
  for (let i = 0; i < 250 && !IN_POLL.test(wchan); i++) {
    await sleep(20);
    wchan = readFileSync(`/proc/${child.pid}/wchan`, 'utf8');
  }
  assert.match(wchan, IN_POLL, `process ${child.pid} is not waiting for a turn`);
}

const running = (t: Taker) => t.child.exitCode === null && t.child.signalCode === null;

describe('turns, through the native helper', { skip: helperMissing }, () => {
  let n = 0;
  const prefix = () => `latch-test-turn-${process.pid}-${n++}`;

  it('a taker waits while every turn is held, and takes the one that a holder leaves, while the other still holds its own', async () => {
    const names = prefix();
    const first = taker(names, 2, 0, 60_000);
    const second = taker(names, 2, 0, 60_000);
    assert.deepEqual(
      [await first.took, await second.took].map((ms) => ms >= 0),
      [true, true],
      'both held a turn',
    );
    const waiter = taker(names, 2, 60_000, 60_000);
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
    const holder = taker(names, 1, 0, 60_000);
    assert.ok((await holder.took) >= 0);
    const waiters: Taker[] = [];
    try {
      for (let i = 0; i < 4; i++) {
        const waiter = taker(names, 1, 60_000, 60_000);
        waiters.push(waiter);
        await asleepInPoll(waiter.child);
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
    const holder = taker(names, 1, 0, limits.holdMs);
    assert.ok((await holder.took) >= 0);
    const waiter = taker(names, 1, limits.waitMs, 60_000);
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

  it('refuses a turn count out of 1-256 and a missing name', () => {
    const helper = { exports: {} as { takeTurn: (...args: unknown[]) => number } };
    process.dlopen(helper, NATIVE_HELPER);
    for (const args of [
      ['x', 0, 0, 0],
      ['x', 257, 0, 0],
      ['', 1, 0, 0],
      ['x', 1, -1, 0],
    ])
      assert.throws(() => helper.exports.takeTurn(...args), TypeError, JSON.stringify(args));
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
    const holder = taker('latch-turn', 1, 60_000, 60_000);
    assert.ok((await holder.took) >= 0);
    const attach = call(['attach', json('pv-turn'), 'node-a']);
    try {
      // Node not started: one thread, asleep in poll(2) in the helper's constructor.
      const pid = attach.child.pid ?? 0;
      await asleepInPoll(attach.child);
      const threads = /^Threads:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1];
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
    const holder = taker('latch-turn', 1, 60_000, 60_000);
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
});
