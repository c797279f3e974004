// The ledger as everything above it uses it: named operations on volume documents in a Store, each one a pure
// change from arbitrate.ts applied inside a compare-and-swap loop, so concurrent processes never lose each other's
// tickets. Nothing outside this file writes a volume document.
import { setTimeout as sleep } from 'node:timers/promises';
import { ConflictError, DamagedDocumentError, LatchError, StoreError, errorMessage } from '../errors.js';
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
  recordDirectJob,
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
import { accessRefusal, changeAllowed, type Caller } from './access.js';
import { reapTickets, releaseHoldWithoutDevice, touchTicket } from './automatic.js';
import { pvKey, volumeKey } from './keys.js';
import type { AutomaticAction, FinishedJob, VolumeAllowed, VolumeDoc, VolumeOwner } from './types.js';

const MAX_ATTEMPTS = 500;
/**
 * Documents list() reads at once: a ledger of thousands of volumes must not open thousands of etcd requests together
 * (every metrics scrape and agent round lists), and more than a few in flight gains nothing.
 */
const LIST_CONCURRENCY = 8;

/** A volume whose document cannot be read as one (not JSON, or not a latch/v1 volume), and why. */
export interface DamagedVolume {
  name: string;
  reason: string;
}

/**
 * Every volume: the documents that read, and the damaged ones by name. One damaged document must not stop what
 * looks at all volumes (reaping, metrics, doctor, a node fence); each caller decides what a damaged one means to it.
 */
export interface VolumeListing {
  docs: VolumeDoc[];
  damaged: DamagedVolume[];
}

export interface VolumeRef {
  volume?: string;
  pvOrVolumeName?: string;
}

/** What a volume that does not exist yet is created as, when a ticket may create it. */
export interface NewVolumeSpec {
  sizeBytes: number;
  fsType: FsType;
  /** The PV (and pod namespace) a driver call creates it for: recorded as the volume's own. */
  pv?: VolumeOwner;
  /** A shared (ReadWriteMany) volume (ledger/shared.ts). */
  shared?: boolean;
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
    return (await this.aliasOf(pvName)) ?? pvName;
  }

  /** The volume the PV name's alias leads to, if it has one. */
  async aliasOf(pvName: string): Promise<string | undefined> {
    const alias = await this.store.get(pvKey(pvName));
    const volume = (alias?.value as { volume?: unknown } | undefined)?.volume;
    return typeof volume === 'string' ? volume : undefined;
  }

  /**
   * Records that `pvName` means `volume` when the two differ (idempotent). An alias is only ever removed, never
   * redirected: a PV name that already leads to another volume, or that is the name of a volume of its own, is
   * refused (LatchError) and the ledger is left as it was; otherwise anyone naming a PV could send its next attach,
   * mountdevice and detach to a volume of their choosing.
   */
  async linkPv(pvName: string, volume: string): Promise<void> {
    if (pvName === volume) return;
    for (let attempt = 1; ; attempt++) {
      const alias = await this.store.get(pvKey(pvName));
      const current = (alias?.value as { volume?: unknown } | undefined)?.volume;
      if (current === volume) return;
      if (alias !== undefined) {
        throw new LatchError(
          `PV name ${pvName} already stands for volume ${typeof current === 'string' ? current : '(unreadable alias)'}; ` +
            `latch never points it at volume ${volume}`,
        );
      }
      if ((await this.store.get(volumeKey(pvName))) !== undefined) {
        throw new LatchError(`PV name ${pvName} is the name of volume ${pvName}; latch never points it at volume ${volume}`);
      }
      try {
        await this.store.put(pvKey(pvName), { volume }, 0);
        return;
      } catch (err) {
        if (!(err instanceof ConflictError) || attempt >= MAX_ATTEMPTS) throw err;
      }
    }
  }

  /**
   * Removes the PV name's alias (an admin's `latch volume unlink`), refused (LatchError) while the volume it leads to
   * has a ticket asked for through that PV name: its detach would no longer find the volume. Returns the volume it led
   * to; none: nothing to do.
   */
  async unlinkPv(pvName: string): Promise<string | undefined> {
    for (let attempt = 1; ; attempt++) {
      const alias = await this.store.get(pvKey(pvName));
      if (alias === undefined) return undefined;
      const volume = (alias.value as { volume?: unknown }).volume;
      const doc = typeof volume === 'string' ? await this.get(volume) : undefined;
      const using = Object.values(doc?.spec.tickets ?? {}).filter((t) => t.requestedBy.pvName === pvName);
      if (using.length > 0) {
        throw new LatchError(
          `PV name ${pvName} leads to volume ${String(volume)}, which has ${using.length} ticket(s) asked for through it; ` +
            'its detach would no longer find the volume: remove the alias once no pod uses the PV',
        );
      }
      try {
        await this.store.delete(pvKey(pvName), alias.revision);
        return typeof volume === 'string' ? volume : String(volume);
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
  addTicket(name: string, request: TicketRequest, create?: NewVolumeSpec, caller?: Caller): Promise<VolumeDoc | undefined> {
    return this.updateWithoutExpired(name, create, caller, (base) => base && addTicket(base, request, this.now()));
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
    caller?: Caller,
  ): Promise<{ doc: VolumeDoc | undefined; refused?: string }> {
    let refused: string | undefined;
    const doc = await this.updateWithoutExpired(name, create, caller, (base, current) => {
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
    return this.updateWithoutExpired(name, create, undefined, (base) => base && requestJob(base, request, this.now()));
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

  /**
   * Keeps the outcome of a job a command ran itself, without a ticket, in status.jobs (bounded like a finished
   * ticket's); the same record again, or no volume: nothing changes.
   */
  recordDirectJob(name: string, finished: FinishedJob & { direct: true }): Promise<VolumeDoc | undefined> {
    return this.update(name, (d) => d && recordDirectJob(d, finished));
  }

  /** A person asks the job to end: finished at once if no agent started it, else 'ending' for its agent. */
  endJob(name: string, id: string): Promise<VolumeDoc | undefined> {
    return this.update(name, (d) => d && endJob(d, id, this.now()));
  }

  // ---- a node's hold on the volume --------------------------------------------------------------------------------

  /**
   * The node claims the ledger's grant (granted -> attaching), naming the storage client it will use where it knows it
   * before it has the device (recorded where none is); a node without a grant changes nothing.
   */
  claimGrant(name: string, node: string, client?: string): Promise<VolumeDoc | undefined> {
    return this.update(name, (d) => (d && markAttaching(d, node, this.now(), client)) ?? d);
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
   * (`base`: `current`, else a new volume as `create` says, else undefined). A `caller` the existing volume does not
   * allow is refused (LatchError) in the same compare-and-swap, with nothing written.
   */
  private async updateWithoutExpired(
    name: string,
    create: NewVolumeSpec | undefined,
    caller: Caller | undefined,
    change: (base: VolumeDoc | undefined, current: VolumeDoc | undefined) => VolumeDoc | undefined,
  ): Promise<VolumeDoc | undefined> {
    let reaped: AutomaticAction[] = [];
    const doc = await this.update(name, (stored) => {
      const refusal = stored && caller && accessRefusal(stored, caller);
      if (refusal) throw new LatchError(refusal);
      const found = stored && reapTickets(stored, this.now());
      reaped = found?.reaped ?? [];
      const current = found?.doc;
      return change(current ?? (create && newVolumeFor(name, create, this.now())), current);
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
      if (!current) return newVolumeFor(name, spec, this.now());
      if (current.spec.sizeBytes !== spec.sizeBytes || current.spec.fsType !== spec.fsType || !current.spec.shared !== !spec.shared) {
        throw new LatchError(
          `volume ${name} already exists with size ${formatSize(current.spec.sizeBytes)} and ` +
            (current.spec.shared ? 'as a shared volume' : `fsType ${current.spec.fsType}`),
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

  /** Adds PV names and namespaces to the volume's allow lists, or takes them out (`latch volume allow`). */
  async allowVolume(name: string, entries: VolumeAllowed, remove = false): Promise<VolumeDoc> {
    const doc = await this.update(name, (d) => {
      if (!d) throw new LatchError(`volume ${name} does not exist`);
      return changeAllowed(d, entries, remove);
    });
    if (!doc) throw new StoreError(`volume ${name} vanished while it was being changed; try again`);
    return doc;
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

  /**
   * Every volume, read LIST_CONCURRENCY at a time, in name order. A document that is damaged is named in `damaged`;
   * any other failure (the store cannot be reached) fails the whole list.
   */
  async list(): Promise<VolumeListing> {
    const names = await this.store.list('volumes');
    const read: Array<VolumeDoc | DamagedVolume | undefined> = names.map(() => undefined);
    let next = 0;
    const worker = async (): Promise<void> => {
      while (next < names.length) {
        const i = next++;
        const name = names[i] as string;
        try {
          read[i] = await this.get(name);
        } catch (err) {
          if (!(err instanceof DamagedDocumentError)) {
            next = names.length; // the list fails: the other readers stop too
            throw err;
          }
          read[i] = { name, reason: errorMessage(err) };
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(LIST_CONCURRENCY, names.length) }, worker));
    const listing: VolumeListing = { docs: [], damaged: [] };
    for (const entry of read) {
      if (entry === undefined) continue;
      if ('apiVersion' in entry) listing.docs.push(entry);
      else listing.damaged.push(entry);
    }
    return listing;
  }
}

/** A new volume's document, with the PV it is created for when a driver call creates it. */
function newVolumeFor(name: string, create: NewVolumeSpec, now: string): VolumeDoc {
  const doc = newVolume(name, create.sizeBytes, create.fsType, now);
  return { ...doc, spec: { ...doc.spec, ...(create.pv && { pv: create.pv }), ...(create.shared === true && { shared: true as const }) } };
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
    throw new DamagedDocumentError(`the ledger document of volume ${name} is not a latch/v1 volume; inspect it before repairing`);
  }
  return doc;
}

function sameJson(a: unknown, b: unknown): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}
