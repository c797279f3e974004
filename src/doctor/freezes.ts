// doctor: filesystems latch froze for a snapshot and did not thaw (sys/freeze.ts records each freeze in a marker file
// under the state dir until its thaw). A leftover one blocks every writer of the pod that uses the volume.
import type { Config } from '../config.js';
import { errorMessage } from '../errors.js';
import { freezeMarkerDir } from '../node/snapshot.js';
import { recordedFreezes } from '../sys/freeze.js';
import type { AddFinding } from './findings.js';

/** Reports each leftover freeze (an error, with the thaw that fixes it); returns how many it reported. */
export async function checkFreezes(config: Pick<Config, 'stateDir'>, add: AddFinding, now = Date.now()): Promise<number> {
  let found;
  try {
    found = await recordedFreezes(freezeMarkerDir(config), now);
  } catch (err) {
    add({ check: 'freezes', severity: 'warning', message: `latch's freeze records cannot be read: ${errorMessage(err)}` });
    return 1;
  }
  const leftovers = found.filter((f) => f.leftover);
  for (const { marker, why } of leftovers) {
    add({
      check: 'freezes',
      severity: 'error',
      message: `latch left the filesystem at ${marker.mountPoint} frozen (since ${marker.since}: ${why}): its writers are blocked`,
      fix: `fsfreeze --unfreeze ${marker.mountPoint}`,
      note: 'latch agent thaws it when it starts and at every interval; "Invalid argument" means it was not frozen any more',
    });
  }
  return leftovers.length;
}
