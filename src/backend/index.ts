// The backend the configuration names. The rbd backend is imported on its first use, so a loop-backend call (and a
// call that never touches the data plane) never loads it.
import type { Config, RbdBackendConfig } from '../config.js';
import { chooseRbdClient } from './client-choice.js';
import { LoopBackend } from './loop.js';
import type { RbdBackend } from './rbd.js';
import type { Backend, Fencer, SnapshotBackend } from './types.js';

export function configuredBackend(config: Pick<Config, 'backend' | 'poolDir' | 'maxSize' | 'commandTimeout'>): Backend {
  if (config.backend.type === 'loop')
    return new LoopBackend({ poolDir: config.poolDir, maxSize: config.maxSize, commandTimeoutMs: config.commandTimeout * 1000 });
  return lazyRbdBackend(config.backend, config.maxSize, config.commandTimeout * 1000);
}

function lazyRbdBackend(rbd: RbdBackendConfig, maxSize: number, timeoutMs: number): Backend & SnapshotBackend {
  let loaded: Promise<RbdBackend> | undefined;
  const backend = () =>
    (loaded ??= import('./rbd.js').then(
      ({ RbdBackend }) =>
        new RbdBackend({
          pool: rbd.pool,
          cephConf: rbd.cephConf,
          clientId: rbd.clientId,
          keyring: rbd.keyring,
          mountDir: rbd.mountDir,
          client: chooseRbdClient(rbd.client, rbd.mountDir, { record: true }),
          maxSize,
          timeoutMs,
        }),
    ));
  return {
    storage: `the rbd pool ${rbd.pool}`,
    create: async (volume, sizeBytes) => (await backend()).create(volume, sizeBytes),
    delete: async (volume) => (await backend()).delete(volume),
    size: async (volume) => (await backend()).size(volume),
    attach: async (volume, access) => (await backend()).attach(volume, access),
    findDevice: async (volume) => (await backend()).findDevice(volume),
    hasMapping: async (volume) => (await backend()).hasMapping(volume),
    clientOf: async (volume) => (await backend()).clientOf?.(volume),
    cutOff: async (volume) => (await backend()).cutOff?.(volume),
    volumeOfDevice: async (device) => (await backend()).volumeOfDevice(device),
    release: async (volume) => (await backend()).release(volume),
    grow: async (volume, sizeBytes) => (await backend()).grow(volume, sizeBytes),
    isUnwritten: async (volume) => (await backend()).isUnwritten(volume),
    allocatedExtents: async function* (volume) {
      yield* (await backend()).allocatedExtents(volume);
    },
    // The snapshot operations (SnapshotBackend), which the rbd backend has.
    createSnapshot: async (volume, name) => (await backend()).createSnapshot(volume, name),
    listSnapshots: async (volume) => (await backend()).listSnapshots(volume),
    deleteSnapshot: async (volume, name) => (await backend()).deleteSnapshot(volume, name),
    openSnapshot: async (volume, name) => (await backend()).openSnapshot(volume, name),
    snapshotDiff: async (volume, name, from) => (await backend()).snapshotDiff(volume, name, from),
    snapshotIds: async (volume) => (await backend()).snapshotIds(volume),
  };
}

/**
 * The fencer of the configured storage: Ceph's blocklist as the configuration's fencer identity (backend.fencer), or
 * undefined where there is nothing to fence (the loop backend: each node's pool is its own) or no identity to fence
 * with (a node's configuration).
 */
export async function configuredFencer(config: Pick<Config, 'backend' | 'commandTimeout'>): Promise<Fencer | undefined> {
  const rbd = config.backend;
  if (rbd.type !== 'rbd' || rbd.fencer === undefined) return undefined;
  const { RbdFencer } = await import('./rbd-fencer.js');
  return new RbdFencer({
    pool: rbd.pool,
    identity: { cephConf: rbd.cephConf, ...rbd.fencer, commandTimeoutMs: config.commandTimeout * 1000 },
  });
}
