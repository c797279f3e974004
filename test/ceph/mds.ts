// A CephFS file system on the test cluster (test/ceph/cluster.ts): its two pools, one MDS (`ceph-mds -f`, a child of
// this process that dies with it) and `ceph fs new`. The cluster starts it when asked (`startCephCluster({ cephfs:
// true })`), before it waits for HEALTH_OK, so a test gets a file system whose MDS is active.
//
// The MDS names the cluster dir on its command line (its conf), so the cluster's sweep kills it at stop() like every
// other daemon of the dir; its handle here is only for the tests' faults (pause, resume).
import { appendFileSync, existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import type { CephClient, CephCluster } from './cluster.js';

/** The file system every test uses, and the subvolume group latch keeps its shared volumes in. */
export const CEPHFS_NAME = 'cephfs';

export interface CephFsHandle {
  fsName: string;
  /** The MDS daemon (mds.a). */
  child: ChildProcess;
}

const handles = new WeakMap<CephCluster, CephFsHandle>();

/** The running MDS of a cluster started with `cephfs: true`. */
export function cephFsOf(cluster: CephCluster): CephFsHandle {
  const handle = handles.get(cluster);
  if (!handle) throw new Error('this cluster was started without cephfs: true');
  return handle;
}

interface MdsTools {
  /** Spawns a long-running child tracked for teardown, its output into `logFile`. */
  spawn(command: string, args: string[], logFile: string): { child: ChildProcess; exited: Promise<void> };
  /** Polls until `probe` returns true (a string says why not yet). */
  until(what: string, timeoutMs: number, probe: () => Promise<true | string>): Promise<true>;
}

/**
 * Creates the file system's pools, its keyring, starts mds.a and waits until it is active. The MDS is active about
 * 7 s after the pools exist on this machine. Single MDS: no standby is wanted (else HEALTH_WARN).
 */
export async function startCephFs(cluster: CephCluster, tools: MdsTools, timeoutMs: number): Promise<CephFsHandle> {
  const dataDir = join(cluster.dir, 'mds', 'ceph-a');
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  // The daemon's data dir and keyring by its own conf section, as for the other daemons.
  appendFileSync(
    cluster.confPath,
    ['', '[mds]', `mds_data = ${cluster.dir}/mds/$cluster-$id`, `keyring = ${dataDir}/keyring`, ''].join('\n'),
  );
  const keyring = join(dataDir, 'keyring');
  writeFileSync(keyring, '', { mode: 0o600 });
  await cluster.ceph([
    'auth',
    'get-or-create',
    'mds.a',
    'mon',
    'allow profile mds',
    'osd',
    'allow rwx',
    'mds',
    'allow *',
    'mgr',
    'allow profile mds',
    '-o',
    keyring,
  ]);
  await cluster.ceph(['osd', 'pool', 'create', `${CEPHFS_NAME}_metadata`]);
  await cluster.ceph(['osd', 'pool', 'create', `${CEPHFS_NAME}_data`]);
  await cluster.ceph(['fs', 'new', CEPHFS_NAME, `${CEPHFS_NAME}_metadata`, `${CEPHFS_NAME}_data`]);
  await cluster.ceph(['fs', 'set', CEPHFS_NAME, 'standby_count_wanted', '0']);
  const { child } = tools.spawn('ceph-mds', ['-f', '--conf', cluster.confPath, '--id', 'a'], join(cluster.dir, 'log', 'mds.a.out'));
  await tools.until('the MDS to be active', timeoutMs, async () => {
    if (child.exitCode !== null || child.signalCode !== null) throw new Error(`ceph-mds exited (${child.exitCode ?? child.signalCode})`);
    const { stdout } = await cluster.ceph(['fs', 'status', CEPHFS_NAME, '--format', 'json'], { timeoutMs: 10_000 });
    const status = JSON.parse(stdout) as { mdsmap?: { state?: string }[] };
    return status.mdsmap?.some((m) => m.state === 'active') ? true : 'not active yet';
  });
  const handle = { fsName: CEPHFS_NAME, child };
  handles.set(cluster, handle);
  return handle;
}

/**
 * Evicts the MDS sessions of ceph-fuse processes that are gone. A ceph-fuse that was killed (by a test, or by a job's
 * stall watchdog) keeps its session, and its caps, until the MDS times it out (session_timeout, 60 s); meanwhile the
 * manager's subvolume calls (create, info, snapshot rm) on what it held wait for them, past a test file's
 * commandTimeout (measured: a create took 8.4 s and failed after a SIGKILL test, 0.7 s without it; CI once saw an info
 * time out after 20 s). docs/operations.md says so for real clusters. Test files call this before each test: it does at
 * once what the MDS would do once those sessions time out. `as`: an identity with mds `allow *` (client.admin if none).
 */
export async function evictGoneClients(cluster: CephCluster, as?: CephClient): Promise<void> {
  const { stdout } = await cluster.ceph(['tell', 'mds.a', 'client', 'ls', '--format', 'json'], { as });
  for (const session of JSON.parse(stdout) as { id: number; client_metadata?: { pid?: string } }[]) {
    const pid = Number(session.client_metadata?.pid);
    if (Number.isInteger(pid) && pid > 0 && !existsSync(`/proc/${pid}`)) {
      await cluster.ceph(['tell', 'mds.a', 'client', 'evict', `id=${session.id}`], { as });
    }
  }
}
