// Opens the store the configuration names. Each implementation is imported on demand, so a driver call with the
// file store never loads the etcd client (and the other way round).
import type { Config } from '../config.js';
import type { Store } from './types.js';

export async function openStore(config: Config): Promise<Store> {
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
