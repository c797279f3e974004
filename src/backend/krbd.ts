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
//  - not exclusive: `--exclusive` would also keep a live peer from taking the lock, but a read-only volume may be
//    mapped on several nodes at once, and krbd only takes the lock to write. Which node may write is the ledger's,
//    enforced by the fence, as with rbd-fuse.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { realpath } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { LatchError } from '../errors.js';
import { checkNoFilesystemLeft } from '../sys/blockdev.js';
import { mountedSources } from '../sys/mounts.js';
import { isClientInstance, rbdDeviceMap, rbdDeviceUnmap, rbdLockRemove, rbdLocks, rbdWatchers, type CephIdentity } from '../sys/rbd.js';
import { CommandError, run } from '../sys/run.js';
import type { NodeClient } from './node-client.js';

export interface KernelRbdOptions {
  identity: CephIdentity;
  pool: string;
  /** Deadline of each child that talks to the cluster (the config's commandTimeout). */
  timeoutMs: number;
  /** Where sysfs is: /sys, except in tests. */
  sysRoot?: string;
}

/** One krbd mapping, from /sys/bus/rbd/devices/ID. */
interface Mapping {
  id: number;
  device: string;
  pool: string;
  namespace: string;
  image: string;
  snapshot: string;
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

  async map(image: string): Promise<string> {
    const existing = this.mappingsOf(image);
    if (existing.length > 0) return this.keepOne(existing);
    if (!existsSync(this.busDir)) {
      // rbd itself says only "map failed: (2) No such file or directory"; and no lock is broken for a map that cannot be.
      throw new LatchError(
        `cannot map ${this.spec(image)} with the kernel rbd client: this kernel has no rbd module (${this.busDir} is missing); ` +
          `load it (modprobe rbd), or set backend.client to "rbd-fuse" while no volume is mapped on this node`,
      );
    }
    await this.breakDeadLocks(image);
    const { identity, pool, timeoutMs } = this.options;
    try {
      await rbdDeviceMap(identity, pool, image, ['noshare'], timeoutMs);
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
    const mappings = this.mappingsOf(image);
    if (mappings.length <= 1) return mappings[0]?.device;
    const mounted = await mountedSources();
    return (mappings.find((m) => mounted.has(m.device)) ?? mappings[0])?.device;
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
    const mapping = this.readMapping(Number(match[1]));
    return mapping && this.isOurs(mapping) ? mapping.image : undefined;
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
    for (const m of mappings) checkNoFilesystemLeft(m.device, `${m.device} of ${this.spec(image)}`);
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
    const address = this.attribute(mapping.id, 'client_addr');
    return address !== undefined && isClientInstance(address) ? address : undefined;
  }

  /** Every mapping of an image of the pool (not of a snapshot), lowest id first: what doctor holds against the ledger. */
  mapped(): { image: string; device: string }[] {
    return this.mappings()
      .filter((m) => this.isOurs(m))
      .map(({ image, device }) => ({ image, device }));
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

  private async unmapOne(m: Mapping): Promise<void> {
    await rbdDeviceUnmap(this.options.identity, m.device, this.options.timeoutMs);
  }

  /** The mapping every caller keeps (the mounted one, else the lowest-numbered); unmounted duplicates are unmapped. */
  private async keepOne(mappings: Mapping[]): Promise<string> {
    const mounted = await mountedSources();
    const keep = mappings.find((m) => mounted.has(m.device)) ?? mappings[0];
    if (!keep) throw new LatchError('no rbd device to keep');
    for (const dup of mappings) {
      if (dup === keep || mounted.has(dup.device)) continue;
      await this.unmapOne(dup).catch(() => undefined);
    }
    return keep.device;
  }

  /** The image's own mappings (not its snapshots'), lowest id first. */
  private mappingsOf(image: string): Mapping[] {
    return this.mappings().filter((m) => m.image === image && this.isOurs(m));
  }

  private isOurs(m: Mapping): boolean {
    return m.pool === this.options.pool && m.namespace === '' && m.snapshot === '-';
  }

  private mappings(): Mapping[] {
    let ids: string[];
    try {
      ids = readdirSync(this.devicesDir);
    } catch {
      return []; // no rbd module: nothing mapped
    }
    return ids
      .filter((id) => /^[0-9]+$/.test(id))
      .map(Number)
      .sort((a, b) => a - b)
      .map((id) => this.readMapping(id))
      .filter((m): m is Mapping => m !== undefined);
  }

  private readMapping(id: number): Mapping | undefined {
    const [pool, image, snapshot] = ['pool', 'name', 'current_snap'].map((name) => this.attribute(id, name));
    if (pool === undefined || image === undefined || snapshot === undefined) return undefined; // going away
    // pool_ns exists since Linux 4.19; before it there were no namespaces.
    return { id, device: `/dev/rbd${id}`, pool, namespace: this.attribute(id, 'pool_ns') ?? '', image, snapshot };
  }

  private sizeOf(id: number): number {
    return Number(this.attribute(id, 'size') ?? 0);
  }

  private attribute(id: number, name: string): string | undefined {
    try {
      return readFileSync(join(this.devicesDir, String(id), name), 'utf8').trim();
    } catch {
      return undefined;
    }
  }

  private spec(image: string): string {
    return `${this.options.pool}/${image}`;
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
