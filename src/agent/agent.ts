// The node's agent: the long-running process of a node (a DaemonSet or a systemd unit), one per node, started by
// `latch agent`. Every agent.intervalSeconds it runs the tasks of tasks.ts (reaping tickets, releasing this node's holds
// its kernel proves stale, the cheap doctor checks, the quota and use of its shared volumes); on every ledger change
// (Store.watch) and every interval its job runner (jobs/runner.ts) does the job tickets granted to this node; and it
// serves /metrics on agent.listen (loopback by default). It keeps nothing the ledger does not hold, so it may be
// killed and restarted at any moment (docs/jobs.md).
import { createServer, type Server } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Config } from '../config.js';
import type { Context } from '../context.js';
import { LatchError, errorMessage } from '../errors.js';
import { writeLog } from '../log.js';
import { withHostLock } from '../sys/lock.js';
import { JobRunner } from '../jobs/runner.js';
import { parseSchedules } from '../jobs/recurring.js';
import { agentStartup } from './startup.js';
import { AGENT_TASKS, freshContext, runAgentTasks } from './tasks.js';
import { LogFollower, readWholeLog } from './call-log.js';
import { LatchMetrics, readLedger } from './metrics.js';

export interface AgentOptions {
  /** Run the tasks and one pass of the job runner, wait for the jobs it started, and exit, without serving /metrics. */
  once?: boolean;
  /** Stops the agent (tests); SIGTERM and SIGINT do the same for the real process. */
  signal?: AbortSignal;
  /** Told the address /metrics listens on, once it does (tests listen on port 0). */
  onListening?: (address: string) => void;
}

/** Runs the agent of `config`'s node until stopped; `contextOf` gives the one context it keeps for its life. */
export async function runAgent(config: Config, options: AgentOptions, contextOf: (config: Config) => Context): Promise<void> {
  // A bad recurring job (its cron expression is parsed only here, never by driver calls) stops the agent at start.
  await parseSchedules(config);
  // One agent per node: two would start the same jobs. The lock is the node's kind of lock (sys/lock.ts: the flock of a
  // file in a root-only directory), which the kernel frees when the agent dies, even on SIGKILL.
  return withHostLock(
    [config.stateDir, config.nodeName, '', 'agent'],
    0,
    () => `another latch agent is already running for node ${config.nodeName} (state dir ${config.stateDir}): one agent per node`,
    () => agentLoop(config, options, contextOf),
  );
}

async function agentLoop(config: Config, options: AgentOptions, contextOf: (config: Config) => Context): Promise<void> {
  const collected = await LatchMetrics.create();
  // One context (one store connection) for the agent's life; each task round gets a fresh log and ledger over it.
  const base = contextOf(config);
  const context = () => freshContext(base);
  const log = (entry: Record<string, unknown>) => writeLog(config, { agent: 'jobs', pid: process.pid, node: config.nodeName, ...entry });
  const jobs = new JobRunner(context, log);
  const jobPass = () => jobs.pass().catch((err: unknown) => log({ error: errorMessage(err) }));
  // A pod's filesystem that a killed latch process left frozen is thawed before anything else.
  await agentStartup(config, (entry) => writeLog(config, { agent: 'startup', pid: process.pid, node: config.nodeName, ...entry }));
  if (options.once) {
    await runAgentTasks(config, context, collected, AGENT_TASKS);
    await jobPass();
    await jobs.settle();
    return;
  }

  const stop = new AbortController();
  const onSignal = () => stop.abort();
  process.once('SIGTERM', onSignal);
  process.once('SIGINT', onSignal);
  options.signal?.addEventListener('abort', onSignal);

  // Counters start from what the retained log files hold, then follow the current file.
  const follower = new LogFollower(config.logFile);
  await readWholeLog(config.logFile, (line) => collected.ingest(line), { skipCurrent: true });
  const server = await serveMetrics(config, async () => {
    await follower.readNew((line) => collected.ingest(line));
    await readLedger(collected, context());
    return collected;
  });
  const address = server.address();
  const listening = typeof address === 'object' && address ? `${address.address}:${address.port}` : config.agent.listen;
  writeLog(config, { agent: 'start', pid: process.pid, node: config.nodeName, listen: listening });
  options.onListening?.(listening);
  // Woken by a ledger change (jobs only: the tasks keep their interval) or the interval (both).
  const changes = base.ledger.store.watch?.('volumes', stop.signal)[Symbol.asyncIterator]();
  const nextChange = () =>
    changes?.next().then(
      () => 'change',
      (err: unknown) => {
        // The watch broke for good (it retries by itself otherwise): poll only, at the interval.
        log({ error: `ledger watch: ${errorMessage(err)}; polling every ${config.agent.intervalSeconds} s` });
        return 'watch-failed';
      },
    );
  let change = nextChange();
  let interval: Promise<string> | undefined;
  const intervalMs = config.agent.intervalSeconds * 1000;
  try {
    let tasksDue = 0;
    while (!stop.signal.aborted) {
      if (Date.now() >= tasksDue) {
        await runAgentTasks(config, context, collected, AGENT_TASKS);
        tasksDue = Date.now() + intervalMs;
      }
      await jobPass();
      // One pending timer and one pending watch read at a time, however often the ledger changes.
      interval ??= sleep(Math.max(0, tasksDue - Date.now()), 'interval', { signal: stop.signal }).catch(() => 'stopped');
      const woke = await Promise.race(change ? [interval, change] : [interval]);
      if (woke === 'change') change = nextChange();
      else if (woke === 'watch-failed') change = undefined;
      else interval = undefined;
    }
  } finally {
    await jobs.stop();
    await changes?.return?.();
    process.off('SIGTERM', onSignal);
    process.off('SIGINT', onSignal);
    await new Promise((resolve) => server.close(resolve));
    writeLog(config, { agent: 'stop', pid: process.pid, node: config.nodeName });
  }
}

/** GET /metrics answers the metrics as of the request; anything else is 404. */
async function serveMetrics(config: Config, collect: () => Promise<LatchMetrics>): Promise<Server> {
  const { host, port } = parseListen(config.agent.listen);
  const server = createServer((req, res) => {
    if (req.method !== 'GET' || (req.url ?? '').split('?')[0] !== '/metrics') {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('latch agent: only GET /metrics is served\n');
      return;
    }
    collect()
      .then(async (m) => {
        const body = await m.text();
        res.writeHead(200, { 'content-type': m.contentType }).end(body);
      })
      .catch((err: unknown) => {
        res.writeHead(500, { 'content-type': 'text/plain' }).end(`latch agent: ${String(err)}\n`);
      });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', (err) => reject(new LatchError(`latch agent cannot listen on ${config.agent.listen}: ${err.message}`)));
    server.listen(port, host, () => resolve());
  });
  return server;
}

/** host:port or [v6]:port, as the configuration's agent.listen. */
function parseListen(listen: string): { host: string; port: number } {
  const at = listen.lastIndexOf(':');
  const host = listen.slice(0, at).replace(/^\[(.*)\]$/, '$1');
  const port = Number(listen.slice(at + 1));
  if (at <= 0 || !Number.isInteger(port) || port < 0 || port > 65535) throw new LatchError(`agent.listen ${listen} is not host:port`);
  return { host, port };
}
