// The steps every node-side op is made of, written once: attach mode (waitforattach, mountdevice, unmountdevice),
// non-attach mode (mount, unmount) and resizing (expandfs, `latch volume expand`) compose them.
// Nothing is remembered in memory or in a file of ours: what is set up is read back from the kernel (mountinfo,
// /sys/block/loopN/loop/backing_file) and the ledger, so every step is safe to repeat after a crash or a reboot.
import { createHash } from 'node:crypto';
import { mkdir, readFile, rmdir, stat } from 'node:fs/promises';
import { createServer, type Server } from 'node:net';
import { dirname, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Config } from '../config.js';
import { LatchError, errorMessage } from '../errors.js';
import { isInUse, markAttached, markAttaching, markReleased } from '../ledger/arbitrate.js';
import type { Ledger } from '../ledger/ledger.js';
import type { VolumeDoc } from '../ledger/types.js';
import { formatSize } from '../size.js';
import { growFs, makeFs, probeFsType } from '../sys/blockdev.js';
import { findmnt, isDeviceMounted, mount, mountsAt, readMountInfo, umount, type MountInfo } from '../sys/mounts.js';
import { CommandError } from '../sys/run.js';
import { openBackend, openLedger } from './services.js';

// ---- the grant and the device ----------------------------------------------------------------------------------

/** Claims the ledger's grant for this node (granted -> attaching) in one compare-and-swap; returns the document. */
export async function claimGrant(ledger: Ledger, name: string, node: string): Promise<VolumeDoc | undefined> {
  return ledger.update(name, (d) => (d && markAttaching(d, node, ledger.now())) ?? d);
}

/**
 * After the grant: makes sure the image exists (created only for a volume that never held a filesystem), sets up
 * (or finds) its loop device and records it on the node's entry. If the grant was withdrawn meanwhile, undoes the
 * device unless something already mounted it, and fails. Records the device in `facts` as soon as it is known.
 */
export async function setUpDevice(
  config: Config,
  name: string,
  doc: VolumeDoc,
  facts: Record<string, unknown>,
): Promise<{ device: string; doc: VolumeDoc }> {
  const node = config.nodeName;
  const ledger = await openLedger(config);
  const backend = await openBackend(config);
  if ((await backend.size(name)) === undefined) {
    if (doc.status.filesystem) {
      throw new LatchError(
        `the image of volume ${name} is missing from the pool (${config.poolDir}) although it held a ` +
          `${doc.status.filesystem} filesystem; refusing to create an empty one in its place`,
      );
    }
    await backend.create(name, doc.spec.sizeBytes);
  }
  const device = await backend.attach(name);
  facts.device = device;

  const after = await ledger.update(name, (d) => (d && markAttached(d, node, device, ledger.now())) ?? d);
  if (after?.status.nodes[node]?.phase !== 'attached') {
    // The controller detached it while we were setting up: undo, unless something already mounted the device.
    if (!(await isDeviceMounted(device))) {
      await backend.release(name);
      await ledger.update(name, (d) => (d ? markReleased(d, node, ledger.now()) : d));
    }
    throw new LatchError(`volume ${name} was detached from node ${node} while its device was being set up`);
  }
  return { device, doc: after };
}

/**
 * Releases the volume's device on this node and confirms the release in the ledger, unless the device is still
 * mounted somewhere (then nothing changes and the device is returned: the node keeps its hold).
 */
export async function releaseIfUnmounted(config: Config, name: string): Promise<string | undefined> {
  const backend = await openBackend(config);
  const device = await backend.findDevice(name);
  if (device && (await isDeviceMounted(device))) return device;
  await backend.release(name);
  const ledger = await openLedger(config);
  await ledger.update(name, (d) => (d ? markReleased(d, config.nodeName, ledger.now()) : d));
  return undefined;
}

// ---- filesystems and mounts -------------------------------------------------------------------------------------

export interface VolumeMountRequest {
  /** The filesystem asked for (options), if any: a different one on the device is refused. */
  fsType: string | undefined;
  mountOptions: string[];
  /** Mount read-only. */
  readOnly: boolean;
  /** A blank device may be formatted (false for read-only requests: there would be nothing to read). */
  mayFormat: boolean;
}

/**
 * Mounts the volume's `device` at `path` (a directory, created with `dirMode` when missing): the filesystem on the
 * device, or a new one when (and only when) the device is blank; checked with findmnt afterwards. Returns
 * 'already' when the device is already mounted there. Refuses to mount over anything else.
 */
export async function mountVolumeAt(
  config: Config,
  doc: VolumeDoc,
  device: string,
  path: string,
  request: VolumeMountRequest,
  dirMode = 0o750,
): Promise<'mounted' | 'already'> {
  const name = doc.name;
  await ensureDirectory(path, dirMode);

  const mounted = await mountsAt(path);
  if (mounted.length > 0) {
    const top = mounted[mounted.length - 1]!;
    if (top.source === device) return 'already';
    throw new LatchError(`${path} already has ${top.source} mounted; not mounting volume ${name} over it`);
  }

  const fsType = await ensureFilesystem(doc, device, request.fsType, !request.mayFormat, config.nodeName);
  if (doc.status.filesystem !== fsType) {
    const ledger = await openLedger(config);
    await ledger.update(name, (d) => (d && d.status.filesystem !== fsType ? { ...d, status: { ...d.status, filesystem: fsType } } : d));
  }

  await mount(device, path, { fsType, options: request.mountOptions, readOnly: request.readOnly });
  const check = await findmnt(path);
  if (check?.source !== device) {
    await umount(path);
    throw new LatchError(`after mounting, findmnt shows ${check?.source ?? 'nothing'} at ${path} instead of ${device}; undone`);
  }
  return 'mounted';
}

/** Returns the filesystem to mount: the one on the device, or a new one when (and only when) the device is blank. */
export async function ensureFilesystem(
  doc: VolumeDoc,
  device: string,
  wanted: string | undefined,
  readOnly: boolean,
  node: string,
): Promise<string> {
  const found = await probeFsType(device);
  if (found) {
    if (wanted && wanted !== found) {
      throw new LatchError(`volume ${doc.name} holds a ${found} filesystem, but ${wanted} was asked for; latch never reformats a volume`);
    }
    return found;
  }
  if (doc.status.filesystem) {
    throw new LatchError(
      `volume ${doc.name} held a ${doc.status.filesystem} filesystem but its device shows none now; ` +
        'refusing to format it (inspect the image before anything else)',
    );
  }
  if (readOnly) {
    throw new LatchError(
      `volume ${doc.name} is blank and was asked for read-only: there is nothing to mount; attach it read-write once to format it`,
    );
  }
  const others = Object.keys(doc.status.nodes).filter((n) => n !== node);
  if (others.length > 0) {
    throw new LatchError(`volume ${doc.name} is blank but also held by ${others.join(', ')}; refusing to format it`);
  }
  const fsType = wanted ?? doc.spec.fsType;
  await makeFs(device, fsType);
  return fsType;
}

/** Makes `path` a directory (with `mode`, parents too) unless it is one; refuses anything else in its place. */
export async function ensureDirectory(path: string, mode = 0o750): Promise<void> {
  const info = await stat(path).catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return undefined;
    throw err;
  });
  if (!info) await mkdir(path, { recursive: true, mode });
  else if (!info.isDirectory()) throw new LatchError(`mount path ${path} exists and is not a directory`);
}

/** Unmounts every mount stacked at `path` (a bounded number); returns how many went. Nothing mounted: 0. */
export async function umountAll(path: string): Promise<number> {
  let count = 0;
  while (count < 16 && (await umount(path))) count++;
  return count;
}

// ---- non-attach mode: staging path, per-pod tickets ---------------------------------------------------------

/**
 * The node-private staging mount of a volume in non-attach mode: `<stateDir>/staging/<node>/<volume>`. Every pod
 * on the node bind-mounts from it. The node name is part of the path so that simulated nodes sharing a stateDir
 * (tests, the demo) never share a staging mount.
 */
export function stagingPath(config: Pick<Config, 'stateDir' | 'nodeName'>, name: string): string {
  return join(config.stateDir, 'staging', config.nodeName, name);
}

// kubelet's pod volume dir: <root>/pods/<podUID>/volumes/<vendor~driver>/<name>
const POD_VOLUME_DIR = /\/pods\/([^/]+)\/volumes\/[^/]+\/[^/]+$/;

/**
 * What identifies the pod a pod volume dir belongs to, from the path alone (unmount gets nothing else): the pod
 * UID in kubelet's layout, else the whole path.
 */
export function podKeyOf(podDir: string): string {
  return POD_VOLUME_DIR.exec(podDir)?.[1] ?? podDir;
}

/**
 * The workload ticket of one pod on one node (non-attach mode has one ticket per pod, so `latch ticket list` shows
 * every pod using the volume). Deterministic like attach mode's node tickets, which hash
 * pvOrVolumeName + driverName + nodeName: this adds the pod key, so the two never collide.
 */
export function podTicketId(pvName: string, driverName: string, node: string, podKey: string): string {
  return `workload-${createHash('sha256').update(`${pvName}${driverName}${node}\0pod\0${podKey}`).digest('hex')}`;
}

/**
 * The volume is no longer wanted on this node by any ticket: unmount the staging path, then release the device and
 * confirm it in the ledger. Returns the device when it is still mounted elsewhere (kept; the node keeps its hold,
 * so no other node can take the volume over while something here may still write to it).
 */
export async function leaveNode(config: Config, name: string): Promise<string | undefined> {
  const staging = stagingPath(config, name);
  await umountAll(staging);
  await rmdir(staging).catch(() => undefined);
  await rmdir(dirname(staging)).catch(() => undefined); // the node's staging dir, once empty
  return releaseIfUnmounted(config, name);
}

// ---- resizing -------------------------------------------------------------------------------------------------

const CAP_SYS_RESOURCE = 24;

/** The effective capability mask of this process (from /proc/self/status), or undefined when unreadable. */
export async function effectiveCapabilities(): Promise<bigint | undefined> {
  try {
    return parseCapEff(await readFile('/proc/self/status', 'utf8'));
  } catch {
    return undefined;
  }
}

/** Parses the CapEff line of /proc/<pid>/status. */
export function parseCapEff(status: string): bigint | undefined {
  const match = /^CapEff:\s*([0-9a-fA-F]+)\s*$/m.exec(status);
  return match ? BigInt(`0x${match[1]}`) : undefined;
}

export function hasCapability(mask: bigint, bit: number): boolean {
  return ((mask >> BigInt(bit)) & 1n) === 1n;
}

function isExt(fsType: string): boolean {
  return fsType === 'ext4' || fsType === 'ext3' || fsType === 'ext2';
}

function missingCapMessage(name: string, mask: bigint | undefined): string {
  const shown = mask === undefined ? '' : ` (CapEff ${mask.toString(16).padStart(16, '0')})`;
  return (
    `growing the ext4 filesystem of volume ${name} online needs the capability CAP_SYS_RESOURCE, which this process ` +
    `lacks${shown}: the kernel refuses resize2fs without it. Run latch with CAP_SYS_RESOURCE (a privileged ` +
    "DaemonSet, or the host's root outside a restricted sandbox)"
  );
}

/** Refuses, before anything changes, an online grow the kernel would refuse (ext* without CAP_SYS_RESOURCE). */
export async function checkCanGrowOnline(name: string, fsType: string): Promise<void> {
  if (!isExt(fsType)) return;
  const mask = await effectiveCapabilities();
  if (mask !== undefined && !hasCapability(mask, CAP_SYS_RESOURCE)) {
    throw new LatchError(`${missingCapMessage(name, mask)}; nothing was changed`);
  }
}

/** Where the volume's filesystem is mounted on this node: `hint` when it is a mount of `device`, else a whole-fs mount. */
export async function filesystemMountOf(device: string, hint?: string): Promise<MountInfo | undefined> {
  const table = await readMountInfo();
  const mine = table.filter((m) => m.source === device);
  if (mine.length === 0) return undefined;
  if (hint) {
    const atHint = (await mountsAt(hint, table)).at(-1);
    if (atHint && atHint.source === device && !atHint.options.includes('ro')) return atHint;
  }
  return mine.find((m) => m.root === '/' && !m.options.includes('ro')) ?? mine.find((m) => !m.options.includes('ro')) ?? mine[0];
}

/** Grows the mounted filesystem to fill its device; turns a refused resize2fs into a message that says why. */
export async function growFilesystem(name: string, device: string, where: MountInfo): Promise<void> {
  try {
    await growFs(device, where.mountPoint, where.fsType);
  } catch (err) {
    if (err instanceof CommandError && isExt(where.fsType) && /permission denied|operation not permitted/i.test(err.stderrTail)) {
      throw new LatchError(
        `${missingCapMessage(name, await effectiveCapabilities())}. The image and the device already have the new ` +
          `size; repeating the call with the capability finishes the job (${err.message})`,
        { cause: err },
      );
    }
    throw err;
  }
}

/** Refuses a size request that shrinks the volume or passes maxSize; returns the image's current size. */
export async function checkGrowRequest(config: Config, name: string, newBytes: number): Promise<number | undefined> {
  if (!Number.isSafeInteger(newBytes) || newBytes < 1)
    throw new LatchError(`volume ${name}: new size ${newBytes} is not a positive byte count`);
  if (newBytes > config.maxSize) {
    throw new LatchError(
      `volume ${name}: the new size ${formatSize(newBytes)} is above the limit of ${formatSize(config.maxSize)} (maxSize); nothing was changed`,
    );
  }
  const current = await (await openBackend(config)).size(name);
  if (current !== undefined && newBytes < current) {
    throw new LatchError(
      `volume ${name}: cannot shrink from ${formatSize(current)} to ${formatSize(newBytes)}; volumes only grow (nothing was changed)`,
    );
  }
  return current;
}

/** Records the new size in the ledger (never lowers it). */
export async function recordSize(config: Config, name: string, sizeBytes: number): Promise<void> {
  const ledger = await openLedger(config);
  await ledger.update(name, (d) => (d && d.spec.sizeBytes < sizeBytes ? { ...d, spec: { ...d.spec, sizeBytes } } : d));
}

/**
 * What `latch volume expand` does: grows the image (and the loop device set up on this host); when this node holds
 * the volume mounted read-write, grows its filesystem online too. Returns what was done, for people.
 */
export async function expandVolume(config: Config, name: string, newBytes: number): Promise<string> {
  const node = config.nodeName;
  return withVolumeLock(config, name, async () => {
    const ledger = await openLedger(config);
    const backend = await openBackend(config);
    const doc = await ledger.get(name);
    if (!doc) throw new LatchError(`volume ${name} does not exist (latch volume list shows the volumes)`);
    const current = await checkGrowRequest(config, name, newBytes);
    if (current === undefined) {
      // Never attached yet: the image is made at the ledger's size on first use.
      if (newBytes < doc.spec.sizeBytes) {
        throw new LatchError(
          `volume ${name}: cannot shrink from ${formatSize(doc.spec.sizeBytes)} to ${formatSize(newBytes)}; volumes only grow (nothing was changed)`,
        );
      }
      await recordSize(config, name, newBytes);
      return `volume ${name} has no image yet; it will be made with ${formatSize(newBytes)} on first use`;
    }

    const here = doc.status.nodes[node];
    const device = isInUse(here?.phase) ? await backend.findDevice(name) : undefined;
    const where = device ? await filesystemMountOf(device) : undefined;
    const online = where !== undefined && !here!.readOnly && !where.options.includes('ro');
    if (online) await checkCanGrowOnline(name, where.fsType);

    await backend.grow(name, newBytes);
    await recordSize(config, name, newBytes);
    const done = `volume ${name}: image grown to ${formatSize(newBytes)}`;
    if (online) {
      await growFilesystem(name, device!, where);
      return `${done}; its ${where.fsType} filesystem was grown online on node ${node} (mounted at ${where.mountPoint})`;
    }
    if (where) {
      return `${done}; it is mounted read-only on node ${node}, so its filesystem grows the next time it is expanded while mounted read-write`;
    }
    const holders = Object.entries(doc.status.nodes)
      .filter(([n, e]) => n !== node && e.phase !== 'granted')
      .map(([n]) => n);
    if (holders.length > 0) {
      return (
        `${done}; it is in use on node ${holders.join(', ')}: run "latch volume expand ${name} --size ${newBytes}" ` +
        'there to refresh its device and grow the filesystem online'
      );
    }
    return `${done} (offline: only the image); the filesystem grows online the next time the volume is expanded while mounted (kubelet's expandfs, or this command on that node)`;
  });
}

// ---- a node-local lock per volume ---------------------------------------------------------------------------

const LOCK_WAIT_MS = 4 * 60 * 1000;

/**
 * Runs `fn` while holding this node's lock on the volume, so that mount, unmount and resizing calls for one volume
 * on one node (kubelet runs them for different pods in parallel) never interleave. The lock is an abstract unix
 * socket name: the kernel frees it when the holder exits, even on SIGKILL, so a killed call can never wedge it.
 */
export async function withVolumeLock<T>(
  config: Pick<Config, 'stateDir' | 'nodeName'>,
  name: string,
  fn: () => Promise<T>,
  waitMs = LOCK_WAIT_MS,
): Promise<T> {
  const key = createHash('sha256').update(`${config.stateDir}\0${config.nodeName}\0${name}`).digest('hex').slice(0, 40);
  const address = `\0latch-volume-${key}`;
  const deadline = Date.now() + waitMs;
  let server: Server | undefined;
  for (let attempt = 0; ; attempt++) {
    server = await tryListen(address);
    if (server) break;
    if (Date.now() >= deadline) {
      throw new LatchError(
        `another latch call has been working on volume ${name} on node ${config.nodeName} for over ${Math.round(waitMs / 1000)} s; try again`,
      );
    }
    await sleep(Math.min(200, 10 + attempt * 10));
  }
  try {
    return await fn();
  } finally {
    server.close();
  }
}

function tryListen(address: string): Promise<Server | undefined> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', (err: NodeJS.ErrnoException) => {
      if (err.code === 'EADDRINUSE') resolve(undefined);
      else reject(new LatchError(`cannot take the node-local volume lock: ${errorMessage(err)}`, { cause: err }));
    });
    server.listen({ path: address }, () => {
      server.unref();
      resolve(server);
    });
  });
}
