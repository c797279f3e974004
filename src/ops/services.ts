// The ledger and the backend as the ops reach them: opened lazily, once per process.
import type { Backend } from '../backend/types.js';
import type { Config } from '../config.js';
import type { Ledger } from '../ledger/ledger.js';

let ledger: Promise<Ledger> | undefined;
let backend: Promise<Backend> | undefined;

export function openLedger(config: Config): Promise<Ledger> {
  ledger ??= (async () => {
    const [{ openStore }, { Ledger }] = await Promise.all([import('../store/index.js'), import('../ledger/ledger.js')]);
    return new Ledger(await openStore(config));
  })();
  return ledger;
}

export function openBackend(config: Config): Promise<Backend> {
  backend ??= import('../backend/loop.js').then(({ LoopBackend }) => new LoopBackend({ poolDir: config.poolDir, maxSize: config.maxSize }));
  return backend;
}
