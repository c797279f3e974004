// The `rbd` command line tool, as one cephx identity of one cluster: every call names the conf, the id and the
// keyring file (the key itself never reaches argv, messages or the log) and asks for JSON where there is output.
import { chmod, writeFile } from 'node:fs/promises';
import { LatchError } from '../errors.js';
import { CommandError, run, runStreaming, type RunResult, type StreamingChild } from './run.js';

/** Who talks to which cluster. */
export interface CephIdentity {
  /** The cluster's conf file. */
  cephConf: string;
  /** The cephx id without `client.`. */
  clientId: string;
  /** The keyring file of that id. */
  keyring: string;
  /**
   * Deadline of each rbd and ceph child run as this identity whose call names none: the configuration's
   * commandTimeout; without it, run()'s default.
   */
  commandTimeoutMs?: number;
}

export interface RbdImageInfo {
  size: number;
  features: string[];
  /**
   * Ceph's ID of the image, made when the image was (a new image of the same name has another): with a snapshot's ID
   * it names that snapshot for good (RbdBackend.snapshotIds). Undefined when rbd printed none that looks like one.
   */
  id?: string;
}

// Ceph's errno values as the rbd tool's exit codes.
const ENOENT = 2;
const EEXIST = 17;

/** `--conf C --id ID --keyring FILE`: the options every Ceph client (rbd, rbd-fuse, ceph) takes. */
export function cephClientArgs(identity: CephIdentity): string[] {
  return ['--conf', identity.cephConf, '--id', identity.clientId, '--keyring', identity.keyring];
}

/**
 * Ceph prints a keyring's offending line when it cannot parse it (`type=key val=AQ...`): every message that may carry
 * a Ceph tool's output goes through this first.
 */
export function redactKeys(text: string): string {
  return text.replace(/(val=)\S+/g, '$1[redacted]').replace(/AQ[A-Za-z0-9+/]{20,}={0,2}/g, '[redacted]');
}

/** A CommandError from a Ceph tool with any key material taken out of its message and output. */
export function redactedError(err: unknown): unknown {
  if (!(err instanceof CommandError)) return err;
  return new CommandError(
    redactKeys(err.message),
    {
      command: err.command,
      args: err.args,
      exitCode: err.exitCode,
      signal: err.signal,
      stderrTail: redactKeys(err.stderrTail),
      timedOut: err.timedOut,
      durationMs: err.durationMs,
    },
    { cause: undefined },
  );
}

async function rbd(identity: CephIdentity, args: string[], okExitCodes: number[] = [], timeoutMs?: number): Promise<RunResult> {
  try {
    return await run('rbd', [...cephClientArgs(identity), ...args], { okExitCodes, timeoutMs: timeoutMs ?? identity.commandTimeoutMs });
  } catch (err) {
    throw redactedError(err);
  }
}

function imageSpec(pool: string, image: string): string {
  return `${pool}/${image}`;
}

function parseJson<T>(what: string, stdout: string): T {
  try {
    return JSON.parse(stdout) as T;
  } catch (err) {
    throw new LatchError(`${what} printed something that is not JSON: ${stdout.slice(0, 120)}`, { cause: err });
  }
}

/** `rbd info`: the image's size and features, or undefined when it does not exist. */
export async function rbdInfo(identity: CephIdentity, pool: string, image: string): Promise<RbdImageInfo | undefined> {
  const { stdout, exitCode } = await rbd(identity, ['info', '--format', 'json', imageSpec(pool, image)], [ENOENT]);
  if (exitCode === ENOENT) return undefined;
  const info = parseJson<{ size?: unknown; features?: unknown; id?: unknown }>(`rbd info ${imageSpec(pool, image)}`, stdout);
  if (typeof info.size !== 'number') throw new LatchError(`rbd info ${imageSpec(pool, image)} reported no size`);
  return {
    size: info.size,
    features: Array.isArray(info.features) ? info.features.map(String) : [],
    ...(typeof info.id === 'string' && /^[0-9a-f]{1,64}$/.test(info.id) && { id: info.id }),
  };
}

/**
 * `rbd create --size <bytes>B`: rbd reads a bare number as MiB, so the size always carries the B suffix. Returns false
 * when the image already exists (its size is the caller's to check).
 */
export async function rbdCreate(identity: CephIdentity, pool: string, image: string, sizeBytes: number): Promise<boolean> {
  const { exitCode } = await rbd(identity, ['create', '--size', `${sizeBytes}B`, imageSpec(pool, image)], [EEXIST]);
  return exitCode !== EEXIST;
}

/** `rbd resize --size <bytes>B`, which refuses to shrink (no --allow-shrink, ever). */
export async function rbdResize(identity: CephIdentity, pool: string, image: string, sizeBytes: number): Promise<void> {
  await rbd(identity, ['resize', '--no-progress', '--size', `${sizeBytes}B`, imageSpec(pool, image)]);
}

/** `rbd rm`; a missing image is fine. */
export async function rbdRemove(identity: CephIdentity, pool: string, image: string): Promise<void> {
  await rbd(identity, ['rm', '--no-progress', imageSpec(pool, image)], [ENOENT]);
}

/** The image's snapshots (every namespace: user snapshots, and those in the trash that clones still depend on). */
export async function rbdSnapshots(identity: CephIdentity, pool: string, image: string): Promise<string[]> {
  const { stdout } = await rbd(identity, ['snap', 'ls', '--all', '--format', 'json', imageSpec(pool, image)]);
  const snaps = parseJson<{ name?: unknown; namespace?: { type?: unknown } }[]>(`rbd snap ls ${imageSpec(pool, image)}`, stdout);
  return snaps.map((snap) => {
    const name = typeof snap.name === 'string' ? snap.name : '(unnamed)';
    const namespace = typeof snap.namespace?.type === 'string' ? snap.namespace.type : 'user';
    return namespace === 'user' ? name : `${name} (${namespace})`;
  });
}

/** The clones made from any of the image's snapshots, and theirs, as pool/image. */
export async function rbdClones(identity: CephIdentity, pool: string, image: string): Promise<string[]> {
  const { stdout } = await rbd(identity, ['children', '--all', '--descendants', '--format', 'json', imageSpec(pool, image)]);
  const children = parseJson<{ pool?: unknown; pool_namespace?: unknown; image?: unknown }[]>(
    `rbd children ${imageSpec(pool, image)}`,
    stdout,
  );
  return children.map((c) => [c.pool, c.pool_namespace, c.image].filter((p) => typeof p === 'string' && p.length > 0).join('/'));
}

// ---- who has an image open, and fencing them ---------------------------------------------------------------------

/**
 * A client instance as Ceph names it on the wire and in the blocklist: `IP:PORT/NONCE` (IPv6 in brackets). A nonce
 * of 0 or a bare IP would match every client of a host, so neither is ever accepted as a fence target.
 */
const CLIENT_INSTANCE = /^(?:[0-9]{1,3}(?:\.[0-9]{1,3}){3}|\[[0-9a-fA-F:.]+\]):[0-9]{1,5}\/[1-9][0-9]{0,19}$/;

export function isClientInstance(address: string): boolean {
  return CLIENT_INSTANCE.test(address);
}

function checkClientInstance(address: string): string {
  if (!isClientInstance(address)) {
    throw new LatchError(`${JSON.stringify(address)} is not a single Ceph client instance (IP:PORT/NONCE with a non-zero nonce)`);
  }
  return address;
}

/** A client with the image open, as `rbd status` lists it: its instance address and the global id of its session. */
export interface RbdWatcher {
  address: string;
  globalId?: number;
}

/**
 * The image's watchers (every client that has it open), from `rbd status`; [] when the image is gone. Any other
 * failure throws: an empty list must mean the cluster said nobody has it open.
 */
export async function rbdWatcherList(identity: CephIdentity, pool: string, image: string): Promise<RbdWatcher[]> {
  const { stdout, exitCode } = await rbd(identity, ['status', '--format', 'json', imageSpec(pool, image)], [ENOENT]);
  if (exitCode === ENOENT) return [];
  const status = parseJson<{ watchers?: { address?: unknown; client?: unknown }[] }>(`rbd status ${imageSpec(pool, image)}`, stdout);
  // A watcher whose address is not a string is kept as what it is, for the fencer to refuse by name, never dropped.
  return (status.watchers ?? []).map((w) => ({
    address: typeof w.address === 'string' ? w.address : JSON.stringify(w.address ?? null),
    ...(typeof w.client === 'number' && { globalId: w.client }),
  }));
}

/** A librbd option set on an image's pool or on the image itself (`rbd config pool|image set`). */
export interface RbdConfigOverride {
  source: 'pool' | 'image';
  value: string;
}

/**
 * `option` as the image's pool or the image itself sets it, from `rbd config image list` (which also lists the rbd
 * tool's own conf values: those are left out), or undefined when neither sets it. librbd applies these when it opens
 * the image, over its own conf and command line.
 */
export async function rbdConfigOverride(
  identity: CephIdentity,
  pool: string,
  image: string,
  option: string,
): Promise<RbdConfigOverride | undefined> {
  const spec = imageSpec(pool, image);
  const { stdout } = await rbd(identity, ['config', 'image', 'list', '--format', 'json', spec]);
  const entries = parseJson<unknown>(`rbd config image list ${spec}`, stdout);
  if (!Array.isArray(entries)) throw new LatchError(`rbd config image list ${spec} printed no list`);
  for (const entry of entries as { name?: unknown; value?: unknown; source?: unknown }[]) {
    if (entry?.name !== option || (entry.source !== 'pool' && entry.source !== 'image')) continue;
    return { source: entry.source, value: String(entry.value) };
  }
  return undefined;
}

/** The addresses of the image's watchers (rbdWatcherList). */
export async function rbdWatchers(identity: CephIdentity, pool: string, image: string): Promise<string[]> {
  return (await rbdWatcherList(identity, pool, image)).map((w) => w.address);
}

/** One lock on an image as `rbd lock ls` shows it: its id (`auto <handle>` for the exclusive lock), holder and address. */
export interface RbdLock {
  id: string;
  locker: string;
  address: string;
}

/**
 * The image's locks (the exclusive lock of its last writer), from `rbd lock ls`. The record stays in the image header
 * after its holder died or was cut off: the most durable trace of a writer.
 */
export async function rbdLocks(identity: CephIdentity, pool: string, image: string): Promise<RbdLock[]> {
  const { stdout, exitCode } = await rbd(identity, ['lock', 'ls', '--format', 'json', imageSpec(pool, image)], [ENOENT]);
  if (exitCode === ENOENT || stdout.trim() === '') return [];
  type Listed = { id?: unknown; locker?: unknown; address?: unknown };
  // Ceph 16 prints a list; older releases an object keyed by the lock id.
  const locks = parseJson<Listed[] | Record<string, Listed>>(`rbd lock ls ${imageSpec(pool, image)}`, stdout);
  const entries: [unknown, Listed][] = Array.isArray(locks) ? locks.map((l) => [l.id, l]) : Object.entries(locks);
  // A lock whose address is not a string is kept as what it is, for the fencer to refuse by name, never dropped.
  return entries.map(([id, l]) => ({
    id: String(id),
    locker: String(l.locker),
    address: typeof l.address === 'string' ? l.address : JSON.stringify(l.address ?? null),
  }));
}

/** The client instances holding a lock on the image (rbdLocks' addresses). */
export async function rbdLockers(identity: CephIdentity, pool: string, image: string): Promise<string[]> {
  return (await rbdLocks(identity, pool, image)).map((l) => l.address);
}

/**
 * `rbd lock rm`: breaks a lock whose holder is gone. librbd blocklists the holder first unless the identity's conf
 * says `rbd_blocklist_on_break_lock = false`, which a node's must (a node may not blocklist; docs/operations.md). A
 * lock already gone is fine.
 */
export async function rbdLockRemove(identity: CephIdentity, pool: string, image: string, lock: RbdLock): Promise<void> {
  await rbd(identity, ['lock', 'rm', imageSpec(pool, image), lock.id, lock.locker], [ENOENT]);
}

// ---- the kernel client (krbd) ------------------------------------------------------------------------------------

/**
 * `rbd device map -t krbd -o OPTIONS POOL/IMAGE`: the kernel maps the image and rbd waits for udev's /dev node. The
 * key goes from the keyring file to the kernel's keyring, never to argv. The device it prints is not taken: the
 * caller finds the mapping in sysfs, as every later call does.
 */
export async function rbdDeviceMap(
  identity: CephIdentity,
  pool: string,
  image: string,
  options: string[],
  timeoutMs: number,
): Promise<void> {
  await rbd(identity, ['device', 'map', '--device-type', 'krbd', '--options', options.join(','), imageSpec(pool, image)], [], timeoutMs);
}

/** `rbd device unmap -t krbd DEVICE`: removes the mapping through /sys/bus/rbd/remove; fails while the device is open. */
export async function rbdDeviceUnmap(identity: CephIdentity, device: string, timeoutMs: number): Promise<void> {
  await rbd(identity, ['device', 'unmap', '--device-type', 'krbd', device], [], timeoutMs);
}

/**
 * `ceph ARGS` as `identity`, its key kept out of errors; the identity's deadline unless `timeoutMs` names another.
 * The one way latch runs the ceph tool (sys/cephfs.ts too).
 */
export async function ceph(identity: CephIdentity, args: string[], okExitCodes: number[] = [], timeoutMs?: number): Promise<RunResult> {
  try {
    return await run('ceph', [...cephClientArgs(identity), ...args], { okExitCodes, timeoutMs: timeoutMs ?? identity.commandTimeoutMs });
  } catch (err) {
    throw redactedError(err);
  }
}

/**
 * `ceph osd blocklist add ADDR SECONDS`: from the moment it returns, the OSDs refuse every operation of that one
 * client instance (measured: its next write fails within 20 ms). Adding an existing entry again is fine.
 */
export async function cephBlocklistAdd(identity: CephIdentity, address: string, seconds: number): Promise<void> {
  await ceph(identity, ['osd', 'blocklist', 'add', checkClientInstance(address), String(Math.floor(seconds))]);
}

/** `ceph osd blocklist rm ADDR`; an address that is not blocklisted is fine. */
export async function cephBlocklistRemove(identity: CephIdentity, address: string): Promise<void> {
  await ceph(identity, ['osd', 'blocklist', 'rm', checkClientInstance(address)]);
}

/** The blocklisted client instances. */
export async function cephBlocklist(identity: CephIdentity): Promise<string[]> {
  const { stdout } = await ceph(identity, ['osd', 'blocklist', 'ls', '--format', 'json']);
  // Ceph 16 prints the instance list and then the range list, two JSON documents on one line: "[...][]".
  const text = stdout.trim();
  for (let end = text.indexOf(']'); end !== -1; end = text.indexOf(']', end + 1)) {
    let entries: unknown;
    try {
      entries = JSON.parse(text.slice(0, end + 1));
    } catch {
      continue;
    }
    if (!Array.isArray(entries)) break;
    return entries.map((e: { addr?: unknown }) => e.addr).filter((a): a is string => typeof a === 'string');
  }
  if (text === '') return [];
  throw new LatchError(`ceph osd blocklist ls printed something that is not a JSON list: ${text.slice(0, 120)}`);
}

/**
 * `ceph auth get-or-create ENTITY CAPS... -o FILE` as an identity with auth caps (an admin's): the key goes from Ceph
 * straight into FILE, made 0600 before, and never through this process.
 */
export async function cephAuthGetOrCreate(admin: CephIdentity, entity: string, caps: string[], file: string): Promise<void> {
  await writeFile(file, '', { mode: 0o600 });
  await chmod(file, 0o600);
  await ceph(admin, ['auth', 'get-or-create', entity, ...caps, '-o', file]);
}

/** Whether the cluster knows the entity (`ceph auth get`, whose output, a keyring, is dropped unread). */
export async function cephAuthExists(admin: CephIdentity, entity: string): Promise<boolean> {
  return (await ceph(admin, ['auth', 'get', entity, '-o', '/dev/null'], [ENOENT])).exitCode !== ENOENT;
}

/** `ceph auth rm ENTITY`; a missing entity is fine. */
export async function cephAuthRemove(admin: CephIdentity, entity: string): Promise<void> {
  await ceph(admin, ['auth', 'rm', entity]);
}

/**
 * The caps of a node's identity (docs/design/rbd-backend.md, e): what `profile rbd` gives on the monitor minus its
 * grant to blocklist anyone, and rbd on latch's pool only. Its conf must say `rbd_blocklist_on_break_lock = false`.
 */
export function nodeCaps(pool: string): string[] {
  return ['mon', 'allow service mon r, allow service osd r, allow service pg r', 'osd', `profile rbd pool=${pool}`];
}

/**
 * The caps of the fencer: blocklist entries for single IPv4 client instances only (no host, no range), monitor
 * sessions, and reading the pool's watchers and locks; it cannot write images.
 */
export function fencerCaps(pool: string): string[] {
  return [
    'mon',
    'allow service mon r, allow service osd r, allow command "osd blocklist" with addr regex "^[0-9.]+:[0-9]+/[1-9][0-9]*$", ' +
      'allow command "sessions", allow command "get_command_descriptions"',
    'osd',
    `profile rbd-read-only pool=${pool}`,
  ];
}

export interface RbdSnapshot {
  name: string;
  /** Ceph's id of the snapshot: ids only grow and are never given again, so a larger one was taken later. */
  id: number;
  size: number;
  /** When it was taken, as rbd prints it (a date string), if it does. */
  timestamp?: string;
}

/** `rbd snap create pool/image@snap`; returns false when a snapshot of that name already exists. */
export async function rbdSnapCreate(identity: CephIdentity, pool: string, image: string, snap: string): Promise<boolean> {
  const { exitCode } = await rbd(identity, ['snap', 'create', '--no-progress', `${imageSpec(pool, image)}@${snap}`], [EEXIST]);
  return exitCode !== EEXIST;
}

/** The image's user snapshots, oldest first; an image that does not exist has none. */
export async function rbdSnapList(identity: CephIdentity, pool: string, image: string): Promise<RbdSnapshot[]> {
  const { stdout, exitCode } = await rbd(identity, ['snap', 'ls', '--format', 'json', imageSpec(pool, image)], [ENOENT]);
  if (exitCode === ENOENT) return [];
  const snaps = parseJson<{ id?: unknown; name?: unknown; size?: unknown; timestamp?: unknown }[]>(
    `rbd snap ls ${imageSpec(pool, image)}`,
    stdout,
  );
  return snaps.flatMap((s) =>
    typeof s.name === 'string'
      ? [
          {
            name: s.name,
            id: typeof s.id === 'number' ? s.id : -1,
            size: typeof s.size === 'number' ? s.size : 0,
            ...(typeof s.timestamp === 'string' && { timestamp: s.timestamp }),
          },
        ]
      : [],
  );
}

/** `rbd snap rm pool/image@snap`; a missing snapshot (or image) is fine. */
export async function rbdSnapRemove(identity: CephIdentity, pool: string, image: string, snap: string): Promise<void> {
  await rbd(identity, ['snap', 'rm', '--no-progress', `${imageSpec(pool, image)}@${snap}`], [ENOENT]);
}

/** `rbd du`: bytes used by the image and by each of its snapshots (by name; the head image under ''). */
export async function rbdUsage(identity: CephIdentity, pool: string, image: string): Promise<Map<string, number>> {
  const { stdout } = await rbd(identity, ['du', '--format', 'json', imageSpec(pool, image)]);
  const du = parseJson<{ images?: { name?: unknown; snapshot?: unknown; used_size?: unknown }[] }>(
    `rbd du ${imageSpec(pool, image)}`,
    stdout,
  );
  const used = new Map<string, number>();
  for (const entry of du.images ?? []) {
    if (typeof entry.used_size !== 'number') continue;
    used.set(typeof entry.snapshot === 'string' ? entry.snapshot : '', entry.used_size);
  }
  return used;
}

/** `rbd export pool/image@snap FILE`: the snapshot's bytes into a local (sparse) file; `timeoutMs` bounds it. */
export async function rbdExportSnapshot(
  identity: CephIdentity,
  pool: string,
  image: string,
  snap: string,
  file: string,
  timeoutMs: number,
): Promise<void> {
  await rbd(identity, ['export', '--no-progress', `${imageSpec(pool, image)}@${snap}`, file], [], timeoutMs);
}

/**
 * `rbd export-diff [--from-snap FROM] pool/image@snap -`: the snapshot's allocated extents (or, from FROM, those that
 * changed since FROM) in Ceph's diff format (sys/rbd-diff.ts parses it) on the child's stdout, read by librbd straight
 * from the OSDs; nothing is written locally. `timeoutMs` bounds the whole stream.
 */
export function rbdExportDiff(
  identity: CephIdentity,
  pool: string,
  image: string,
  snap: string,
  fromSnap: string | undefined,
  timeoutMs: number,
): StreamingChild {
  const from = fromSnap === undefined ? [] : ['--from-snap', fromSnap];
  const child = runStreaming(
    'rbd',
    [...cephClientArgs(identity), 'export-diff', '--no-progress', ...from, `${imageSpec(pool, image)}@${snap}`, '-'],
    { timeoutMs },
  );
  const done = child.done.catch((err: unknown) => {
    throw redactedError(err);
  });
  done.catch(() => undefined);
  return { ...child, done };
}

/**
 * `rbd diff --whole-object pool/image`: the image's own allocated extents (objects, from the object map where it has
 * one: conservative while another client writes, since librbd marks an object before writing it), as lines
 * `OFFSET LENGTH data|zero` after a header, streamed. `timeoutMs` bounds the whole listing.
 */
export function rbdAllocation(identity: CephIdentity, pool: string, image: string, timeoutMs: number): StreamingChild {
  const child = runStreaming('rbd', [...cephClientArgs(identity), 'diff', '--whole-object', imageSpec(pool, image)], { timeoutMs });
  const done = child.done.catch((err: unknown) => {
    throw redactedError(err);
  });
  done.catch(() => undefined);
  return { ...child, done };
}
