// Ceph's RADOS Gateway (its S3 server, Debian's `radosgw`) on a test cluster (cluster.ts): the real S3 store the
// S3 backup target's tests run against.
//
//   const ceph = await startCephCluster();
//   const rgw = await startRgw(ceph);        // ~10 s: the gateway answers S3, a user and its keys exist
//   ... rgw.endpoint, rgw.credentialsFile ...
//   await rgw.stop(); await rgw.start();     // a gateway that goes away mid-upload, and comes back
//   await ceph.stop();                       // also kills the gateway (its command line names the cluster dir)
//
// The gateway listens on 127.0.0.1 on a free port, path-style (no DNS names for buckets). The user and its keys are
// made by `radosgw-admin user create`, which generates the keys itself: they are only ever in files (0600), never on
// a command line.
import { writeFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { run } from '../../src/sys/run.js';
import { freeFixedPort, spawnTracked, tail, until, which, type CephCluster } from './cluster.js';

export interface Rgw {
  /** http://127.0.0.1:PORT */
  endpoint: string;
  /** {"accessKeyId": ..., "secretAccessKey": ...}, mode 0600: what backupTarget.credentialsFile names. */
  credentialsFile: string;
  accessKeyId: string;
  secretAccessKey: string;
  pid(): number | undefined;
  /** SIGKILLs the gateway (an S3 store that fails mid-request) and waits until it is gone. */
  stop(): Promise<void>;
  /** Starts it again and waits until it answers. */
  start(): Promise<void>;
  /** `radosgw-admin ARGS` as the cluster's admin (answers also while the gateway is down). */
  admin(args: string[]): Promise<string>;
}

const RGW_ID = 'rgw.test';

/** Why the gateway cannot run here (a message for `skip`), or undefined when it can. */
export function rgwSkipReason(): string | undefined {
  if (!which('radosgw') || !which('radosgw-admin')) {
    return 'the RADOS Gateway is not installed: run scripts/setup.sh, or apt-get install -y --no-install-recommends radosgw';
  }
  return undefined;
}

export async function startRgw(cluster: CephCluster, timeoutMs = 60_000): Promise<Rgw> {
  const dir = join(cluster.dir, 'rgw');
  mkdirSync(join(dir, 'data'), { recursive: true, mode: 0o700 });
  const keyring = join(dir, 'keyring');
  writeFileSync(keyring, '', { mode: 0o600 });
  await cluster.ceph(['auth', 'get-or-create', `client.${RGW_ID}`, 'mon', 'allow rw', 'osd', 'allow rwx', '-o', keyring]);
  const port = await freeFixedPort([]);
  const endpoint = `http://127.0.0.1:${port}`;
  const log = join(cluster.dir, 'log', 'radosgw.out');
  const args = [
    '-f',
    '--conf',
    cluster.confPath,
    '--id',
    RGW_ID,
    '--keyring',
    keyring,
    '--rgw-data',
    join(dir, 'data'),
    '--rgw-frontends',
    `beast endpoint=127.0.0.1:${port}`,
    '--log-file',
    join(cluster.dir, 'log', 'radosgw.log'),
    '--admin-socket',
    join(cluster.dir, 'run', 'radosgw.asok'),
    // Fewer threads than the default 512: one host, a few clients, two cores.
    '--rgw-thread-pool-size',
    '32',
  ];
  let child: ChildProcess | undefined;
  let exited: Promise<void> = Promise.resolve();
  const running = () => child !== undefined && child.exitCode === null && child.signalCode === null;
  const admin = async (adminArgs: string[]) =>
    (await run('radosgw-admin', ['--conf', cluster.confPath, '--id', 'admin', ...adminArgs], { timeoutMs: 60_000 })).stdout;
  const start = async () => {
    if (running()) return;
    ({ child, exited } = spawnTracked('radosgw', args, log));
    await until('the RADOS Gateway to answer', timeoutMs, async () => {
      if (!running()) throw new Error(`radosgw exited (${child?.exitCode ?? child?.signalCode}):\n${tail(log)}`);
      try {
        const response = await fetch(endpoint, { signal: AbortSignal.timeout(2_000) });
        await response.arrayBuffer();
        return true;
      } catch {
        return 'not answering yet';
      }
    });
  };
  const stop = async () => {
    if (!running()) return;
    child?.kill('SIGKILL');
    await exited;
  };
  try {
    await start();
    const created = JSON.parse(await admin(['user', 'create', '--uid', 'latch-test', '--display-name', 'latch tests'])) as {
      keys: { access_key: string; secret_key: string }[];
    };
    const key = created.keys[0];
    if (!key) throw new Error('radosgw-admin user create made no keys');
    const credentialsFile = join(dir, 'credentials.json');
    writeFileSync(credentialsFile, JSON.stringify({ accessKeyId: key.access_key, secretAccessKey: key.secret_key }), { mode: 0o600 });
    return {
      endpoint,
      credentialsFile,
      accessKeyId: key.access_key,
      secretAccessKey: key.secret_key,
      pid: () => (running() ? child?.pid : undefined),
      stop,
      start,
      admin,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}
