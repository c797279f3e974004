// What `latch agent` does once when it starts, before its first round of tasks: undo what a killed process of latch
// left that blocks a pod now. Today that is a freeze: a snapshot's fsfreeze whose process was killed (an agent, a
// `latch snapshot create`) before its thaw leaves the pod's filesystem frozen, and the kernel never thaws it by itself.
// The same sweep runs every interval as a task (tasks.ts), for a freeze whose thaw came too late.
import type { Config } from '../config.js';
import { errorMessage } from '../errors.js';
import { freezeMarkerDir } from '../node/snapshot.js';
import { thawLeftoverFreezes } from '../sys/freeze.js';

type Log = (entry: Record<string, unknown>) => void;

/** Thaws latch's leftover freezes on this node (its marker files under the state dir); logs each. */
export async function thawFreezesLeftBehind(config: Pick<Config, 'stateDir'>, log: Log): Promise<void> {
  try {
    for (const done of await thawLeftoverFreezes(freezeMarkerDir(config))) {
      log({ freeze: done.mountPoint, thawed: done.thawed, message: `leftover freeze of ${done.mountPoint}: ${done.why}` });
    }
  } catch (err) {
    log({ error: `leftover freezes: ${errorMessage(err)}` });
  }
}

/** The agent's start-up: what must be undone before anything else runs. */
export async function agentStartup(config: Config, log: Log): Promise<void> {
  await thawFreezesLeftBehind(config, log);
}
