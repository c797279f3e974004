// latch doctor's runner: checks this node the way someone debugging a pod stuck in ContainerCreating would, one
// concern per check, in the order the findings should be read (the configuration first: the rest depends on it).
import { chooseRbdClient } from '../backend/client-choice.js';
import type { Config, RbdBackendConfig } from '../config.js';
import { createContext, type Context } from '../context.js';
import { reportAutomaticActions } from './automatic.js';
import { checkConfig } from './config.js';
import { checkDaemonCache, checkDaemonCgroups } from './daemons.js';
import { checkControllerManager } from './kcm.js';
import { checkDetaching, DEFAULT_STUCK_AFTER_SECONDS } from './detaching.js';
import { checkFreezes } from './freezes.js';
import { agreement, checkLedgerAgainstKernel, readInventory } from './ledger.js';
import { checkLoopSupport } from './loop.js';
import { checkPlugin } from './plugin.js';
import { checkImages, checkPool } from './pool.js';
import { checkRbd } from './rbd/ceph-side.js';
import type { RbdConfig } from './rbd/identity.js';
import { checkRbdMappings } from './rbd/mappings.js';
import { checkSharedVolumes } from './cephfs.js';
import { doctorReport, type DoctorReport, type Finding } from './findings.js';
import { checkTools } from './tools.js';

export interface DoctorOptions {
  env?: NodeJS.ProcessEnv;
  /** --plugin-dir; otherwise $LATCH_VOLUME_PLUGIN_DIR or detection, as for install. */
  pluginDir?: string;
  /** A volume detaching from a node for longer than this is reported. */
  stuckAfterSeconds?: number;
  /** The executable the installed driver is compared with (default: the one running). */
  self?: string;
  /** Now, in milliseconds (default: the context's clock). */
  now?: () => number;
  /** The context of a configuration (default: createContext); one per configuration doctor looks at. */
  context?: (config: Config) => Context;
}

export async function runDoctor(options: DoctorOptions = {}): Promise<DoctorReport> {
  const env = options.env ?? process.env;
  const findings: Finding[] = [];
  const add = (f: Finding) => findings.push(f);

  const config = checkConfig(env, add);
  await checkTools(config, env, add);
  await checkLoopSupport(add);
  await checkPlugin(config, options, env, add);
  const rbd = config?.backend.type === 'rbd' ? withChosenClient(config, config.backend) : undefined;
  if (rbd) {
    await checkRbd(rbd, env, add);
    await checkDaemonCgroups(add);
    await checkDaemonCache(rbd.backend.mountDir, add);
  }
  await checkControllerManager(config, env, add);
  if (config) {
    await checkFreezes(config, add, options.now?.());
    const ctx = (options.context ?? createContext)(config);
    const held = await readInventory(ctx, config, add);
    if (held) {
      const stuckAfter = options.stuckAfterSeconds ?? DEFAULT_STUCK_AFTER_SECONDS;
      const detaching = () => checkDetaching(held, stuckAfter, options.now ?? ctx.clock, add);
      if (rbd) {
        // The volumes' bytes are in Ceph: no pool directory to size, and the devices are rbd mappings.
        const mappings = await checkRbdMappings(rbd, held, add);
        if (mappings.problems + detaching() === 0) add(mappings.agreement);
      } else {
        await checkPool(config, held, add);
        if ((await checkImages(config, held, add)) + checkLedgerAgainstKernel(held, add) + detaching() === 0) add(agreement(held));
      }
      reportAutomaticActions(held, add);
      if (rbd?.backend.cephfs) await checkSharedVolumes(ctx, env, add);
    }
  } else {
    add({
      check: 'ledger',
      severity: 'warning',
      message: 'ledger and kernel not compared: the configuration did not load',
      note: 'fix the configuration first (see above)',
    });
  }
  return doctorReport(findings, config && { node: config.nodeName, config: config.source });
}

/**
 * The checks that read only the ledger, /sys and the mount table (no tools run, no plugin dir searched): cheap
 * enough for `latch agent` to repeat, so that `latch_doctor_findings` can raise an alert.
 */
export async function runLedgerChecks(ctx: Context, config: Config, stuckAfterSeconds = DEFAULT_STUCK_AFTER_SECONDS): Promise<Finding[]> {
  const findings: Finding[] = [];
  const add = (f: Finding) => findings.push(f);
  await checkFreezes(config, add, ctx.clock());
  const held = await readInventory(ctx, config, add);
  if (held) {
    await checkPool(config, held, add);
    checkLedgerAgainstKernel(held, add);
    checkDetaching(held, stuckAfterSeconds, ctx.clock, add);
  }
  return findings;
}

/** The configuration with the node client "auto" stands for on this node, as recorded or as it would be chosen now. */
function withChosenClient(config: Config, rbd: RbdBackendConfig): RbdConfig {
  return { ...config, backend: { ...rbd, client: chooseRbdClient(rbd.client, rbd.mountDir, { record: false }) } };
}
