// The protocol layer: one FlexVolume call in, exactly one JSON reply out.
// This is the only code that writes to stdout. Everything else a call might print (a library's console.log,
// a Node warning, a child's output) is captured and goes to the log file instead.
import { writeSync } from 'node:fs';
import { Writable } from 'node:stream';
import { isSingleExecutable, loadDriverConfig, type Config } from '../config.js';
import { encodeReply, exitCodeOf, failure, notSupported, type Reply } from '../contract/reply.js';
import { createContext, type ContextParts } from '../context.js';
import { LatchError, NotSupportedError, errorMessage } from '../errors.js';
import { redactArgs, writeLog, type CallLog } from '../log.js';
import type { ArgKinds, ArgValues, OpDefinition } from '../ops/op.js';
import { nativeHelperUnavailable } from '../sys/native.js';
import { killAllChildren } from '../sys/run.js';
import { usageOf, type OpTable } from './ops.js';

// kubelet kills waitforattach at 10 minutes and waits forever on the others: answer before either happens.
const CALL_DEADLINE_MS = 9 * 60 * 1000;

/** What the process learned before the call, for its log line (the single executable's loader, src/sea/main.ts). */
export interface StartupFacts {
  /** V8 refused the single executable's code cache: every call compiles what the cache should have held. */
  codeCacheRejected?: boolean;
}

/**
 * Answers one FlexVolume call from `ops` (ops.ts: OPS, or the control plane's table in src/sea/control.ts's bundle) and
 * ends the process: the reply on stdout, the log line, the exit code.
 */
export async function runDriverCall(op: string, argv: string[], ops: OpTable, startup: StartupFacts = {}): Promise<void> {
  const started = process.hrtime.bigint();
  // Ties the call's log line to its children's; not a secret, so not worth loading node:crypto for.
  const callId = Math.floor(Math.random() * 0x1_0000_0000)
    .toString(16)
    .padStart(8, '0');
  const turn = turnWaitedFor(process.env);
  const stray: string[] = [];
  captureStrayOutput(stray);

  let config: Config | undefined;
  const log: CallLog = {};
  let finished = false;

  const finish = (reply: Reply, error?: unknown): void => {
    if (finished) return;
    finished = true;
    const durationMs = Number((process.hrtime.bigint() - started) / 1_000_000n);
    // Without a usable config there is no configured log file: the reply carries the message, and nothing is
    // written anywhere the operator did not choose.
    if (config)
      writeLog(
        config,
        {
          callId,
          pid: process.pid,
          op,
          args: redactArgs(argv),
          ...log,
          durationMs,
          status: reply.status,
          ...(reply.message !== undefined && { message: reply.message }),
          ...(error instanceof Error && !(error instanceof LatchError) && { stack: error.stack }),
          ...(stray.length > 0 && { strayOutput: stray.join('').slice(0, 4000) }),
          ...(startup.codeCacheRejected && { codeCacheRejected: true }),
          ...(turn && { turn }),
          ...withoutNativeHelper(),
        },
        op !== 'init',
      );
    writeReply(reply);
    process.exit(exitCodeOf(reply));
  };

  process.on('uncaughtException', (err) => finish(toReply(op, err), err));
  process.on('unhandledRejection', (err) => finish(toReply(op, err), err));
  for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) {
    process.on(signal, () => {
      killAllChildren();
      finish(failure(`${op} was interrupted by ${signal}; it is safe to call it again`));
    });
  }
  armDeadline(started, CALL_DEADLINE_MS, () => {
    killAllChildren();
    finish(failure(`${op} did not finish within ${CALL_DEADLINE_MS / 60000} minutes; it is safe to call it again`));
  });

  try {
    finish(await answerCall(op, argv, ops, log, (loaded) => (config = loaded)));
  } catch (err) {
    finish(toReply(op, err), err);
  }
}

/**
 * What the call waited for its turn before Node started (src/native/helper.c, takeTurnAtStart, which says it in
 * LATCH_TURN): the host's number of turns and the milliseconds waited, or that it went on without one; undefined when
 * it took a turn at once, or took none (an op that takes no turn, plain node). Removed from the environment, so that
 * no child inherits it.
 */
function turnWaitedFor(env: NodeJS.ProcessEnv): { of: number; waitedMs: number } | { of: number; wentOnWithout: true } | undefined {
  const fact = env.LATCH_TURN;
  if (fact === undefined) return undefined;
  delete env.LATCH_TURN;
  const [of, waited] = fact.split(' ');
  if (waited === 'none') return { of: Number(of), wentOnWithout: true };
  return Number(waited) > 0 ? { of: Number(of), waitedMs: Number(waited) } : undefined;
}

/**
 * For the log line of a self-contained build's call that did without its native helper (src/sys/native.ts), because
 * Node refused to load it as an addon (the executable does not start at all where the helper is missing: it needs it
 * as a library, for its turn). Plain node never has it.
 */
function withoutNativeHelper(): { nativeHelperUnavailable?: string } {
  const why = nativeHelperUnavailable();
  return why !== undefined && isSingleExecutable() ? { nativeHelperUnavailable: why } : {};
}

/**
 * Calls `expire` when `deadlineMs` have passed since `started` (process.hrtime.bigint() at the call's start). The timer
 * is set when the event loop first turns, for what is left of the deadline: a call that waits on nothing (init, or
 * getvolumename and isattached on the file store, which reads synchronously) replies within the microtasks after the
 * main script and never reaches a timer, so it does not load Node's timer machinery (17 functions to compile on every
 * call); one that waits (a child, etcd, fs/promises) turns the loop at its first wait.
 */
export function armDeadline(started: bigint, deadlineMs: number, expire: () => void): void {
  setImmediate(() => {
    const elapsedMs = Number((process.hrtime.bigint() - started) / 1_000_000n);
    setTimeout(expire, Math.max(0, deadlineMs - elapsedMs));
  });
}

/**
 * Where a call's configuration and parts come from. A driver call reads the configuration from its environment and
 * builds the configured parts; the single executable's build passes a scratch environment, and the tests
 * (test/fixtures/op-harness.ts) a parsed configuration and their fake store, backend, system and clock.
 */
export interface CallSource {
  /** The environment the configuration is found from (LATCH_CONFIG, ...); process.env by default. */
  env?: NodeJS.ProcessEnv;
  /** The configuration itself, in place of reading it from `env`. */
  config?: Config;
  /** Parts of the call's context put in place of the configured ones. */
  parts?: Omit<ContextParts, 'log'>;
}

/**
 * The reply to one call, without the process around it (stray output, signals, deadline, log line, exit): the
 * single executable's build runs it on a scratch configuration, so that its code cache holds this path compiled
 * (src/sea/driver.ts), and the tests run it on fake nodes. `configured` gets the configuration as soon as it is
 * read, for the log line. It throws what the op throws; toReply makes the reply of that.
 */
export async function answerCall(
  op: string,
  argv: string[],
  ops: OpTable,
  log: CallLog,
  configured: (config: Config) => void,
  source: CallSource = {},
): Promise<Reply> {
  const env = source.env ?? process.env;
  const load = ops[op];
  if (!load) {
    // Unknown ops (waitfordetach, getdevicemountpath, ...) are Not supported whatever the config says; the
    // config is read only to log the call where the operator chose.
    try {
      configured(source.config ?? loadDriverConfig(env, false));
    } catch {
      /* not needed to answer */
    }
    return notSupported();
  }
  const config = source.config ?? loadDriverConfig(env, op !== 'init');
  configured(config);
  const definition = await load();
  if (definition.attachModeOnly && !config.attach) {
    return notSupported(`${op} is not used in non-attach mode (attach: false): mount and unmount do the whole job on the node`);
  }
  const args = parseArgs(op, definition, argv, config, log);
  return definition.run(createContext(config, { ...source.parts, log }), args);
}

/** Checks the argument count, then parses every argument by its kind, in order (the first bad one is reported). */
function parseArgs(op: string, definition: OpDefinition, argv: string[], config: Config, log: CallLog): ArgValues<ArgKinds> {
  const kinds = Object.entries(definition.args);
  if (argv.length < kinds.length) {
    const missing = kinds
      .slice(argv.length)
      .map(([name]) => `<${name}>`)
      .join(' ');
    throw new LatchError(`${op}: missing argument ${missing} (usage: ${usageOf(op, definition)})`);
  }
  if (argv.length > kinds.length) {
    throw new LatchError(`${op}: expected ${kinds.length} argument(s), got ${argv.length} (usage: ${usageOf(op, definition)})`);
  }
  kinds.forEach(([name, kind], i) => {
    if (argv[i] === '' && !kind.mayBeEmpty) throw new LatchError(`${op}: argument <${name}> is empty (usage: ${usageOf(op, definition)})`);
  });
  const values: Record<string, unknown> = {};
  kinds.forEach(([name, kind], i) => {
    values[name] = kind.parse(argv[i] ?? '', { op, name, config, log });
  });
  return values;
}

/** The reply to an error a call threw: its message for latch's own errors, an internal error for anything else. */
export function toReply(op: string, err: unknown): Reply {
  if (err instanceof NotSupportedError) return notSupported(err.message);
  if (err instanceof LatchError) return failure(err.message);
  return failure(`internal error in ${op}: ${errorMessage(err)} (details in the latch log)`);
}

/** Writes the reply synchronously, so that process.exit cannot cut it; retries while a non-blocking pipe is full. */
function writeReply(reply: Reply): void {
  const data = Buffer.from(encodeReply(reply));
  let offset = 0;
  while (offset < data.length) {
    try {
      offset += writeSync(1, data, offset);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EAGAIN') return;
    }
  }
}

/**
 * Diverts anything written to process.stdout/stderr, and Node's warnings, into `sink`. process.stdout and
 * process.stderr are replaced rather than patched: Node creates the real streams on first access (a pipe or file
 * stream each, measured at about 1 ms of every call), and the reply never goes through them anyway. The stand-in is
 * made on first access too: almost no call writes anything, and node:stream (loaded on first use, build.mjs) costs a
 * millisecond to load.
 */
function captureStrayOutput(sink: string[]): void {
  let diverted: Writable | undefined;
  const stream = (): Writable =>
    (diverted ??= new Writable({
      decodeStrings: false,
      write(chunk: unknown, _encoding, callback) {
        sink.push(typeof chunk === 'string' ? chunk : Buffer.from(chunk as Uint8Array).toString('utf8'));
        callback();
      },
    }));
  for (const name of ['stdout', 'stderr'] as const) {
    Object.defineProperty(process, name, { configurable: true, enumerable: true, get: stream });
  }
  process.removeAllListeners('warning');
  process.on('warning', (warning) => sink.push(`${warning.name}: ${warning.message}\n`));
}
