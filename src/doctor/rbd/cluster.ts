// doctor, with the rbd backend: the cluster as the node's own identity sees it (reachable, the pool, health, may it
// write) and whether that identity may do more than a node should (blocklist, read keys). The output of
// `ceph auth get` is parsed for caps and dropped: a key is never printed.
import type { RbdBackendConfig } from '../../config.js';
import type { CephIdentity } from '../../sys/rbd.js';
import { sh, type AddFinding } from '../findings.js';
import { CEPH_TIMEOUT_S, ENOENT, cephCall, isPermissionError, parseJsonArray, parseJsonObject } from './ceph-call.js';
import { nodeCapsWords, nodeMonCaps } from './identity.js';

// An object latch never creates: removing it is a write the OSD refuses (EPERM) without write caps, and otherwise
// answers "no such object", so the probe changes nothing.
const WRITE_PROBE_OBJECT = 'latch-doctor-write-probe';

export async function checkCluster(rbd: RbdBackendConfig, tools: Set<string>, add: AddFinding): Promise<void> {
  const identity: CephIdentity = { cephConf: rbd.cephConf, clientId: rbd.clientId, keyring: rbd.keyring };
  const name = `client.${rbd.clientId}`;
  const capsFix = `ceph auth caps ${name} ${nodeCapsWords(rbd.pool)}`;

  // 1. Reachable, as this identity, and the pool is there: `rbd ls` reads the pool's directory (fast, node caps).
  const ls = await cephCall('rbd', identity, ['ls', '--format', 'json', rbd.pool], [ENOENT]);
  if (ls.failure) {
    const { message, exitCode, timedOut } = ls.failure;
    const unreachable = timedOut || exitCode === 110 || /timed out|connect|ETIMEDOUT/i.test(message);
    add({
      check: 'ceph',
      severity: 'error',
      message: unreachable
        ? `the Ceph cluster did not answer ${name} within ${CEPH_TIMEOUT_S} s (rbd ls ${rbd.pool}: ${message})`
        : `rbd ls ${rbd.pool} as ${name} failed: ${message}`,
      note: unreachable
        ? `check mon_host in ${rbd.cephConf} and that this node reaches the monitors (ports 3300 and 6789) and the OSDs (6800-7300)`
        : isPermissionError(message, exitCode)
          ? `the key in ${rbd.keyring} or the caps of ${name} are wrong; on an admin host: ceph auth get ${name}, and if the caps differ: ${capsFix}`
          : `run it by hand to see more: rbd --conf ${sh(rbd.cephConf)} --id ${rbd.clientId} ls ${rbd.pool}`,
    });
    return;
  }
  if (ls.result?.exitCode === ENOENT) {
    add({
      check: 'ceph',
      severity: 'error',
      message: `the cluster answers ${name}, but has no pool ${rbd.pool}`,
      fix: `ceph osd pool create ${rbd.pool} && rbd pool init ${rbd.pool}`,
      note: `on an admin host; or set backend.pool to the pool latch should use`,
    });
    return;
  }
  let images = 0;
  try {
    images = (JSON.parse(ls.result?.stdout ?? '[]') as unknown[]).length;
  } catch {
    // counted as 0: rbd answered, which is what this check is about
  }
  add({ check: 'ceph', severity: 'ok', message: `the cluster answers ${name}: pool ${rbd.pool} has ${images} image(s)` });

  // 2. Health, where the node's caps let it read it (they do: `allow service mon r`).
  if (tools.has('ceph')) {
    const health = await cephCall('ceph', identity, ['health', '--format', 'json']);
    const parsed = parseJsonObject(health.result?.stdout);
    const status = typeof parsed?.status === 'string' ? parsed.status : undefined;
    if (status === 'HEALTH_OK') {
      add({ check: 'ceph', severity: 'ok', message: 'cluster health: HEALTH_OK' });
    } else if (status !== undefined) {
      const checks = Object.entries((parsed?.checks ?? {}) as Record<string, { summary?: { message?: string } }>).map(
        ([key, value]) => `${key}: ${value.summary?.message ?? ''}`,
      );
      add({
        check: 'ceph',
        severity: status === 'HEALTH_ERR' ? 'error' : 'warning',
        message: `cluster health: ${status}${checks.length > 0 ? ` (${checks.join('; ')})` : ''}`,
        note: 'on an admin host: ceph health detail',
      });
    } else {
      add({
        check: 'ceph',
        severity: 'warning',
        message: `cannot read the cluster's health as ${name}: ${health.failure?.message ?? 'no status in the reply'}`,
      });
    }
  }

  // 3. May it write images? Removing an object that does not exist is refused without write caps, and else changes nothing.
  if (tools.has('rados')) {
    const probe = await cephCall('rados', identity, ['-p', rbd.pool, 'rm', WRITE_PROBE_OBJECT]);
    const text = probe.failure?.message ?? '';
    if (probe.result || /\(2\) No such file or directory/.test(text)) {
      add({ check: 'ceph', severity: 'ok', message: `${name} may write to pool ${rbd.pool}` });
    } else {
      add({
        check: 'ceph',
        severity: 'error',
        message: isPermissionError(text, probe.failure?.exitCode)
          ? `${name} may read pool ${rbd.pool} but not write to it: volumes cannot be created or attached read-write`
          : `cannot tell whether ${name} may write to pool ${rbd.pool}: ${text}`,
        fix: capsFix,
        note: 'on an admin host',
      });
    }
  }

  // 4. May it blocklist? Only the fencer may. A node's own caps are readable only with auth caps, which a node must not
  // have, and the one direct probe (`osd blocklist add`) would fence someone; so this says what can be seen from here.
  if (tools.has('ceph')) await checkBlocklistCaps(identity, name, nodeMonCaps(rbd.pool), capsFix, add);
}

async function checkBlocklistCaps(identity: CephIdentity, name: string, monCaps: string, capsFix: string, add: AddFinding): Promise<void> {
  const expected = `on an admin host, "ceph auth get ${name}" must show mon caps "${monCaps}" — not "profile rbd", "allow *" or any w, which let it blocklist (fence) every other node`;
  if (name === 'client.admin') {
    add({
      check: 'ceph',
      severity: 'error',
      message: 'this node uses client.admin: it can fence every other node, read every key and delete the pool',
      note: `give each node its own identity (docs/operations.md, "The rbd backend") and set backend.clientId`,
    });
    return;
  }
  const own = await cephCall('ceph', identity, ['auth', 'get', name, '--format', 'json']);
  if (own.failure) {
    if (isPermissionError(own.failure.message, own.failure.exitCode)) {
      add({
        check: 'ceph',
        severity: 'ok',
        message: `${name} cannot read cephx keys or caps (as it should); whether it may blocklist cannot be seen from this node`,
        note: expected,
      });
    } else {
      add({
        check: 'ceph',
        severity: 'warning',
        message: `cannot tell what ${name} may do: ceph auth get failed: ${own.failure.message}`,
        note: expected,
      });
    }
    return;
  }
  // It could read its own entry: it has auth caps. Only the caps are looked at; the key in the same reply is dropped.
  const entry = parseJsonArray(own.result?.stdout)?.[0] as { caps?: Record<string, unknown> } | undefined;
  const caps = Object.entries(entry?.caps ?? {})
    .map(([service, spec]) => `${service} '${String(spec)}'`)
    .join(' ');
  add({
    check: 'ceph',
    severity: 'error',
    message: `${name} can read cephx keys (its caps: ${caps || 'unknown'}): far more than a node needs, and enough to fence other nodes`,
    fix: capsFix,
    note: 'on an admin host; a node needs exactly these caps (docs/operations.md, "The rbd backend")',
  });
}
