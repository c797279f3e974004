// The kernel rbd client (krbd): `rbd device map` makes the image /dev/rbdID, served by the kernel itself, with no
// daemon to outlive a call or to be killed with kubelet's cgroup, and no FUSE hop (docs/performance.md, "rbd").
//
// What is mapped is read from the kernel, never remembered: one directory per mapping, /sys/bus/rbd/devices/ID/,
// says pool, pool_ns, name and current_snap ('-' for the image itself), which is what `rbd device list` matches on.
// sysfs reads answer from the kernel's memory and never wait on the cluster, so they are read inline, as
// src/sys/loop.ts reads loop devices. Whatever talks to the cluster (map, unmap, a size refresh) runs in a child
// with a deadline.
//
// Two map options matter (docs/design/rbd-backend.md, g):
//  - noshare: without it every krbd mapping of the node shares one client instance, and fencing one volume's
//    client (one blocklist entry, IP:PORT/NONCE) would cut off all of them;
//  - exclusive, for a read-write mapping of an image with the exclusive-lock feature: the kernel takes the lock at
//    map time and never hands it to a peer that asks, so a second writer that slipped past the ledger fails its
//    writes instead of sharing the image (without it the lock goes back and forth between both). Not for a
//    read-only mapping: several nodes map a read-only-many volume at once, and krbd takes the lock only to write.
//    An image without the feature has no lock to take (the kernel refuses the option then); the fence and the
//    backend's check of the image's watchers before a read-write map are what keep a second writer off it.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { realpath } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { LatchError } from '../errors.js';
import { waitNoFilesystemLeft } from '../sys/blockdev.js';
import { mountedSources } from '../sys/mounts.js';
import {
  isClientInstance,
  rbdDeviceMap,
  rbdDeviceUnmap,
  rbdInfo,
  rbdLockRemove,
  rbdLocks,
  rbdWatchers,
  type CephIdentity,
} from '../sys/rbd.js';
import { CommandError, run } from '../sys/run.js';
import { deviceToUse, keepOneDevice } from './devices.js';
import type { NodeClient } from './node-client.js';

export interface KernelRbdOptions {
  identity: CephIdentity;
  pool: string;
  /** Deadline of each child that talks to the cluster (the config's commandTimeout). */
  timeoutMs: number;
  /** Where sysfs is: /sys, except in tests. */
  sysRoot?: string;
}

/** A krbd mapping of an image of latch's pool (not of a snapshot), from /sys/bus/rbd/devices/ID. */
export interface KrbdMapping {
  id: number;
  device: string;
  image: string;
}

const KRBD_DEVICE = /^\/dev\/rbd([0-9]+)$/;
// The kernel learns a new size from the image header's watch within milliseconds of `rbd resize`; after this long
// it is told to read the header again.
const REFRESH_AFTER_MS = 1_000;

export class KernelRbdClient implements NodeClient {
  readonly kind = 'krbd';
  private readonly busDir: string;
  private readonly devicesDir: string;

  constructor(private readonly options: KernelRbdOptions) {
    this.busDir = join(options.sysRoot ?? '/sys', 'bus/rbd');
    this.devicesDir = join(this.busDir, 'devices');
  }

  async map(image: string, mode: { readOnly: boolean }): Promise<string> {
    const existing = this.mappingsOf(image);
    if (existing.length > 0) return this.keepOne(existing);
    if (!existsSync(this.busDir)) {
      // rbd itself says only "map failed: (2) No such file or directory"; and no lock is broken for a map that cannot be.
      throw new LatchError(
        `cannot map ${this.spec(image)} with the kernel rbd client: this kernel has no rbd module (${this.busDir} is missing); ` +
          `load it (modprobe rbd), or set backend.client to "rbd-fuse" while no volume is mapped on this node`,
      );
    }
    const { identity, pool, timeoutMs } = this.options;
    const options = ['noshare'];
    if (!mode.readOnly) {
      await this.breakDeadLocks(image);
      const info = await rbdInfo(identity, pool, image);
      if (info?.features.includes('exclusive-lock')) options.push('exclusive');
    }
    try {
      await rbdDeviceMap(identity, pool, image, options, timeoutMs);
    } catch (err) {
      // A map that overran its deadline may still finish in the kernel: nothing of it may be handed out half-made,
      // and nothing mounts a mapping made by this call yet.
      for (const m of this.mappingsOf(image)) await this.unmapOne(m).catch(() => undefined);
      throw explainMapFailure(err, this.spec(image));
    }
    const mapped = this.mappingsOf(image);
    if (mapped.length === 0) throw new LatchError(`rbd device map ${this.spec(image)} succeeded, but /sys/bus/rbd shows no mapping of it`);
    return this.keepOne(mapped);
  }

  async deviceOf(image: string): Promise<string | undefined> {
    return (await deviceToUse(this.mappingsOf(image)))?.device;
  }

  async imageOf(device: string): Promise<string | undefined> {
    let real = device;
    try {
      real = await realpath(device);
    } catch {
      // gone: sysfs decides
    }
    const match = KRBD_DEVICE.exec(real);
    if (!match) return undefined;
    return readMapping(this.devicesDir, Number(match[1]), this.options.pool)?.image;
  }

  async isMapped(image: string): Promise<boolean> {
    return this.mappingsOf(image).length > 0;
  }

  async unmap(image: string): Promise<void> {
    const mappings = this.mappingsOf(image);
    const mounted = await mountedSources();
    const busy = mappings.filter((m) => mounted.has(m.device));
    if (busy.length > 0) {
      throw new LatchError(`${busy.map((m) => m.device).join(', ')} of ${this.spec(image)} is still mounted; unmount it first`);
    }
    for (const m of mappings) await waitNoFilesystemLeft(m.device, `${m.device} of ${this.spec(image)}`);
    for (const m of mappings) await this.unmapOne(m);
    const left = this.mappingsOf(image);
    if (left.length > 0) throw new LatchError(`releasing ${this.spec(image)} left ${left.map((m) => m.device).join(', ')} mapped`);
  }

  /**
   * Nothing to do: once the OSDs refuse this client (blocklisted), they answer its requests with an error and the
   * kernel fails them, so no wait on it lasts. (rbd-fuse needs its FUSE connection aborted for the same.)
   */
  async abort(): Promise<void> {}

  async refreshSize(image: string, sizeBytes: number): Promise<void> {
    const deadline = Date.now() + this.options.timeoutMs;
    for (const m of this.mappingsOf(image)) {
      const started = Date.now();
      let refreshed = false;
      while (this.sizeOf(m.id) < sizeBytes) {
        if (Date.now() >= deadline) {
          throw new LatchError(
            `${m.device} of ${this.spec(image)} still shows ${this.sizeOf(m.id)} bytes after the image grew to ${sizeBytes}`,
          );
        }
        if (!refreshed && Date.now() - started >= REFRESH_AFTER_MS) {
          // The write makes the kernel read the header from the cluster: in a child, so that it cannot hang the call.
          const refresh = join(this.devicesDir, String(m.id), 'refresh');
          await run('tee', [refresh], { input: '1\n', timeoutMs: Math.max(1_000, deadline - Date.now()) });
          refreshed = true;
        }
        await sleep(50);
      }
    }
  }

  /** The client instance (IP:PORT/NONCE) that serves the image's mapping: exactly what a fence blocklists. */
  async clientAddress(image: string): Promise<string | undefined> {
    const [mapping] = this.mappingsOf(image);
    if (!mapping) return undefined;
    const address = attribute(this.devicesDir, mapping.id, 'client_addr');
    return address !== undefined && isClientInstance(address) ? address : undefined;
  }

  /**
   * Breaks the locks of holders that are gone: a lock whose holder has no watch on the image (a fenced client, whose
   * watch the OSDs dropped, or a dead one whose watch timed out). The kernel would break such a lock itself on its
   * first write, but it blocklists the holder first, which a node's caps refuse, and the write would fail. Only
   * called for a node the ledger lets take the volume up, so any other writer has been fenced or has let go.
   */
  private async breakDeadLocks(image: string): Promise<void> {
    const { identity, pool } = this.options;
    const locks = await rbdLocks(identity, pool, image);
    if (locks.length === 0) return;
    const watchers = new Set(await rbdWatchers(identity, pool, image));
    for (const lock of locks) if (!watchers.has(lock.address)) await rbdLockRemove(identity, pool, image, lock);
  }

  private async unmapOne(m: KrbdMapping): Promise<void> {
    await rbdDeviceUnmap(this.options.identity, m.device, this.options.timeoutMs);
  }

  /** The mapping every caller keeps (deviceInUse); unmounted duplicates are unmapped. */
  private keepOne(mappings: KrbdMapping[]): Promise<string> {
    return keepOneDevice(mappings, (dup) => this.unmapOne(dup));
  }

  /** The image's own mappings (not its snapshots'), lowest id first. */
  private mappingsOf(image: string): KrbdMapping[] {
    return readMappings(this.devicesDir, this.options.pool).filter((m) => m.image === image);
  }

  private sizeOf(id: number): number {
    return Number(attribute(this.devicesDir, id, 'size') ?? 0);
  }

  private spec(image: string): string {
    return `${this.options.pool}/${image}`;
  }
}

/** The kernel's mappings of images of `pool` (what doctor holds against the ledger), lowest id first. */
export function krbdMappings(pool: string, sysRoot = '/sys'): KrbdMapping[] {
  return readMappings(join(sysRoot, 'bus/rbd/devices'), pool);
}

function readMappings(devicesDir: string, pool: string): KrbdMapping[] {
  let ids: string[];
  try {
    ids = readdirSync(devicesDir);
  } catch {
    return []; // no rbd module: nothing mapped
  }
  return ids
    .filter((id) => /^[0-9]+$/.test(id))
    .map(Number)
    .sort((a, b) => a - b)
    .map((id) => readMapping(devicesDir, id, pool))
    .filter((m): m is KrbdMapping => m !== undefined);
}

/** Mapping `id`, if it maps an image of `pool` itself: not a snapshot (current_snap '-'), not in a namespace. */
function readMapping(devicesDir: string, id: number, pool: string): KrbdMapping | undefined {
  const [mapped, image, snapshot] = ['pool', 'name', 'current_snap'].map((name) => attribute(devicesDir, id, name));
  // pool_ns exists since Linux 4.19; before it there were no namespaces. A mapping going away reads as nothing.
  const namespace = attribute(devicesDir, id, 'pool_ns') ?? '';
  if (mapped !== pool || image === undefined || snapshot !== '-' || namespace !== '') return undefined;
  return { id, device: `/dev/rbd${id}`, image };
}

function attribute(devicesDir: string, id: number, name: string): string | undefined {
  try {
    return readFileSync(join(devicesDir, String(id), name), 'utf8').trim();
  } catch {
    return undefined;
  }
}

/**
 * A kernel older than the image's features (object-map, fast-diff, deep-flatten need Linux 5.3) refuses the map, and
 * rbd says why and what to run above its last line, which is all a failed command's message keeps.
 */
function explainMapFailure(err: unknown, spec: string): unknown {
  if (!(err instanceof CommandError)) return err;
  const disable = /rbd feature disable [^"\n]+/.exec(err.stderrTail)?.[0];
  if (disable === undefined) return err;
  return new LatchError(
    `this kernel cannot map ${spec}: it does not support some of the image's features; rbd suggests "${disable}" ` +
      `(optional features; set rbd_default_features for the images still to come)`,
    { cause: err },
  );
}
