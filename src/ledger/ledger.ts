// The ledger as the ops use it: volume documents in a Store, changed only through the pure functions in
// arbitrate.ts inside a compare-and-swap loop, so concurrent processes never lose each other's tickets.
import { setTimeout as sleep } from 'node:timers/promises';
import { ConflictError, StoreError } from '../errors.js';
import type { Store } from '../store/types.js';
import type { VolumeDoc } from './types.js';

const MAX_ATTEMPTS = 500;

export interface VolumeRef {
  volume?: string;
  pvOrVolumeName?: string;
}

export class Ledger {
  constructor(
    readonly store: Store,
    private readonly clock: () => string = () => new Date().toISOString(),
  ) {}

  now(): string {
    return this.clock();
  }

  async get(name: string): Promise<VolumeDoc | undefined> {
    const found = await this.store.get(`volumes/${name}`);
    return found === undefined ? undefined : checkDoc(found.value, name);
  }

  /**
   * Applies `change` to the current document (undefined when absent) and stores the result with compare-and-swap,
   * re-reading and re-applying on conflict. `change` must be pure. Returning the input (or an equal document)
   * writes nothing. Returns what is stored afterwards.
   */
  async update(name: string, change: (doc: VolumeDoc | undefined) => VolumeDoc | undefined): Promise<VolumeDoc | undefined> {
    const key = `volumes/${name}`;
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
    const alias = await this.store.get(`pvs/${pvName}`);
    const volume = (alias?.value as { volume?: unknown } | undefined)?.volume;
    return typeof volume === 'string' ? volume : pvName;
  }

  /** Records that `pvName` means `volume` when the two differ (idempotent). */
  async linkPv(pvName: string, volume: string): Promise<void> {
    if (pvName === volume) return;
    for (let attempt = 1; ; attempt++) {
      const alias = await this.store.get(`pvs/${pvName}`);
      if ((alias?.value as { volume?: unknown } | undefined)?.volume === volume) return;
      try {
        await this.store.put(`pvs/${pvName}`, { volume }, alias?.revision ?? 0);
        return;
      } catch (err) {
        if (!(err instanceof ConflictError) || attempt >= MAX_ATTEMPTS) throw err;
      }
    }
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
