// doctor, with the rbd backend: the node's client must break a fenced holder's lock without blocklisting it.
import type { RbdBackendConfig } from '../../config.js';
import { errorMessage } from '../../errors.js';
import { redactKeys } from '../../sys/rbd.js';
import { run } from '../../sys/run.js';
import { sh, type AddFinding } from '../findings.js';
import { RUN_DEADLINE_MS } from './ceph-call.js';

/**
 * Without `rbd_blocklist_on_break_lock = false`, librbd blocklists an image's previous lock holder before taking the
 * lock over; a node has no caps for that (only the fencer does), so its writes to a volume that moved to it from a
 * fenced node fail with EIO (design e). Read as the client sees it from its conf (`--show-config-value`: the conf
 * file and the defaults; the monitors' config database is not readable with node caps).
 */
export async function checkBreakLockSetting(rbd: RbdBackendConfig, add: AddFinding): Promise<void> {
  const option = 'rbd_blocklist_on_break_lock';
  let value: string;
  try {
    const { stdout } = await run('rbd', ['--conf', rbd.cephConf, '--id', rbd.clientId, '--show-config-value', option], {
      timeoutMs: RUN_DEADLINE_MS,
    });
    value = stdout.trim();
  } catch (err) {
    add({
      check: 'ceph',
      severity: 'warning',
      message: `cannot read ${option} of client.${rbd.clientId}: ${redactKeys(errorMessage(err))}`,
    });
    return;
  }
  if (value === 'false') {
    add({
      check: 'ceph',
      severity: 'ok',
      message: `${option} = false for client.${rbd.clientId}: this node breaks a fenced holder's lock without blocklisting`,
    });
    return;
  }
  add({
    check: 'ceph',
    severity: 'error',
    message:
      `${option} is ${value || 'unset'} for client.${rbd.clientId} in ${rbd.cephConf}: taking over a volume from a fenced node ` +
      `fails (librbd tries to blocklist the old holder, which this node's caps do not allow, and the writes get EIO)`,
    fix: `\${EDITOR:-vi} ${sh(rbd.cephConf)}`,
    note: `add "${option} = false" to its [client.${rbd.clientId}] section (only the fencer blocklists)`,
  });
}
