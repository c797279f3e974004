// The protocol layer: one FlexVolume call in, exactly one JSON reply out.
// This is the only code that writes to stdout. Everything else a call might print (a library's console.log,
// a Node warning, a child's output) is captured and goes to the log file instead.
import { randomUUID } from 'node:crypto';
import { writeSync } from 'node:fs';
import { isAbsolute, normalize } from 'node:path';
import { loadConfig, type Config } from '../config.js';
import { LatchError, NotSupportedError, errorMessage } from '../errors.js';
import { redactArgs, writeLog } from '../log.js';
import { checkNodeName, checkPvName } from '../names.js';
import type { OpCall } from '../ops/types.js';
import { killAllChildren, setDefaultCommandTimeout } from '../sys/run.js';
import { OPS, usageOf } from './ops.js';
import { parseOptions } from './options.js';
import { encodeReply, exitCodeOf, failure, notSupported, type Reply } from './reply.js';

// kubelet kills waitforattach at 10 minutes and waits forever on the others: answer before either happens.
const CALL_DEADLINE_MS = 9 * 60 * 1000;

export async function runDriverCall(op: string, args: string[]): Promise<void> {
  const started = process.hrtime.bigint();
  const callId = randomUUID().slice(0, 8);
  const stray: string[] = [];
  captureStrayOutput(stray);

  let config: Config | undefined;
  const facts: Record<string, unknown> = {};
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
          args: redactArgs(args),
          ...facts,
          durationMs,
          status: reply.status,
          ...(reply.message !== undefined && { message: reply.message }),
          ...(error instanceof Error && !(error instanceof LatchError) && { stack: error.stack }),
          ...(stray.length > 0 && { strayOutput: stray.join('').slice(0, 4000) }),
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
  setTimeout(() => {
    killAllChildren();
    finish(failure(`${op} did not finish within ${CALL_DEADLINE_MS / 60000} minutes; it is safe to call it again`));
  }, CALL_DEADLINE_MS);

  try {
    const spec = OPS[op];
    if (!spec) {
      // Unknown ops (waitfordetach, getdevicemountpath, ...) are Not supported whatever the config says; the
      // config is read only to log the call where the operator chose.
      try {
        config = loadConfig();
      } catch {
        /* not needed to answer */
      }
      finish(notSupported());
      return;
    }
    config = loadConfig();
    if (spec.attachModeOnly && !config.attach) {
      finish(notSupported(`${op} is not used in non-attach mode (attach: false): mount and unmount do the whole job on the node`));
      return;
    }
    setDefaultCommandTimeout(config.commandTimeout * 1000);
    const call = buildCall(op, args, config, facts);
    const handler = await spec.load();
    finish(await handler.run(call));
  } catch (err) {
    finish(toReply(op, err), err);
  }
}

/** Checks the argument count and every argument's form, and parses the options JSON. */
function buildCall(op: string, argv: string[], config: Config, facts: Record<string, unknown>): OpCall {
  const spec = OPS[op]!;
  if (argv.length < spec.args.length) {
    const missing = spec.args
      .slice(argv.length)
      .map((a) => `<${a}>`)
      .join(' ');
    throw new LatchError(`${op}: missing argument ${missing} (usage: ${usageOf(op)})`);
  }
  if (argv.length > spec.args.length) {
    throw new LatchError(`${op}: expected ${spec.args.length} argument(s), got ${argv.length} (usage: ${usageOf(op)})`);
  }
  const args: Record<string, string> = {};
  spec.args.forEach((name, i) => {
    const value = argv[i]!;
    if (value === '' && !spec.mayBeEmpty?.includes(name)) {
      throw new LatchError(`${op}: argument <${name}> is empty (usage: ${usageOf(op)})`);
    }
    args[name] = value;
  });

  const call: OpCall = { op, args, config, facts };
  for (const [name, value] of Object.entries(args)) {
    if (name === 'json') {
      call.options = parseOptions(value, config);
      facts.volume = call.options.name;
    } else if (name === 'nodeName') {
      facts.node = checkNodeName(value, `${op}: argument <nodeName>`);
    } else if (name === 'pvOrVolumeName') {
      facts.volume = checkPvName(value, `${op}: argument <pvOrVolumeName>`);
    } else if (name === 'newBytes' || name === 'oldBytes') {
      if (!/^[0-9]{1,17}$/.test(value)) throw new LatchError(`${op}: argument <${name}> must be a byte count, not "${value.slice(0, 32)}"`);
    } else if (value !== '') {
      args[name] = checkPath(op, name, value);
    }
  }
  return call;
}

/** Paths from kubelet: absolute, no NUL, no `..` segments; returned normalised. */
function checkPath(op: string, name: string, value: string): string {
  if (value.length > 4096 || value.includes('\0') || !isAbsolute(value) || value.split('/').includes('..')) {
    throw new LatchError(`${op}: argument <${name}> must be an absolute path without "..", not ${JSON.stringify(value.slice(0, 80))}`);
  }
  const normal = normalize(value);
  return normal.length > 1 && normal.endsWith('/') ? normal.slice(0, -1) : normal;
}

function toReply(op: string, err: unknown): Reply {
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

/** Diverts anything written to process.stdout/stderr, and Node's warnings, into `sink`. */
function captureStrayOutput(sink: string[]): void {
  const divert = ((chunk: unknown, ...rest: unknown[]): boolean => {
    sink.push(typeof chunk === 'string' ? chunk : Buffer.from(chunk as Uint8Array).toString('utf8'));
    const callback = rest.find((r) => typeof r === 'function') as (() => void) | undefined;
    callback?.();
    return true;
  }) as typeof process.stdout.write;
  process.stdout.write = divert;
  process.stderr.write = divert;
  process.removeAllListeners('warning');
  process.on('warning', (warning) => sink.push(`${warning.name}: ${warning.message}\n`));
}
