// The driver name install and uninstall act on, and the configuration when it loads: both work without one.
import type { Config } from '../config.js';
import { DEFAULT_DRIVER_NAME } from '../names.js';
import { ConfigError } from '../errors.js';
import { configOf, type CommandIO } from './io.js';

export interface DriverName {
  name: string;
  config?: Config;
  /** Why the configuration did not load. */
  configError?: string;
}

/** --driver, else the config's driverName, else latch/loop. */
export function driverNameFrom(option: string | undefined, io: CommandIO): DriverName {
  try {
    const config = configOf(io);
    return { name: option ?? config.driverName, config };
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    return { name: option ?? DEFAULT_DRIVER_NAME, configError: err.message };
  }
}
