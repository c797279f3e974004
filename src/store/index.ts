// Opens the store the configuration names. Each implementation is imported on demand, so a driver call with the
// file store never loads the etcd client (and the other way round).
import type { Config } from '../config.js';
import type { Store } from './types.js';

export async function openStore(config: Pick<Config, 'store' | 'stateDir'>): Promise<Store> {
  switch (config.store.type) {
    case 'file': {
      const { FileStore } = await import('./file.js');
      return new FileStore(config.stateDir);
    }
    case 'etcd': {
      const { EtcdStore } = await import('./etcd.js');
      return new EtcdStore(config.store);
    }
  }
}

/** The configured store, opened on its first use: a call that never reads the ledger never loads or connects it. */
export function lazyStore(config: Pick<Config, 'store' | 'stateDir'>): Store {
  let opened: Promise<Store> | undefined;
  const store = () => (opened ??= openStore(config));
  return {
    kind: config.store.type,
    get: async (key) => (await store()).get(key),
    put: async (key, value, expectedRevision) => (await store()).put(key, value, expectedRevision),
    delete: async (key, expectedRevision) => (await store()).delete(key, expectedRevision),
    list: async (kind) => (await store()).list(kind),
    watch: (kind, signal) => watchOpened(store, kind, signal),
    close: async () => {
      if (opened) await (await opened).close();
    },
  };
}

/** The opened store's watch; a store without one yields nothing until aborted (its reader polls). */
async function* watchOpened(store: () => Promise<Store>, kind: string, signal: AbortSignal): AsyncIterable<void> {
  const opened = await store();
  if (opened.watch) {
    yield* opened.watch(kind, signal);
    return;
  }
  await new Promise<void>((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener('abort', () => resolve(), { once: true });
  });
}
