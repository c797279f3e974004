// doctor: the configuration, first, since every other check depends on it.
import { DEFAULT_CONFIG_PATH, loadConfig, type Config } from '../config.js';
import { errorMessage } from '../errors.js';
import { sh, type AddFinding } from './findings.js';

/** The configuration, or undefined (with an error finding) when it does not load. */
export function checkConfig(env: NodeJS.ProcessEnv, add: AddFinding): Config | undefined {
  try {
    const config = loadConfig(env);
    add({
      check: 'config',
      severity: 'ok',
      message:
        `configuration from ${config.source}: node ${config.nodeName}, driver ${config.driverName}, ` +
        `${config.attach ? 'attach' : 'non-attach'} mode, ${config.store.type} store`,
    });
    return config;
  } catch (err) {
    add({
      check: 'config',
      severity: 'error',
      message: errorMessage(err),
      fix: `\${EDITOR:-vi} ${sh(env.LATCH_CONFIG || DEFAULT_CONFIG_PATH)}`,
      note: 'see docs/operations.md, "Configuration"; then run latch doctor again',
    });
    return undefined;
  }
}
