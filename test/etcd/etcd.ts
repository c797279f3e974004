// Real etcd processes for the tests: one member, or a 3-member cluster, on random loopback ports with their data in
// a temp dir. Every process started here is killed when its cluster is stopped, when this process exits, and (via
// `setpriv --pdeathsig`) by the kernel if this process is killed outright, so no test can leave etcd running.
//
//   const etcd = await EtcdCluster.start({ size: 3 });   // waits until every member is healthy
//   new EtcdStore({ endpoints: etcd.endpoints })
//   await etcd.members[0].kill(); await etcd.members[0].start();
//   await etcd.stop();                                      // in after(): kills everything, removes the temp dir
//
// etcd comes from $ETCD_BIN, else the PATH (Debian: apt-get install etcd-server; scripts/setup.sh does it).
// Tests call etcdSkipReason() and skip with that message when it is missing.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import * as http from 'node:http';
import * as https from 'node:https';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { EtcdStore } from '../../src/store/etcd.js';
import type { Store } from '../../src/store/types.js';
import { trackChild } from '../fixtures/tracked-children.js';

export interface TlsFiles {
  ca: string;
  cert: string;
  key: string;
}

export interface ClusterOptions {
  /** 1 or 3 (any odd number works). */
  size?: number;
  /** Serve clients over https with these files, and require client certificates signed by `ca`. */
  clientTls?: { server: TlsFiles; ca: string };
  /** How long start() waits for every member to be healthy. */
  startTimeoutMs?: number;
  /**
   * One network namespace (a name under /run/netns) and address per member, instead of 127.0.0.1 (the nemesis rig):
   * each member then takes etcd's default ports on its own address, and the test's own requests to the members run
   * through `curl` in `clientNetns`, a namespace that reaches them.
   */
  hosts?: { netns: string; address: string }[];
  clientNetns?: string;
}

function which(command: string): string | undefined {
  const dirs = [...(process.env.PATH ?? '').split(delimiter), '/usr/bin', '/usr/sbin', '/usr/local/bin'];
  for (const dir of dirs) {
    if (dir && existsSync(join(dir, command))) return join(dir, command);
  }
  return undefined;
}

/** The etcd executable: $ETCD_BIN, else `etcd` on the PATH; undefined when not installed. */
export function etcdBinary(): string | undefined {
  const env = process.env.ETCD_BIN;
  if (env) return existsSync(env) ? env : undefined;
  return which('etcd');
}

/** Why etcd tests cannot run here (a message for `skip`), or undefined when they can. */
export function etcdSkipReason(): string | undefined {
  if (etcdBinary()) return undefined;
  return 'etcd is not installed (apt-get install etcd-server, or run scripts/setup.sh; or set ETCD_BIN)';
}

const setpriv = which('setpriv');

/** A free TCP port on 127.0.0.1 (free now; etcd binds it a moment later). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => (typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port'))));
    });
  });
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

export class EtcdMember {
  proc: ChildProcess | undefined;
  private exited: Promise<void> = Promise.resolve();

  constructor(
    readonly cluster: EtcdCluster,
    readonly name: string,
    readonly clientPort: number,
    readonly peerPort: number,
    readonly dataDir: string,
    readonly logFile: string,
    readonly host: { netns: string; address: string } | undefined = undefined,
  ) {}

  get clientUrl(): string {
    return `${this.cluster.scheme}://${this.host?.address ?? '127.0.0.1'}:${this.clientPort}`;
  }
  get peerUrl(): string {
    return `http://${this.host?.address ?? '127.0.0.1'}:${this.peerPort}`;
  }
  get running(): boolean {
    return this.proc !== undefined && this.proc.exitCode === null && this.proc.signalCode === null;
  }

  /** Starts the process (again, on the same data dir and ports) without waiting for it to be healthy. */
  launch(): void {
    if (this.running) return;
    const bin = etcdBinary();
    if (!bin) throw new Error(etcdSkipReason());
    const args = [
      '--name',
      this.name,
      '--data-dir',
      this.dataDir,
      '--listen-client-urls',
      this.clientUrl,
      '--advertise-client-urls',
      this.clientUrl,
      '--listen-peer-urls',
      this.peerUrl,
      '--initial-advertise-peer-urls',
      this.peerUrl,
      '--initial-cluster',
      this.cluster.initialCluster,
      '--initial-cluster-state',
      'new',
      '--initial-cluster-token',
      this.cluster.token,
      // Fast elections, so failover tests take seconds, not tens of seconds.
      '--heartbeat-interval',
      '50',
      '--election-timeout',
      '500',
      '--logger',
      'zap',
      '--log-level',
      'warn',
    ];
    const tls = this.cluster.options.clientTls;
    if (tls) {
      args.push('--cert-file', tls.server.cert, '--key-file', tls.server.key, '--trusted-ca-file', tls.ca, '--client-cert-auth');
    }
    mkdirSync(this.dataDir, { recursive: true, mode: 0o700 });
    const log = openSync(this.logFile, 'a');
    // setpriv --pdeathsig: the kernel kills etcd if this process dies without running its exit hook.
    // nsenter (the nemesis rig) switches the network namespace only, and execs etcd without forking.
    const [inNs, inNsArgs] = this.host ? ['nsenter', [`--net=/run/netns/${this.host.netns}`, '--', bin, ...args]] : [bin, args];
    const [command, argv] = setpriv ? [setpriv, ['--pdeathsig', 'SIGKILL', '--', inNs, ...inNsArgs]] : [inNs, inNsArgs];
    const child = spawn(command, argv, { stdio: ['ignore', log, log] });
    closeSync(log);
    trackChild(child);
    this.proc = child;
    this.exited = new Promise<void>((resolve) => {
      child.on('exit', () => resolve());
      child.on('error', () => resolve());
    });
  }

  /** Starts the member and waits until it reports healthy (which needs a quorum of the cluster). */
  async start(timeoutMs = 20_000): Promise<void> {
    this.launch();
    await this.waitHealthy(timeoutMs);
  }

  async waitHealthy(timeoutMs = 20_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    let last = '';
    while (Date.now() < deadline) {
      if (!this.running) throw new Error(`etcd member ${this.name} exited while starting:\n${this.logTail()}`);
      try {
        const body = (await this.cluster.request(this.clientUrl, 'GET', '/health', undefined, 1000)) as { health?: string };
        if (body.health === 'true') return;
        last = JSON.stringify(body);
      } catch (err) {
        last = err instanceof Error ? err.message : String(err);
      }
      await sleep(50);
    }
    throw new Error(`etcd member ${this.name} not healthy after ${timeoutMs} ms (${last}):\n${this.logTail()}`);
  }

  /** Kills the member (SIGKILL unless told otherwise) and waits until it is gone. Its data dir stays. */
  async kill(signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    if (this.running) this.proc!.kill(signal);
    const timer = setTimeout(() => this.proc?.kill('SIGKILL'), 5000);
    await this.exited;
    clearTimeout(timer);
  }

  logTail(lines = 30): string {
    try {
      return readFileSync(this.logFile, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
    } catch {
      return '(no log)';
    }
  }
}

export class EtcdCluster {
  readonly members: EtcdMember[] = [];
  readonly token = `latch-test-${randomBytes(4).toString('hex')}`;
  readonly scheme: 'http' | 'https';
  private readonly agent: http.Agent;
  private stopped = false;

  private constructor(
    readonly dir: string,
    readonly options: ClusterOptions,
  ) {
    this.scheme = options.clientTls ? 'https' : 'http';
    this.agent = options.clientTls
      ? new https.Agent({
          ca: readFileSync(options.clientTls.ca),
          cert: readFileSync(options.clientTls.server.cert),
          key: readFileSync(options.clientTls.server.key),
        })
      : new http.Agent();
  }

  /** Starts a cluster of `size` members and waits until all are healthy. Retries on a port clash. */
  static async start(options: ClusterOptions = {}): Promise<EtcdCluster> {
    const reason = etcdSkipReason();
    if (reason) throw new Error(reason);
    let lastError: unknown;
    for (let attempt = 0; attempt < 3; attempt++) {
      const cluster = new EtcdCluster(mkdtempSync(join(tmpdir(), 'latch-etcd-')), options);
      try {
        await cluster.create(options.size ?? 1);
        return cluster;
      } catch (err) {
        lastError = err;
        await cluster.stop();
        if (!/address already in use/.test(String(err))) throw err;
      }
    }
    throw lastError;
  }

  get endpoints(): string[] {
    return this.members.map((m) => m.clientUrl);
  }

  get initialCluster(): string {
    return this.members.map((m) => `${m.name}=${m.peerUrl}`).join(',');
  }

  private async create(size: number): Promise<void> {
    for (let i = 0; i < size; i++) {
      const name = `m${i}`;
      const host = this.options.hosts?.[i];
      const [client, peer] = host ? [2379, 2380] : [await freePort(), await freePort()];
      this.members.push(new EtcdMember(this, name, client, peer, join(this.dir, name), join(this.dir, `${name}.log`), host));
    }
    for (const m of this.members) m.launch();
    await Promise.all(this.members.map((m) => m.waitHealthy(this.options.startTimeoutMs ?? 20_000)));
  }

  /** The index of the current leader, as the first reachable member reports it. */
  async leaderIndex(): Promise<number> {
    const ids = new Map<string, number>();
    let leader: string | undefined;
    for (const [i, m] of this.members.entries()) {
      if (!m.running) continue;
      try {
        const s = (await this.request(m.clientUrl, 'POST', '/v3/maintenance/status', {}, 1000)) as {
          header?: { member_id?: string };
          leader?: string;
        };
        if (s.header?.member_id) ids.set(s.header.member_id, i);
        leader ??= s.leader;
      } catch {
        // not answering
      }
    }
    const index = leader === undefined ? undefined : ids.get(leader);
    if (index === undefined) throw new Error('no etcd member reports a known leader');
    return index;
  }

  /** A plain JSON request to one member (test plumbing; the store under test has its own client). */
  request(baseUrl: string, method: 'GET' | 'POST', path: string, body: unknown, timeoutMs: number): Promise<unknown> {
    if (this.options.clientNetns !== undefined)
      return this.requestInNetns(this.options.clientNetns, baseUrl + path, method, body, timeoutMs);
    const url = new URL(baseUrl + path);
    const payload = body === undefined ? undefined : JSON.stringify(body);
    return new Promise((resolve, reject) => {
      const req = (url.protocol === 'https:' ? https : http).request(
        url,
        { method, agent: this.agent, timeout: timeoutMs, headers: payload ? { 'content-type': 'application/json' } : {} },
        (res) => {
          let text = '';
          res.setEncoding('utf8').on('data', (d: string) => (text += d));
          res.on('end', () => {
            try {
              resolve(JSON.parse(text));
            } catch {
              reject(new Error(`HTTP ${res.statusCode}: ${text.slice(0, 200)}`));
            }
          });
          res.on('error', reject);
        },
      );
      req.on('timeout', () => req.destroy(new Error(`timed out after ${timeoutMs} ms`)));
      req.on('error', reject);
      req.end(payload);
    });
  }

  /** request() through curl in the network namespace `netns`, with the server's certificate as the client's. */
  private async requestInNetns(netns: string, url: string, method: string, body: unknown, timeoutMs: number): Promise<unknown> {
    const tls = this.options.clientTls;
    const args = ['--silent', '--show-error', '--max-time', String(timeoutMs / 1000), '-X', method, url];
    if (tls) args.push('--cacert', tls.ca, '--cert', tls.server.cert, '--key', tls.server.key);
    if (body !== undefined) args.push('-H', 'content-type: application/json', '--data-binary', JSON.stringify(body));
    const r = spawnSync('nsenter', [`--net=/run/netns/${netns}`, '--', 'curl', ...args], { encoding: 'utf8', timeout: timeoutMs + 2000 });
    if (r.status !== 0) throw new Error(`curl ${url}: ${r.stderr || r.error?.message || `exit ${r.status}`}`);
    return JSON.parse(r.stdout) as unknown;
  }

  /** Kills every member and removes the data. Safe to call twice, and after a failed start. */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    await Promise.all(this.members.map((m) => m.kill()));
    this.agent.destroy();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/**
 * An etcd store for a store opened by several processes (a test and the workers it spawns): on the shared etcd of
 * $LATCH_TEST_ETCD_ENDPOINTS (test/etcd/with-etcd.ts sets it; npm test runs the unit tests under it), with a key
 * prefix made from the last two components of `location` (a fresh temp dir per scenario), so runs never meet.
 */
export function openSharedEtcdForTest(location: string, timeoutMs = 5000): Store {
  const endpoints = process.env.LATCH_TEST_ETCD_ENDPOINTS?.split(',').filter(Boolean) ?? [];
  if (endpoints.length === 0) {
    throw new Error(
      'the etcd store kind needs one etcd shared by the test and its workers: run the tests under ' +
        'test/etcd/with-etcd.ts (npm test does), or set LATCH_TEST_ETCD_ENDPOINTS',
    );
  }
  const name = location
    .split('/')
    .filter(Boolean)
    .slice(-2)
    .map((p) => p.replace(/[^A-Za-z0-9._-]/g, '_'))
    .join('/');
  return new EtcdStore({ endpoints, prefix: `/latch-test/${name}/`, timeoutMs });
}

/** A throwaway CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl; undefined without it. */
export function makeTestCertificates(
  dir: string,
  serverIps: string[] = [],
): { ca: string; server: TlsFiles; client: TlsFiles; otherCa: string } | undefined {
  const openssl = which('openssl');
  if (!openssl) return undefined;
  mkdirSync(dir, { recursive: true });
  const run = (...args: string[]) => {
    const r = spawnSync(openssl, args, { cwd: dir, encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`openssl ${args.join(' ')}: ${r.stderr}`);
  };
  const p = (f: string) => join(dir, f);
  for (const ca of ['ca', 'other-ca']) {
    run(
      'req',
      '-x509',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-keyout',
      p(`${ca}.key`),
      '-out',
      p(`${ca}.pem`),
      '-days',
      '2',
      '-subj',
      `/CN=latch-test-${ca}`,
    );
  }
  const leaf = (name: string, ext: string) => {
    run('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', p(`${name}.key`), '-out', p(`${name}.csr`), '-subj', `/CN=${name}`);
    writeFileSync(p(`${name}.ext`), ext);
    run(
      'x509',
      '-req',
      '-in',
      p(`${name}.csr`),
      '-CA',
      p('ca.pem'),
      '-CAkey',
      p('ca.key'),
      '-CAcreateserial',
      '-out',
      p(`${name}.pem`),
      '-days',
      '2',
      '-extfile',
      p(`${name}.ext`),
    );
  };
  const ips = ['127.0.0.1', ...serverIps].map((ip) => `IP:${ip}`).join(',');
  leaf('server', `subjectAltName=${ips},DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n`);
  leaf('client', 'extendedKeyUsage=clientAuth\n');
  return {
    ca: p('ca.pem'),
    otherCa: p('other-ca.pem'),
    server: { ca: p('ca.pem'), cert: p('server.pem'), key: p('server.key') },
    client: { ca: p('ca.pem'), cert: p('client.pem'), key: p('client.key') },
  };
}
