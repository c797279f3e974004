// CephFS through Ceph's own tools, as one cephx identity: `ceph fs subvolume ...` (the manager's volumes module) for
// shared volumes and their snapshots, `ceph-fuse` for a node's mount, `ceph tell mds.X client ls|evict` for the
// fencer. Every call names the conf, the id and the keyring file (never a key), and every child has a deadline.
import { readFile } from 'node:fs/promises';
import { LatchError } from '../errors.js';
import { ceph as cephTool, cephClientArgs, redactedError, type CephIdentity } from './rbd.js';
import { run, startDaemon, type RunResult } from './run.js';

/** One shared volume: subvolume `volume` of group `group` in file system `fsName`. */
export interface SubvolumeRef {
  fsName: string;
  group: string;
  volume: string;
}

export interface SubvolumeInfo {
  /** Its quota (ceph.quota.max_bytes); undefined when it has none ("infinite"). */
  quotaBytes: number | undefined;
  usedBytes: number;
  /** Its data directory inside the file system, e.g. /volumes/latch/v1/<uuid>. */
  path: string;
}

const ENOENT = 2;
const EEXIST = 17;
const EINVAL = 22;
const EOPNOTSUPP = 95;

/** The ceph tool as `identity` (sys/rbd.ts), its wait for a monitor bounded: a file-system call may come from a driver call. */
function ceph(identity: CephIdentity, args: string[], okExitCodes: number[] = [], timeoutMs?: number): Promise<RunResult> {
  return cephTool(identity, ['--connect-timeout', '10', ...args], okExitCodes, timeoutMs);
}

function groupArgs(ref: SubvolumeRef): string[] {
  return ['--group_name', ref.group];
}

/**
 * The caps of a node's identity for shared volumes, besides its rbd caps: the monitors' view of the MDS map, the MDS
 * only below latch's subvolume group (`ceph fs authorize FS client.X /volumes/GROUP rw` would give the same), the
 * file system's data pool, and of the manager's volumes module only what a node does in that group: create (on first
 * use), look up, grow and remove subvolumes. It cannot see or touch another group, or the rest of the file system.
 */
export function cephfsNodeCaps(pool: string, fsName: string, group: string): string[] {
  const mgr = ['create', 'getpath', 'info', 'resize', 'rm', 'snapshot create', 'snapshot ls', 'snapshot info', 'snapshot rm']
    .map((cmd) => `allow command "fs subvolume ${cmd}" with vol_name=${fsName} group_name=${group}`)
    .concat([
      // A clone only from latch's group into latch's group.
      `allow command "fs subvolume snapshot clone" with vol_name=${fsName} group_name=${group} target_group_name=${group}`,
      ...['status', 'cancel'].map((cmd) => `allow command "fs clone ${cmd}" with vol_name=${fsName} group_name=${group}`),
      `allow command "fs subvolumegroup create" with vol_name=${fsName} group_name=${group}`,
    ]);
  return [
    'mon',
    'allow service mon r, allow service osd r, allow service pg r, allow service mds r',
    'mds',
    `allow rw fsname=${fsName} path=/volumes/${group}`,
    'osd',
    `profile rbd pool=${pool}, allow rw tag cephfs data=${fsName}`,
    'mgr',
    mgr.join(', '),
  ];
}

/**
 * `ceph fs subvolume create` with the size as its quota; creates latch's group first when the file system has none yet.
 * An existing subvolume is left as it is (its size is the caller's to check).
 */
export async function subvolumeCreate(identity: CephIdentity, ref: SubvolumeRef, sizeBytes: number): Promise<void> {
  const args = ['fs', 'subvolume', 'create', ref.fsName, ref.volume, ...groupArgs(ref), '--size', String(sizeBytes)];
  const { exitCode } = await ceph(identity, args, [ENOENT]);
  if (exitCode !== ENOENT) return;
  await ceph(identity, ['fs', 'subvolumegroup', 'create', ref.fsName, ref.group]);
  await ceph(identity, args);
}

/** `ceph fs subvolume info`, or undefined when the subvolume does not exist. */
export async function subvolumeInfo(identity: CephIdentity, ref: SubvolumeRef): Promise<SubvolumeInfo | undefined> {
  const { stdout, exitCode } = await ceph(
    identity,
    ['fs', 'subvolume', 'info', ref.fsName, ref.volume, ...groupArgs(ref), '--format', 'json'],
    [ENOENT],
  );
  if (exitCode === ENOENT) return undefined;
  let info: { bytes_quota?: unknown; bytes_used?: unknown; path?: unknown };
  try {
    info = JSON.parse(stdout) as typeof info;
  } catch (err) {
    throw new LatchError(`ceph fs subvolume info ${ref.volume} printed something that is not JSON`, { cause: err });
  }
  if (typeof info.path !== 'string' || !isSubvolumePath(info.path, ref)) {
    throw new LatchError(`ceph fs subvolume info ${ref.volume} reported no path inside /volumes/${ref.group}/${ref.volume}`);
  }
  return {
    quotaBytes: typeof info.bytes_quota === 'number' ? info.bytes_quota : undefined,
    usedBytes: typeof info.bytes_used === 'number' ? info.bytes_used : 0,
    path: info.path,
  };
}

/** The path the volumes module gives a subvolume: /volumes/GROUP/VOLUME/UUID, nothing else (it reaches ceph-fuse's argv). */
export function isSubvolumePath(path: string, ref: SubvolumeRef): boolean {
  const prefix = `/volumes/${ref.group}/${ref.volume}/`;
  return path.startsWith(prefix) && /^[0-9a-f-]{36}$/.test(path.slice(prefix.length));
}

/** `ceph fs subvolume resize --no_shrink`: the quota grows to `sizeBytes`, never shrinks. */
export async function subvolumeResize(identity: CephIdentity, ref: SubvolumeRef, sizeBytes: number): Promise<void> {
  await ceph(identity, ['fs', 'subvolume', 'resize', ref.fsName, ref.volume, String(sizeBytes), ...groupArgs(ref), '--no_shrink']);
}

/** `ceph fs subvolume rm` (with `--force`: also a failed or canceled clone); a missing subvolume is fine. */
export async function subvolumeRemove(identity: CephIdentity, ref: SubvolumeRef, options: { force?: boolean } = {}): Promise<void> {
  const force = options.force === true ? ['--force'] : [];
  await ceph(identity, ['fs', 'subvolume', 'rm', ref.fsName, ref.volume, ...groupArgs(ref), ...force], [ENOENT]);
}

/** `ceph fs subvolume snapshot create`; false when a snapshot of that name exists already. */
export async function subvolumeSnapshotCreate(identity: CephIdentity, ref: SubvolumeRef, snap: string): Promise<boolean> {
  const { exitCode } = await ceph(
    identity,
    ['fs', 'subvolume', 'snapshot', 'create', ref.fsName, ref.volume, snap, ...groupArgs(ref)],
    [EEXIST],
  );
  return exitCode !== EEXIST;
}

/** The subvolume's snapshots with their creation time and size (`snapshot ls`, then `snapshot info` of each). */
export async function subvolumeSnapshots(
  identity: CephIdentity,
  ref: SubvolumeRef,
): Promise<{ name: string; createdAt: string; sizeBytes: number }[]> {
  const { stdout } = await ceph(identity, [
    'fs',
    'subvolume',
    'snapshot',
    'ls',
    ref.fsName,
    ref.volume,
    ...groupArgs(ref),
    '--format',
    'json',
  ]);
  const names = (JSON.parse(stdout) as { name?: unknown }[]).map((s) => s.name).filter((n): n is string => typeof n === 'string');
  const found: { name: string; createdAt: string; sizeBytes: number }[] = [];
  for (const name of names) {
    const info = await ceph(
      identity,
      ['fs', 'subvolume', 'snapshot', 'info', ref.fsName, ref.volume, name, ...groupArgs(ref), '--format', 'json'],
      [ENOENT],
    );
    if (info.exitCode === ENOENT) continue;
    const parsed = JSON.parse(info.stdout) as { created_at?: unknown; size?: unknown };
    found.push({
      name,
      createdAt: typeof parsed.created_at === 'string' ? parsed.created_at : '',
      sizeBytes: typeof parsed.size === 'number' ? parsed.size : 0,
    });
  }
  return found.sort((a, b) => (a.createdAt < b.createdAt ? -1 : a.createdAt > b.createdAt ? 1 : 0));
}

/** `ceph fs subvolume snapshot rm`; a missing snapshot is fine. */
export async function subvolumeSnapshotRemove(identity: CephIdentity, ref: SubvolumeRef, snap: string): Promise<void> {
  await ceph(identity, ['fs', 'subvolume', 'snapshot', 'rm', ref.fsName, ref.volume, snap, ...groupArgs(ref)], [ENOENT]);
}

/**
 * `ceph fs subvolume snapshot clone`: the manager copies snapshot `snap` of `ref` into a new subvolume `target` of the
 * same group, in the background (cloneStatus says how it goes). false when `target` exists already.
 */
export async function subvolumeSnapshotClone(identity: CephIdentity, ref: SubvolumeRef, snap: string, target: string): Promise<boolean> {
  const args = ['fs', 'subvolume', 'snapshot', 'clone', ref.fsName, ref.volume, snap, target, ...groupArgs(ref)];
  const { exitCode } = await ceph(identity, [...args, '--target_group_name', ref.group], [EEXIST]);
  return exitCode !== EEXIST;
}

/** A clone's state (`ceph fs clone status`): its source, and why it failed when it did. */
export interface CloneStatus {
  state: 'pending' | 'in-progress' | 'complete' | 'failed' | 'canceled';
  source: { volume: string; snapshot: string } | undefined;
  failure: string | undefined;
}

const CLONE_STATES: readonly CloneStatus['state'][] = ['pending', 'in-progress', 'complete', 'failed', 'canceled'];

/**
 * `ceph fs clone status` of subvolume `ref.volume`: undefined when no such subvolume exists; a LatchError when it
 * exists but is no clone (the manager refuses the question).
 */
export async function cloneStatus(identity: CephIdentity, ref: SubvolumeRef): Promise<CloneStatus | undefined> {
  const args = ['fs', 'clone', 'status', ref.fsName, ref.volume, ...groupArgs(ref), '--format', 'json'];
  const { stdout, stderr, exitCode } = await ceph(identity, args, [ENOENT, EOPNOTSUPP, EINVAL]);
  if (exitCode === ENOENT) return undefined;
  if (exitCode !== 0) throw new LatchError(`subvolume ${ref.volume} exists and is not a clone (${stderr.trim().slice(0, 200)})`);
  return parseCloneStatus(stdout);
}

/** What `ceph fs clone status --format json` prints, checked (pure, for the tests). */
export function parseCloneStatus(text: string): CloneStatus {
  let parsed: { status?: { state?: unknown; source?: { subvolume?: unknown; snapshot?: unknown }; failure?: { errstr?: unknown } } };
  try {
    parsed = JSON.parse(text) as typeof parsed;
  } catch (err) {
    throw new LatchError('ceph fs clone status printed something that is not JSON', { cause: err });
  }
  const status = parsed.status;
  const state = CLONE_STATES.find((s) => s === status?.state);
  if (state === undefined) throw new LatchError(`ceph fs clone status printed no known state (${JSON.stringify(status?.state)})`);
  const source = status?.source;
  return {
    state,
    source:
      typeof source?.subvolume === 'string' && typeof source.snapshot === 'string'
        ? { volume: source.subvolume, snapshot: source.snapshot }
        : undefined,
    failure: typeof status?.failure?.errstr === 'string' ? status.failure.errstr : undefined,
  };
}

/** `ceph fs clone cancel`: stops a pending or running clone (it stays, canceled, until removed). */
export async function cloneCancel(identity: CephIdentity, ref: SubvolumeRef): Promise<void> {
  await ceph(identity, ['fs', 'clone', 'cancel', ref.fsName, ref.volume, ...groupArgs(ref)], [ENOENT, EINVAL]);
}

export interface CephFuseOptions {
  identity: CephIdentity;
  fsName: string;
  /** The subvolume's path inside the file system (subvolumeInfo). */
  root: string;
  mountPoint: string;
  /** Its admin socket: how the node asks the mount which client instance it is (cephFuseClientAddress). */
  adminSocket: string;
  readOnly: boolean;
  timeoutMs: number;
}

/**
 * Starts `ceph-fuse` on `mountPoint` with the subvolume as its root, as a daemon that outlives the call (startDaemon,
 * as rbd-fuse), and returns once it has mounted (ceph-fuse's foreground part exits only then).
 */
export async function startCephFuse(options: CephFuseOptions): Promise<void> {
  const { identity, fsName, root, mountPoint, adminSocket, readOnly, timeoutMs } = options;
  const args = [
    ...cephClientArgs(identity),
    '--client_fs',
    fsName,
    '--client_mountpoint',
    root,
    '--admin-socket',
    adminSocket,
    // POSIX ACLs shown, set and checked, as the kernel client does by default. Without it ceph-fuse shows none, refuses
    // setfacl and checks only the mode bits: a pod on such a node is let in where an ACL entry shuts its user out (and
    // shut out where one lets it in), a backup does not see the ACLs and a restore cannot set them.
    '--client_acl_type',
    'posix_acl',
    ...(readOnly ? ['-o', 'ro'] : []),
    mountPoint,
  ];
  try {
    await startDaemon('ceph-fuse', args, { timeoutMs, scope: `latch-ceph-fuse-${Date.now().toString(36)}` });
  } catch (err) {
    throw redactedError(err);
  }
}

/**
 * The client instance (IP:PORT/NONCE, the blocklist's form) of a running ceph-fuse, from its admin socket's `status`.
 * undefined when the socket does not answer within `timeoutMs`.
 */
export async function cephFuseClientAddress(adminSocket: string, timeoutMs: number): Promise<string | undefined> {
  const { stdout, exitCode } = await run('ceph', ['--admin-daemon', adminSocket, 'status'], {
    timeoutMs,
    okExitCodes: [1, 22, 2],
  }).catch(() => ({ stdout: '', exitCode: 1 }));
  if (exitCode !== 0) return undefined;
  try {
    const status = JSON.parse(stdout) as { addr_str?: unknown; inst_str?: unknown };
    const addr = typeof status.addr_str === 'string' ? status.addr_str : undefined;
    return addr !== undefined && /^[0-9.]+:[0-9]+\/[0-9]+$/.test(addr) ? addr : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Whether the file system has an active MDS, as `identity` sees the MDS map (`ceph mds stat`, which a node's caps
 * allow): the MDS reachable as the node's identity; and its session_timeout, the seconds a dead client's session
 * (and its caps) last. Throws with the tool's message when the monitors cannot say.
 */
export async function mdsStatus(
  identity: CephIdentity,
  fsName: string,
  timeoutMs: number,
): Promise<{ active: boolean; sessionTimeoutSeconds: number | undefined }> {
  const { stdout } = await ceph(identity, ['mds', 'stat', '--format', 'json'], [], timeoutMs);
  type MdsInfo = { state?: unknown };
  type MdsMap = { fs_name?: unknown; info?: Record<string, MdsInfo>; session_timeout?: unknown };
  const stat = JSON.parse(stdout) as { fsmap?: { filesystems?: { mdsmap?: MdsMap }[] } };
  const mdsmap = (stat.fsmap?.filesystems ?? []).find((f) => f.mdsmap?.fs_name === fsName)?.mdsmap;
  const timeout = mdsmap?.session_timeout;
  return {
    active: Object.values(mdsmap?.info ?? {}).some((m) => m.state === 'up:active'),
    sessionTimeoutSeconds: typeof timeout === 'number' && Number.isFinite(timeout) && timeout > 0 ? timeout : undefined,
  };
}

/** One MDS session of a client, from `client ls`. */
export interface MdsSession {
  mds: string;
  id: number;
  /** The client instance, IP:PORT/NONCE; '' when `inst` shows none (an IPv6 one). */
  address: string;
  /** The cephx id it authenticated as (client_metadata.entity_id). */
  entity: string;
  /** The path it mounted (client_metadata.root). */
  root: string;
}

/** The active MDS daemons of the file system, from the monitors' FSMap (`ceph fs dump`). */
async function activeMds(identity: CephIdentity, fsName: string): Promise<string[]> {
  const { stdout } = await ceph(identity, ['fs', 'dump', '--format', 'json']);
  type MdsInfo = { name?: unknown; state?: unknown };
  const dump = JSON.parse(stdout) as { filesystems?: { mdsmap?: { fs_name?: unknown; info?: Record<string, MdsInfo> } }[] };
  const fs = (dump.filesystems ?? []).find((f) => f.mdsmap?.fs_name === fsName);
  const names = Object.values(fs?.mdsmap?.info ?? {})
    .filter((m) => m.state === 'up:active' && typeof m.name === 'string')
    .map((m) => String(m.name));
  if (names.length === 0) throw new LatchError(`file system ${fsName} has no active MDS: its client sessions cannot be listed`);
  const odd = names.filter((n) => !/^[A-Za-z0-9_.-]+$/.test(n));
  if (odd.length > 0)
    throw new LatchError(`file system ${fsName} has an active MDS named ${JSON.stringify(odd[0])}, which latch cannot ask`);
  return names;
}

/**
 * The caps of the fencer for shared volumes, besides its rbd ones (fencerCaps): the FSMap (to find the active MDS
 * daemons), the MDS map (without `allow service mds r` a `ceph tell mds.X` waits for ever: measured) and the MDS's
 * `client ls` and `client evict`, which Ceph grants only with mds `allow *`. With osd caps
 * that cannot write the file system's pools, it still cannot change a file's data.
 */
export function cephfsFencerCaps(rbdFencerCaps: string[]): string[] {
  const caps = [...rbdFencerCaps];
  const mon = caps.indexOf('mon');
  if (mon >= 0) caps[mon + 1] = `${caps[mon + 1]}, allow service mds r, allow command "fs dump"`;
  return [...caps, 'mds', 'allow *'];
}

/** Every client session of every active MDS of the file system. Throws when an MDS cannot say. */
export async function mdsSessions(identity: CephIdentity, fsName: string): Promise<MdsSession[]> {
  const sessions: MdsSession[] = [];
  for (const mds of await activeMds(identity, fsName)) {
    const { stdout } = await ceph(identity, ['tell', `mds.${mds}`, 'client', 'ls', '--format', 'json']);
    const list = JSON.parse(stdout) as { id?: unknown; inst?: unknown; client_metadata?: { entity_id?: unknown; root?: unknown } }[];
    for (const s of list) {
      // inst: "client.4170 v1:127.0.0.1:0/2613773025"
      const address = typeof s.inst === 'string' ? /\s(?:v[12]:)?([0-9.]+:[0-9]+\/[0-9]+)$/.exec(s.inst)?.[1] : undefined;
      if (typeof s.id !== 'number') continue;
      sessions.push({
        mds,
        id: s.id,
        // Listed all the same: a fence must not overlook a session it cannot name (it refuses then).
        address: address ?? '',
        entity: typeof s.client_metadata?.entity_id === 'string' ? s.client_metadata.entity_id : '',
        root: typeof s.client_metadata?.root === 'string' ? s.client_metadata.root : '',
      });
    }
  }
  return sessions;
}

/** `ceph tell mds.X client evict id=N`: the MDS drops the session and blocklists the client instance. */
export async function mdsEvict(identity: CephIdentity, session: MdsSession): Promise<void> {
  await ceph(identity, ['tell', `mds.${session.mds}`, 'client', 'evict', `id=${session.id}`]);
}

/** The volume's client record file, if a mount left one: the address it was mounted with. */
export async function readClientRecord(file: string): Promise<string | undefined> {
  const text = await readFile(file, 'utf8').catch(() => '');
  const addr = text.trim();
  return /^[0-9.]+:[0-9]+\/[0-9]+$/.test(addr) ? addr : undefined;
}
