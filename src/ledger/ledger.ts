// The ledger as everything above it uses it: named operations on volume documents in a Store, each one a pure
// change from arbitrate.ts applied inside a compare-and-swap loop, so concurrent processes never lose each other's
// tickets. Nothing outside this file writes a volume document.
import { setTimeout as sleep } from 'node:timers/promises';
import { ConflictError, LatchError, StoreError } from '../errors.js';
import type { FsType } from '../filesystems.js';
import { formatSize } from '../size.js';
import type { Store } from '../store/types.js';
import { isoTime } from '../time.js';
import {
  addTicket,
  beginFence,
  completeFence,
  endJob,
  finishJob,
  isSatisfied,
  markAttached,
  markAttaching,
  markFenceCleared,
  markReleased,
  newVolume,
  recordJob,
  releaseDeadNode,
  removeFence,
  removeTicket,
  requestJob,
  startJob,
  type JobRequest,
  type JobUpdate,
  type TicketRequest,
} from './arbitrate.js';
import { reapTickets, releaseHoldWithoutDevice, touchTicket } from './automatic.js';
import { pvKey, volumeKey } from './keys.js';
import type { AutomaticAction, VolumeDoc } from './types.js';

const MAX_ATTEMPTS = 500;

export interface VolumeRef {
  volume?: string;
  pvOrVolumeName?: string;
}

/** What a volume that does not exist yet is created as, when a ticket may create it. */
export interface NewVolumeSpec {
  sizeBytes: number;
  fsType: FsType;
}

export class Ledger {
  constructor(
    readonly store: Store,
    private readonly clock: () => string = () => isoTime(new Date()),
    /** Told of every automatic action this ledger stored (the context logs them with the call). */
    private readonly onAutomatic: (action: AutomaticAction) => void = () => undefined,
  ) {}

  now(): string {
    return this.clock();
  }

  async get(name: string): Promise<VolumeDoc | undefined> {
    const found = await this.store.get(volumeKey(name));
    return found === undefined ? undefined : checkDoc(found.value, name);
  }

  /**
   * Applies `change` to the current document (undefined when absent) and stores the result with compare-and-swap,
   * re-reading and re-applying on conflict. `change` must be pure. Returning the input (or an equal document)
   * writes nothing. Returns what is stored afterwards.
   */
  async update(name: string, change: (doc: VolumeDoc | undefined) => VolumeDoc | undefined): Promise<VolumeDoc | undefined> {
    const key = volumeKey(name);
    for (let attempt = 1; ; attempt++) {
      const found = await this.store.get(key);
      const current = found === undefined ? undefined : checkDoc(found.value, name);
      const next = change(current);
      if (next === current || (next !== undefined && current !== undefined && sameJson(next, current))) return current;
      try {
        if (next === undefined) await this.store.delete(key, found?.revision ?? 0);
        else await this.store.put(key, next, found?.revision ?? 0);
        return next;
      } catch (err) {
        if (!(err instanceof ConflictError)) throw err;
        if (attempt >= MAX_ATTEMPTS) {
          throw new StoreError(`volume ${name} is being changed by too many callers at once; try again`, { cause: err });
        }
        // Back off a little, randomly, so racing writers spread out.
        await sleep(Math.floor(Math.random() * Math.min(50, attempt * 2)));
      }
    }
  }

  /** The volume's stable name: the `volume` option, else the one recorded for this PV name, else the PV name itself. */
  async resolve(ref: VolumeRef): Promise<string> {
    if (ref.volume !== undefined) return ref.volume;
    if (ref.pvOrVolumeName === undefined) throw new Error('resolve needs a volume or PV name');
    return this.volumeOfPv(ref.pvOrVolumeName);
  }

  /** detach and restarted kubelets only know the PV name: find the volume it was attached as. */
  async volumeOfPv(pvName: string): Promise<string> {
    const alias = await this.store.get(pvKey(pvName));
    const volume = (alias?.value as { volume?: unknown } | undefined)?.volume;
    return typeof volume === 'string' ? volume : pvName;
  }

  /** Records that `pvName` means `volume` when the two differ (idempotent). */
  async linkPv(pvName: string, volume: string): Promise<void> {
    if (pvName === volume) return;
    for (let attempt = 1; ; attempt++) {
      const alias = await this.store.get(pvKey(pvName));
      if ((alias?.value as { volume?: unknown } | undefined)?.volume === volume) return;
      try {
        await this.store.put(pvKey(pvName), { volume }, alias?.revision ?? 0);
        return;
      } catch (err) {
        if (!(err instanceof ConflictError) || attempt >= MAX_ATTEMPTS) throw err;
      }
    }
  }

  // ---- tickets -------------------------------------------------------------------------------------------------

  /**
   * Adds (or refreshes) a ticket, first dropping expired tickets in the same write; creates the volume as `create`
   * says when it does not exist, else changes nothing.
   */
  addTicket(name: string, request: TicketRequest, create?: NewVolumeSpec): Promise<VolumeDoc | undefined> {
    return this.updateWithoutExpired(name, create, (base) => base && addTicket(base, request, this.now()));
  }

  /**
   * Adds the ticket only if it is granted at once; a refused request leaves the ledger as it was (and drops a stale
   * ticket of the same ID). For callers that cannot take a waiting ticket back later (non-attach mount: a pod deleted
   * meanwhile never gets an unmount). Creates the volume as `create` says when it does not exist; without `create`
   * a missing volume is refused. Returns the document and, when refused, why.
   */
  async addTicketIfGranted(
    name: string,
    request: TicketRequest,
    create?: NewVolumeSpec,
  ): Promise<{ doc: VolumeDoc | undefined; refused?: string }> {
    let refused: string | undefined;
    const doc = await this.updateWithoutExpired(name, create, (base, current) => {
      if (!base) {
        refused = 'the volume does not exist';
        return current;
      }
      const next = addTicket(base, request, this.now());
      refused = isSatisfied(next, request.id) ? undefined : (next.status.tickets[request.id]?.message ?? 'not granted');
      if (refused === undefined) return next;
      return current?.spec.tickets[request.id] ? removeTicket(current, request.id, this.now()) : current;
    });
    return refused === undefined ? { doc } : { doc, refused };
  }

  /**
   * Removes a ticket: the ID, or the one `pick` finds in the current document. An unknown ticket changes nothing.
   * `check` may refuse (throw) after seeing the ticket and the document.
   */
  removeTicket(
    name: string,
    pick: string | ((doc: VolumeDoc) => string | undefined),
    check?: (doc: VolumeDoc, id: string) => void,
  ): Promise<VolumeDoc | undefined> {
    return this.update(name, (d) => {
      const id = d && (typeof pick === 'string' ? pick : pick(d));
      if (!d || !id || !d.spec.tickets[id]) return d;
      check?.(d, id);
      return removeTicket(d, id, this.now());
    });
  }

  // ---- job tickets: work the node agent does (docs/ledger.md, "Jobs"; the pure rules in arbitrate.ts) ----------

  /**
   * Adds a job ticket, first dropping expired tickets in the same write; creates the volume as `create` says when it
   * does not exist (restore, clone target), else changes nothing. The same job asked for again changes nothing; another
   * job under the same ID is refused (LatchError).
   */
  requestJob(name: string, request: JobRequest, create?: NewVolumeSpec): Promise<VolumeDoc | undefined> {
    return this.updateWithoutExpired(name, create, (base) => base && requestJob(base, request, this.now()));
  }

  /** The agent on `node` starts the job; refused (LatchError) unless its ticket is satisfied there and not done. */
  startJob(name: string, id: string, node: string): Promise<VolumeDoc | undefined> {
    return this.update(name, (d) => {
      if (!d) throw new LatchError(`volume ${name} does not exist`);
      return startJob(d, id, node, this.now());
    });
  }

  /** Records the job's progress or outcome; no ticket, or the same record again: nothing changes. */
  recordJob(name: string, id: string, update: JobUpdate): Promise<VolumeDoc | undefined> {
    return this.update(name, (d) => d && recordJob(d, id, update, this.now()));
  }

  /** Removes the job's ticket and keeps its outcome in status.jobs, in one write; no ticket: nothing changes. */
  finishJob(name: string, id: string): Promise<VolumeDoc | undefined> {
    return this.update(name, (d) => d && finishJob(d, id, this.now()));
  }

  /** A person asks the job to end: finished at once if no agent started it, else 'ending' for its agent. */
  endJob(name: string, id: string): Promise<VolumeDoc | undefined> {
    return this.update(name, (d) => d && endJob(d, id, this.now()));
  }

  // ---- a node's hold on the volume --------------------------------------------------------------------------------

  /** The node claims the ledger's grant (granted -> attaching); a node without a grant changes nothing. */
  claimGrant(name: string, node: string): Promise<VolumeDoc | undefined> {
    return this.update(name, (d) => (d && markAttaching(d, node, this.now())) ?? d);
  }

  /**
   * The node has set up `device`, served by the storage client instance `client` where the backend has one
   * (attaching -> attached); refused (nothing changes) when its grant was withdrawn.
   */
  recordDevice(name: string, node: string, device: string, client?: string): Promise<VolumeDoc | undefined> {
    return this.update(name, (d) => (d && markAttached(d, node, device, this.now(), client)) ?? d);
  }

  /** The node confirms it released the device: it lets go, or stays granted while its tickets still want it. */
  confirmRelease(name: string, node: string): Promise<VolumeDoc | undefined> {
    return this.update(name, (d) => d && markReleased(d, node, this.now()));
  }

  /** The admin fence: the node is down; its tickets and its hold go, whatever it may still have. */
  releaseDeadNode(name: string, node: string): Promise<VolumeDoc | undefined> {
    return this.update(name, (d) => d && releaseDeadNode(d, node, this.now()));
  }

  // ---- fences: the storage cuts a node off before the volume moves away from it (docs/ledger.md, "Fences") -------

  /** Records the intent to fence `node` (its clients `clients`), before the storage is told: from now on it is not granted the volume. */
  beginFence(name: string, node: string, reason: string, clients: string[]): Promise<VolumeDoc | undefined> {
    return this.update(name, (d) => d && beginFence(d, node, reason, clients, this.now()));
  }

  /** The storage refuses `clients`: the fence is in place, and only now the node's hold and tickets go. */
  completeFence(name: string, node: string, clients: string[]): Promise<VolumeDoc | undefined> {
    return this.update(name, (d) => {
      if (!d) return d;
      const next = completeFence(d, node, clients, this.now());
      if (!next) throw new LatchError(`volume ${name} has no fence begun for node ${node}`);
      return next;
    });
  }

  /** The node has shown from its kernel state that nothing of the volume is mapped there any more. */
  clearFence(name: string, node: string): Promise<VolumeDoc | undefined> {
    return this.update(name, (d) => d && markFenceCleared(d, node, this.now()));
  }

  /** The storage was told to stop refusing the node's old clients; only a cleared fence is removed. */
  removeFence(name: string, node: string): Promise<VolumeDoc | undefined> {
    return this.update(name, (d) => d && removeFence(d, node, this.now()));
  }

  // ---- automatic actions (issue 15; the pure rules are in automatic.ts) ------------------------------------------

  /** The requester still wants the ticket: records it, at most once per `everyMs` (see touchTicket). */
  touchTicket(name: string, id: string, everyMs: number): Promise<VolumeDoc | undefined> {
    return this.update(name, (d) => d && touchTicket(d, id, this.now(), everyMs));
  }

  /** Reaps the volume's expired tickets, and its abandoned waiting ones when `abandonedAfterMs` is given. */
  async reapTickets(name: string, abandonedAfterMs?: number): Promise<AutomaticAction[]> {
    let reaped: AutomaticAction[] = [];
    await this.update(name, (d) => {
      if (!d) return d;
      const result = reapTickets(d, this.now(), abandonedAfterMs);
      reaped = result.reaped;
      return result.doc;
    });
    reaped.forEach(this.onAutomatic);
    return reaped;
  }

  /**
   * The node has proved from its own kernel that it has no device of the volume (node/self-release.ts, under the
   * node's volume lock): its attaching or detaching hold ends. Other phases change nothing.
   */
  async releaseHoldWithoutDevice(name: string, node: string): Promise<AutomaticAction | undefined> {
    let action: AutomaticAction | undefined;
    await this.update(name, (d) => {
      if (!d) return d;
      const result = releaseHoldWithoutDevice(d, node, this.now());
      action = result.action;
      return result.doc;
    });
    if (action) this.onAutomatic(action);
    return action;
  }

  /**
   * Write paths that add a ticket drop expired ones first, in the same write: a leftover admin ticket must not block a
   * workload. `change` gets the document without them (`current`, undefined when absent) and the one to add to
   * (`base`: `current`, else a new volume as `create` says, else undefined).
   */
  private async updateWithoutExpired(
    name: string,
    create: NewVolumeSpec | undefined,
    change: (base: VolumeDoc | undefined, current: VolumeDoc | undefined) => VolumeDoc | undefined,
  ): Promise<VolumeDoc | undefined> {
    let reaped: AutomaticAction[] = [];
    const doc = await this.update(name, (stored) => {
      const found = stored && reapTickets(stored, this.now());
      reaped = found?.reaped ?? [];
      const current = found?.doc;
      return change(current ?? (create && newVolume(name, create.sizeBytes, create.fsType, this.now())), current);
    });
    reaped.forEach(this.onAutomatic);
    return doc;
  }

  // ---- what the volume is ---------------------------------------------------------------------------------------

  /** Creates the volume's document; one that exists already is fine only if it has the same size and fsType. */
  async createVolume(name: string, spec: NewVolumeSpec): Promise<{ doc: VolumeDoc; existed: boolean }> {
    let existed = false;
    const doc = await this.update(name, (current) => {
      existed = current !== undefined;
      if (!current) return newVolume(name, spec.sizeBytes, spec.fsType, this.now());
      if (current.spec.sizeBytes !== spec.sizeBytes || current.spec.fsType !== spec.fsType) {
        throw new LatchError(
          `volume ${name} already exists with size ${formatSize(current.spec.sizeBytes)} and fsType ${current.spec.fsType}`,
        );
      }
      return current;
    });
    if (!doc) throw new StoreError(`volume ${name} vanished while it was being created; try again`);
    return { doc, existed };
  }

  /** Deletes the volume's document; `check` may refuse (throw) on seeing the current one. */
  async deleteVolume(name: string, check: (doc: VolumeDoc) => void): Promise<void> {
    await this.update(name, (current) => {
      if (current) check(current);
      return undefined;
    });
  }

  /** Records the filesystem found or made on the volume (from then on, a blank device is never formatted). */
  recordFilesystem(name: string, fsType: string): Promise<VolumeDoc | undefined> {
    return this.update(name, (d) => (d && d.status.filesystem !== fsType ? { ...d, status: { ...d.status, filesystem: fsType } } : d));
  }

  /**
   * Records where the volume's image lives, unless a home is recorded already (the first one stays: an image is made
   * once). Returns the document, whose home the caller compares with its own; undefined when the volume does not exist.
   */
  recordHome(name: string, node: string, pool: string): Promise<VolumeDoc | undefined> {
    return this.update(name, (d) => (d && !d.status.home ? { ...d, status: { ...d.status, home: { node, pool, since: this.now() } } } : d));
  }

  /** Records a new size; never lowers it. */
  recordSize(name: string, sizeBytes: number): Promise<VolumeDoc | undefined> {
    return this.update(name, (d) => (d && d.spec.sizeBytes < sizeBytes ? { ...d, spec: { ...d.spec, sizeBytes } } : d));
  }

  async list(): Promise<VolumeDoc[]> {
    const names = await this.store.list('volumes');
    const docs = await Promise.all(names.map((n) => this.get(n)));
    return docs.filter((d): d is VolumeDoc => d !== undefined);
  }
}

function checkDoc(value: unknown, name: string): VolumeDoc {
  const doc = value as VolumeDoc;
  if (
    typeof doc !== 'object' ||
    doc === null ||
    doc.apiVersion !== 'latch/v1' ||
    doc.name !== name ||
    typeof doc.spec?.tickets !== 'object' ||
    typeof doc.status?.nodes !== 'object'
  ) {
    throw new StoreError(`the ledger document of volume ${name} is not a latch/v1 volume; inspect it before repairing`);
  }
  return doc;
}

function sameJson(a: unknown, b: unknown): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}
