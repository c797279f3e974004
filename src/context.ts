// The composition root: everything a driver call, an admin command or a node service works with, built once per
// call from the configuration and passed down. Nothing below opens its own ledger, backend or clock; tests build
// a context with an in-memory store, a fake backend and a fake system instead.
import type * as BackendIndex from './backend/index.js';
import type { Backend } from './backend/types.js';
import type { Config } from './config.js';
import { Ledger } from './ledger/ledger.js';
import type { AutomaticAction } from './ledger/types.js';
import type { CallLog } from './log.js';
import { lazyStore } from './store/index.js';
import type { Store } from './store/types.js';
import type * as HostSystem from './sys/system.js';
import type { System } from './sys/system.js';
import { isoTime } from './time.js';

/** Milliseconds since the epoch. */
export type Clock = () => number;

export interface Context {
  readonly config: Config;
  readonly ledger: Ledger;
  readonly backend: Backend;
  readonly system: System;
  readonly clock: Clock;
  readonly log: CallLog;
}

/** Parts a test (or a tool looking at another store) puts in place of the configured ones. */
export interface ContextParts {
  store?: Store;
  backend?: Backend;
  system?: System;
  clock?: Clock;
  log?: CallLog;
}

export function createContext(config: Config, parts: ContextParts = {}): Context {
  const clock = parts.clock ?? Date.now;
  const log = parts.log ?? {};
  // What the ledger does by itself during a call (reaped tickets, released holds) goes into the call's log line.
  const noteAutomatic = (action: AutomaticAction) => {
    log.automatic = [...((log.automatic as AutomaticAction[] | undefined) ?? []), action];
  };
  let backend = parts.backend;
  let system = parts.system;
  return {
    config,
    ledger: new Ledger(parts.store ?? lazyStore(config), () => isoTime(new Date(clock())), noteAutomatic),
    // Made on first use, with the modules behind them: the control plane's calls (attach, isattached, ...) touch
    // neither the data plane nor the host's mounts, and evaluating those modules (the loop backend, the sys/*
    // wrappers of mount, blkid, losetup) was part of every call's start-up.
    get backend() {
      return (backend ??= (require('./backend/index.js') as typeof BackendIndex).configuredBackend(config));
    },
    get system() {
      return (system ??= (require('./sys/system.js') as typeof HostSystem).hostSystem(config.commandTimeout * 1000));
    },
    clock,
    log,
  };
}
