// doctor, with the rbd backend: the Ceph side of this node (tools, conf and keyring, the cluster as this node's own
// identity, what that identity may do, the lock-breaking setting, the node client) and its rbd mappings against the
// ledger. Measured facts behind each check: docs/design/rbd-backend.md.
//
// Two rules hold throughout. A key is never printed: keyrings are checked for their mode and their section names
// only, and the output of `ceph auth get` is parsed for caps and dropped. Nothing below a FUSE mount is ever stat-ed
// or opened: a fenced rbd-fuse hangs every such call beyond any signal (design c), so mappings are read from
// /proc/self/mountinfo, /proc/PID/cmdline and /sys/block/loopN only, and every Ceph call has a deadline.
import { constants } from 'node:fs';
import { access, readFile, realpath, stat } from 'node:fs/promises';
import { basename, dirname } from 'node:path';
import { krbdMappings } from '../../backend/krbd.js';
import { deviceInUse } from '../../backend/devices.js';
import { RbdBackend } from '../../backend/rbd.js';
import type { Config, RbdBackendConfig, RbdClientKind } from '../../config.js';
import { errorMessage } from '../../errors.js';
import type { Inventory } from '../../host/inventory.js';
import { isInUse, nodeHoldsDevice } from '../../ledger/arbitrate.js';
import type { VolumeDoc } from '../../ledger/types.js';
import { rbdFuseProcesses } from '../../sys/fuse.js';
import { listLoopDevices } from '../../sys/loop.js';
import { readMountInfo } from '../../sys/mounts.js';
import { cephClientArgs, redactKeys, type CephIdentity } from '../../sys/rbd.js';
import { CommandError, findTool, run, toolSearchPath, type RunResult } from '../../sys/run.js';
import { sh, type AddFinding, type Finding, type Severity } from './report.js';

/** The node caps of docs/operations.md ("The rbd backend"): `profile rbd` on the monitor minus its blocklisting. */
function nodeCapsCommand(clientId: string, pool: string, keyring: string): string {
  return (
    `ceph auth get-or-create client.${clientId} mon 'allow service mon r, allow service osd r, allow service pg r' ` +
    `osd 'profile rbd pool=${pool}' -o ${sh(keyring)}`
  );
}

// Every Ceph call here is bounded twice: by Ceph's own timeouts (so the tool says what it waited for) and by run()'s
// deadline a little later (so not even a client stuck elsewhere can hang doctor).
const CEPH_TIMEOUT_S = 10;
const RUN_DEADLINE_MS = (CEPH_TIMEOUT_S + 5) * 1000;
const CLIENT_TIMEOUTS = [
  '--client-mount-timeout',
  String(CEPH_TIMEOUT_S),
  '--rados-mon-op-timeout',
  String(CEPH_TIMEOUT_S),
  '--rados-osd-op-timeout',
  String(CEPH_TIMEOUT_S),
];
// An object latch never creates: removing it is a write the OSD refuses (EPERM) without write caps, and otherwise
// answers "no such object", so the probe changes nothing.
const WRITE_PROBE_OBJECT = 'latch-doctor-write-probe';
const FUSECTL = '/sys/fs/fuse/connections';
// Ceph's errno values as its tools' exit codes and messages.
const ENOENT = 2;
const EACCES = 13;

/** An rbd configuration with the node client that "auto" stands for here (backend/client-choice.ts). */
export type RbdConfig = Config & { backend: RbdBackendConfig & { client: RbdClientKind } };

/** Everything about this node's Ceph side that needs no ledger. */
export async function checkRbd(config: RbdConfig, env: NodeJS.ProcessEnv, add: AddFinding): Promise<void> {
  const rbd = config.backend;
  const tools = await checkCephTools(rbd, env, add);
  const filesOk = await checkCephFiles(rbd, add);
  await checkNodeClient(config, add);
  if (!tools.has('rbd')) {
    add({ check: 'ceph', severity: 'warning', message: 'the cluster was not checked: the rbd tool is missing (see above)' });
    return;
  }
  await checkBreakLockSetting(rbd, add);
  if (!filesOk) {
    add({ check: 'ceph', severity: 'warning', message: 'the cluster was not checked: fix the conf or keyring first (see above)' });
    return;
  }
  await checkCluster(rbd, tools, add);
}

// ---- tools -------------------------------------------------------------------------------------------------------

const CEPH_TOOLS = [
  { tool: 'rbd', deb: 'ceph-common', why: 'creates, resizes, removes and (krbd) maps the images', severity: 'error' as Severity },
  {
    tool: 'rbd-fuse',
    deb: 'rbd-fuse',
    why: "is this node's client for the images (rbd-fuse + a loop device)",
    severity: 'error' as Severity,
    client: 'rbd-fuse',
  },
  { tool: 'ceph', deb: 'ceph-common', why: "checks the cluster (doctor) and runs the fencer's commands", severity: 'warning' as Severity },
  {
    tool: 'rados',
    deb: 'ceph-common',
    why: "lets doctor check that this node's identity may write to the pool",
    severity: 'warning' as Severity,
  },
];

async function checkCephTools(rbd: RbdBackendConfig, env: NodeJS.ProcessEnv, add: AddFinding): Promise<Set<string>> {
  const searchPath = toolSearchPath(env);
  const found = new Set<string>();
  for (const spec of CEPH_TOOLS) {
    if (spec.client !== undefined && spec.client !== rbd.client) continue;
    if (findTool(spec.tool, searchPath)) {
      found.add(spec.tool);
      continue;
    }
    add({
      check: 'tools',
      severity: spec.severity,
      message: `${spec.tool} not found in ${searchPath.join(':')}: it ${spec.why}`,
      fix: `apt-get install -y ${spec.deb}`,
      note: `RHEL, Fedora: dnf install -y ${spec.deb}; the packages should match the cluster's Ceph release or be close to it`,
    });
  }
  if (found.size > 0) add({ check: 'tools', severity: 'ok', message: `found the Ceph tools ${[...found].join(', ')}` });
  return found;
}

// ---- conf and keyring --------------------------------------------------------------------------------------------

/** The conf and keyring are there, readable, and the keyring is root's alone with a section for this identity. */
async function checkCephFiles(rbd: RbdBackendConfig, add: AddFinding): Promise<boolean> {
  const name = `client.${rbd.clientId}`;
  let ok = true;

  const conf = await readPrivateFile(rbd.cephConf);
  if (typeof conf === 'string') {
    ok = false;
    add({
      check: 'ceph',
      severity: 'error',
      message: `the Ceph conf ${rbd.cephConf} cannot be read: ${conf}`,
      note: `on an admin host, "ceph config generate-minimal-conf" prints one (fsid and mon_host); copy it to ${rbd.cephConf}, or set backend.cephConf`,
    });
  } else if (/^\s*key\s*=/m.test(conf.text) && (conf.mode & 0o077) !== 0) {
    add({
      check: 'ceph',
      severity: 'warning',
      message: `the Ceph conf ${rbd.cephConf} holds a key and is readable by others (mode ${octal(conf.mode)})`,
      fix: `chmod 600 ${sh(rbd.cephConf)}`,
      note: `better: keep keys in the keyring file (${rbd.keyring}) only`,
    });
  } else {
    add({ check: 'ceph', severity: 'ok', message: `Ceph conf ${rbd.cephConf} is readable` });
  }

  const keyring = await readPrivateFile(rbd.keyring);
  if (typeof keyring === 'string') {
    add({
      check: 'ceph',
      severity: 'error',
      message: `the keyring of ${name}, ${rbd.keyring}, cannot be read: ${keyring}`,
      fix: `umask 077; ${nodeCapsCommand(rbd.clientId, rbd.pool, rbd.keyring)}`,
      note: `on an admin host (the caps are this node's: docs/operations.md, "The rbd backend"); then copy the file to this node, mode 0600`,
    });
    return false;
  }
  const sections = [...keyring.text.matchAll(/^\s*\[([^\]]+)\]/gm)].map((m) => m[1]?.trim());
  if (!sections.includes(name) || !/^\s*key\s*=\s*\S/m.test(keyring.text)) {
    ok = false;
    add({
      check: 'ceph',
      severity: 'error',
      message:
        `the keyring ${rbd.keyring} has no key for ${name}` +
        (sections.length > 0 ? ` (it has section(s) ${sections.join(', ')})` : ' (no [client.…] section in it)'),
      note: `on an admin host: ceph auth get ${name} -o FILE, and copy FILE to ${rbd.keyring} (mode 0600); or set backend.clientId to the identity the keyring is for`,
    });
  }
  if ((keyring.mode & 0o077) !== 0 || keyring.uid !== 0) {
    add({
      check: 'ceph',
      severity: 'warning',
      message:
        `the keyring ${rbd.keyring} is not private to root (mode ${octal(keyring.mode)}, owner uid ${keyring.uid}): ` +
        `whoever can read it can act as ${name} on the cluster`,
      fix: `chown root:root ${sh(rbd.keyring)} && chmod 600 ${sh(rbd.keyring)}`,
    });
  } else if (ok) {
    add({ check: 'ceph', severity: 'ok', message: `keyring ${rbd.keyring} has the key of ${name} and is private to root (mode 0600)` });
  }
  return ok;
}

function octal(mode: number): string {
  return (mode & 0o7777).toString(8).padStart(4, '0');
}

/** The file's text, mode and owner, or why it cannot be read. Its text never leaves this module. */
async function readPrivateFile(path: string): Promise<{ text: string; mode: number; uid: number } | string> {
  try {
    const info = await stat(path);
    if (!info.isFile()) return 'it is not a regular file';
    await access(path, constants.R_OK);
    return { text: await readFile(path, 'utf8'), mode: info.mode, uid: info.uid };
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    return code === 'ENOENT' ? 'it does not exist' : code === 'EACCES' ? 'permission denied' : errorMessage(err);
  }
}

// ---- rbd_blocklist_on_break_lock ---------------------------------------------------------------------------------

/**
 * Without `rbd_blocklist_on_break_lock = false`, librbd blocklists an image's previous lock holder before taking the
 * lock over; a node has no caps for that (only the fencer does), so its writes to a volume that moved to it from a
 * fenced node fail with EIO (design e). Read as the client sees it from its conf (`--show-config-value`: the conf
 * file and the defaults; the monitors' config database is not readable with node caps).
 */
async function checkBreakLockSetting(rbd: RbdBackendConfig, add: AddFinding): Promise<void> {
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

// ---- the node client ---------------------------------------------------------------------------------------------

async function exists(path: string): Promise<boolean> {
  try {
    await stat(path);
    return true;
  } catch {
    return false;
  }
}

/** Which node client latch uses here, what it needs, and which other client this kernel could offer. */
async function checkNodeClient(config: RbdConfig, add: AddFinding): Promise<void> {
  const rbd = config.backend;
  const { kind } = new RbdBackend({ ...rbd, maxSize: config.maxSize, timeoutMs: config.commandTimeout * 1000 }).client;
  const krbd = await exists('/sys/bus/rbd');
  const nbd = (await exists('/sys/module/nbd')) || (await exists('/dev/nbd0'));
  const others =
    `kernel rbd: ${krbd ? 'available (/sys/bus/rbd)' : 'not available (no rbd module)'}, ` +
    `rbd-nbd: ${nbd ? 'available (nbd module)' : 'not available (no nbd module)'}`;
  if (rbd.client === 'krbd') {
    add(
      krbd
        ? {
            check: 'rbd-client',
            severity: 'ok',
            message: `node client ${kind}: rbd device map, one client instance per volume (noshare); ${others}`,
          }
        : {
            check: 'rbd-client',
            severity: 'error',
            message: `node client ${kind}: the kernel has no rbd module (/sys/bus/rbd is missing), so no volume can be mapped`,
            fix: 'modprobe rbd && echo rbd > /etc/modules-load.d/latch-rbd.conf',
            note: 'or set backend.client to "rbd-fuse" once no volume is mapped on this node',
          },
    );
    return;
  }
  if (!(await exists('/dev/fuse'))) {
    add({
      check: 'rbd-client',
      severity: 'error',
      message: `node client ${kind}: /dev/fuse is missing, so rbd-fuse cannot mount (${others})`,
      fix: 'modprobe fuse && echo fuse > /etc/modules-load.d/latch-fuse.conf',
      note: 'in a container: run it privileged, with /dev/fuse',
    });
    return;
  }
  add({
    check: 'rbd-client',
    severity: 'ok',
    message: `node client ${kind}: one rbd-fuse per volume under ${rbd.mountDir}, a loop device over its file; ${others}`,
    ...(krbd && {
      note: 'the kernel client serves I/O without FUSE (docs/performance.md, "rbd"): set backend.client to "krbd" once no volume is mapped on this node',
    }),
  });
}

// ---- the cluster, as this node's identity ------------------------------------------------------------------------

interface Outcome {
  result?: RunResult;
  /** The failure, with keys redacted, when the command failed or ran out of time. */
  failure?: { message: string; exitCode: number | undefined; timedOut: boolean };
}

async function cephCall(
  command: 'rbd' | 'ceph' | 'rados',
  identity: CephIdentity,
  args: string[],
  okExitCodes: number[] = [],
): Promise<Outcome> {
  const timeouts = command === 'ceph' ? ['--connect-timeout', String(CEPH_TIMEOUT_S), ...CLIENT_TIMEOUTS] : CLIENT_TIMEOUTS;
  try {
    return { result: await run(command, [...cephClientArgs(identity), ...timeouts, ...args], { timeoutMs: RUN_DEADLINE_MS, okExitCodes }) };
  } catch (err) {
    const cmdErr = err instanceof CommandError ? err : undefined;
    const detail = cmdErr?.stderrTail.trim().split('\n').at(-1) || errorMessage(err);
    return {
      failure: { message: redactKeys(detail), exitCode: cmdErr?.exitCode, timedOut: cmdErr?.timedOut ?? false },
    };
  }
}

function isPermissionError(text: string, exitCode: number | undefined): boolean {
  return exitCode === EACCES || /\((1|13)\) (Operation not permitted|Permission denied)|EACCES|access denied/i.test(text);
}

async function checkCluster(rbd: RbdBackendConfig, tools: Set<string>, add: AddFinding): Promise<void> {
  const identity: CephIdentity = { cephConf: rbd.cephConf, clientId: rbd.clientId, keyring: rbd.keyring };
  const name = `client.${rbd.clientId}`;
  const capsFix = `ceph auth caps ${name} mon 'allow service mon r, allow service osd r, allow service pg r' osd 'profile rbd pool=${rbd.pool}'`;

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
  if (tools.has('ceph')) await checkBlocklistCaps(identity, name, capsFix, add);
}

async function checkBlocklistCaps(identity: CephIdentity, name: string, capsFix: string, add: AddFinding): Promise<void> {
  const expected = `on an admin host, "ceph auth get ${name}" must show mon caps "allow service mon r, allow service osd r, allow service pg r" — not "profile rbd", "allow *" or any w, which let it blocklist (fence) every other node`;
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

function parseJsonObject(text: string | undefined): Record<string, unknown> | undefined {
  try {
    const value = JSON.parse(text ?? '') as unknown;
    return value !== null && typeof value === 'object' && !Array.isArray(value) ? (value as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}

function parseJsonArray(text: string | undefined): unknown[] | undefined {
  try {
    const value = JSON.parse(text ?? '') as unknown;
    return Array.isArray(value) ? value : undefined;
  } catch {
    return undefined;
  }
}

// ---- rbd mappings against the ledger -----------------------------------------------------------------------------

/** What the kernel shows of rbd mappings directly under the mount dir (read without touching any FUSE mount). */
export interface RbdNodeState {
  /** The mount dir's real path (as mountinfo, /proc and sysfs spell paths). */
  mountDir: string;
  /** FUSE mounts at <mountDir>/<image>, with their FUSE connection number (the minor of `0:N`). */
  mounts: { mountPoint: string; connection: number | undefined }[];
  /** rbd-fuse processes whose command line names a mount point <mountDir>/<image>. */
  processes: { pid: number; mountPoint: string }[];
  /** Loop devices over <mountDir>/<image>/<image>, and where each is mounted. */
  loops: { device: string; backingFile: string; mountPoints: string[] }[];
  /** Whether fusectl is mounted at /sys/fs/fuse/connections (needed to abort a connection). */
  fusectlMounted: boolean;
}

async function readRbdNodeState(mountDir: string): Promise<RbdNodeState | undefined> {
  let dir: string;
  try {
    dir = await realpath(mountDir); // the directory itself, never a mount point below it
  } catch {
    return undefined; // no mount dir: nothing was ever mapped here
  }
  const table = await readMountInfo();
  const under = (path: string) => dirname(path) === dir;
  const loops = (await listLoopDevices()).filter((l) => under(dirname(l.backingFile)));
  return {
    mountDir: dir,
    mounts: table
      .filter((m) => under(m.mountPoint) && (m.fsType === 'fuse' || m.fsType.startsWith('fuse.')))
      .map((m) => {
        const [major, minor] = m.majorMinor.split(':').map(Number);
        return { mountPoint: m.mountPoint, connection: major === 0 && Number.isInteger(minor) ? minor : undefined };
      }),
    processes: (await rbdFuseProcesses()).flatMap(({ pid, argv }) => {
      const mountPoint = argv.find((arg) => arg.startsWith('/') && under(arg));
      return mountPoint === undefined ? [] : [{ pid, mountPoint }];
    }),
    loops: loops.map((l) => ({
      device: l.device,
      backingFile: l.backingFile,
      mountPoints: table.filter((m) => m.source === l.device).map((m) => m.mountPoint),
    })),
    fusectlMounted: table.some((m) => m.fsType === 'fusectl' && m.mountPoint === FUSECTL),
  };
}

/**
 * Reads the kernel's mappings and reports them against the ledger: how many problems it reported, and the finding
 * for when nothing else disagrees either.
 */
export async function checkRbdMappings(
  config: RbdConfig,
  held: Inventory,
  add: AddFinding,
): Promise<{ problems: number; agreement: Finding }> {
  let findings: Finding[];
  let mapped: number;
  let where: string;
  const rbd = config.backend;
  // A volume whose ledger document cannot be read may be held here: its mappings are neither stale nor cleared
  // (readInventory reported the document).
  const unreadable = new Set(held.damaged.map((d) => d.name));
  if (rbd.client === 'krbd') {
    const table = await readMountInfo();
    const mappings = krbdMappings(rbd.pool)
      .filter((m) => !unreadable.has(m.image))
      .map((m) => ({
        ...m,
        mountPoints: table.filter((t) => t.source === m.device).map((t) => t.mountPoint),
      }));
    findings = krbdMappingFindings(mappings, held.node, held.volumes);
    mapped = new Set(mappings.map((m) => m.image)).size;
    where = `of pool ${rbd.pool} in /sys/bus/rbd`;
  } else {
    const read = await readRbdNodeState(rbd.mountDir);
    const state = read && {
      ...read,
      mounts: read.mounts.filter((m) => !unreadable.has(basename(m.mountPoint))),
      processes: read.processes.filter((p) => !unreadable.has(basename(p.mountPoint))),
      loops: read.loops.filter((l) => !unreadable.has(basename(dirname(l.backingFile)))),
    };
    findings = rbdMappingFindings(state, held.node, held.volumes);
    mapped = new Set((state?.loops ?? []).map((l) => basename(dirname(l.backingFile)))).size;
    where = `under ${rbd.mountDir}`;
  }
  for (const f of findings) add(f);
  return {
    problems: findings.filter((f) => f.severity !== 'ok').length,
    agreement: {
      check: 'ledger',
      severity: 'ok',
      message: `ledger and kernel agree on node ${held.node}: ${mapped} rbd mapping(s) ${where}, each held in the ledger`,
    },
  };
}

/** A hold of `node` on a volume in use that has no mapping here. */
function staleTickets(holds: VolumeDoc[], node: string, isMapped: (volume: string) => boolean, missing: string): Finding[] {
  return holds.flatMap((doc) => {
    const entry = doc.status.nodes[node];
    if (!entry || !isInUse(entry.phase) || isMapped(doc.name)) return []; // detaching: the detaching check's to report
    if (doc.spec.shared) return []; // no rbd mapping: its mounts are the cephfs check's (doctor/cephfs.ts)
    return [
      {
        check: 'ledger',
        severity: entry.phase === 'attached' ? 'error' : 'warning',
        message:
          `stale ticket: volume ${doc.name} is ${entry.phase} on node ${node} in the ledger (${entry.device ? `device ${entry.device}, ` : ''}since ${entry.since}), ` +
          `but ${missing}` +
          (entry.phase === 'attaching' ? ' (if a waitforattach is running right now, run latch doctor again)' : ''),
        fix: `latch volume release ${doc.name} --node ${node} --node-is-down`,
        note: `safe: without a device nothing on ${node} can write to it; a pod that still wants it gets it back through kubelet's next waitforattach`,
      } satisfies Finding,
    ];
  });
}

/** A mounted device of a volume the ledger does not know this node holds. */
function unheldMount(device: string, image: string, target: string, node: string): Finding {
  return {
    check: 'mounts',
    severity: 'error',
    message: `${device} (rbd volume ${image}) is mounted at ${target}, but the ledger does not know that node ${node} holds ${image}`,
    fix: `umount ${sh(target)}`,
    note: `first make sure nothing uses it: findmnt -R ${sh(target)}`,
  };
}

/**
 * The findings for the kernel client's mappings (krbd) against this node's holds among `volumes` (pure, as
 * rbdMappingFindings): a hold without a mapping is a stale ticket; a mapping of a volume this node does not hold is
 * stale, and an unmounted second mapping of one image is left over from a crash (the next attach unmaps it too).
 */
export function krbdMappingFindings(
  mappings: { image: string; device: string; mountPoints: string[] }[],
  node: string,
  volumes: VolumeDoc[],
): Finding[] {
  const holds = volumes.filter((doc) => nodeHoldsDevice(doc, node));
  const held = new Set(holds.map((doc) => doc.name));
  const findings = staleTickets(holds, node, (volume) => mappings.some((m) => m.image === volume), 'the kernel maps no image of it here');
  for (const m of mappings) {
    // The one the next attach keeps; the others, unmounted, are a crash's leftovers.
    const kept = deviceInUse(
      mappings.filter((other) => other.image === m.image),
      new Set(mappings.filter((other) => other.mountPoints.length > 0).map((other) => other.device)),
    );
    const duplicate = kept !== m && m.mountPoints.length === 0;
    if (held.has(m.image) && !duplicate) continue;
    if (!held.has(m.image)) for (const target of m.mountPoints) findings.push(unheldMount(m.device, m.image, target, node));
    const mountedAt = m.mountPoints.length > 0 ? ` (mounted at ${m.mountPoints.join(', ')})` : '';
    findings.push({
      check: 'rbd-mappings',
      severity: duplicate ? 'warning' : 'error',
      message: duplicate
        ? `${m.device} is a second mapping of rbd volume ${m.image} besides ${kept?.device}, left over from a crash`
        : `stale rbd mapping of ${m.image} (${m.device}${mountedAt}): the ledger has no hold of node ${node} on volume ${m.image}`,
      fix: `rbd device unmap ${m.device}`,
      note:
        (m.mountPoints.length > 0 ? `after unmounting ${m.mountPoints.join(', ')} (see the mounts finding); ` : '') +
        'then run latch doctor again',
    });
  }
  return findings;
}

interface Mapping {
  image: string;
  mountPoint: string;
  mounts: RbdNodeState['mounts'];
  pids: number[];
  loops: RbdNodeState['loops'];
}

/**
 * The findings for the kernel's rbd mappings against this node's holds among `volumes` (pure: the unit tests feed it planted
 * states). A hold without a loop device is a stale ticket; a mapping of a volume this node does not hold, and a
 * dead mapping (a mount without its process, a process without its mount, stacked mounts or processes, a loop
 * device over a mount that is gone) is reported with the commands that clear it, in the order that cannot hang
 * (design c): detach the loop device, abort the FUSE connection, kill the process, unmount.
 */
export function rbdMappingFindings(state: RbdNodeState | undefined, node: string, volumes: VolumeDoc[]): Finding[] {
  const holds = volumes.filter((doc) => nodeHoldsDevice(doc, node));
  const findings: Finding[] = [];
  const mappings = new Map<string, Mapping>();
  const mapping = (mountPoint: string): Mapping => {
    let m = mappings.get(mountPoint);
    if (!m) {
      m = { image: basename(mountPoint), mountPoint, mounts: [], pids: [], loops: [] };
      mappings.set(mountPoint, m);
    }
    return m;
  };
  for (const m of state?.mounts ?? []) mapping(m.mountPoint).mounts.push(m);
  for (const p of state?.processes ?? []) mapping(p.mountPoint).pids.push(p.pid);
  for (const l of state?.loops ?? []) {
    // Only <mountDir>/<image>/<image> is one of latch's; anything else over the mount dir is reported as it is.
    mapping(dirname(l.backingFile)).loops.push(l);
  }

  const held = new Map(holds.map((doc) => [doc.name, doc]));
  const isMapped = (volume: string) => state?.loops.some((l) => l.backingFile === `${state.mountDir}/${volume}/${volume}`) ?? false;
  findings.push(...staleTickets(holds, node, isMapped, 'no loop device over its rbd-fuse file is set up here'));

  for (const m of mappings.values()) {
    const isHeld = held.has(m.image);
    const dead: string[] = [];
    if (m.mounts.length > 0 && m.pids.length === 0) dead.push('its FUSE mount has no rbd-fuse process (I/O on it fails or hangs)');
    if (m.pids.length > 0 && m.mounts.length === 0) dead.push('its rbd-fuse process has no mount');
    if (m.mounts.length > 1) dead.push(`${m.mounts.length} FUSE mounts are stacked at ${m.mountPoint}`);
    if (m.pids.length > 1) dead.push(`${m.pids.length} rbd-fuse processes serve it`);
    if (m.loops.length > 0 && m.mounts.length === 0) dead.push('its loop device is over a FUSE mount that is gone');
    if (isHeld && dead.length === 0) continue;

    const mountedAt = m.loops.flatMap((l) => l.mountPoints.map((target) => ({ device: l.device, target })));
    const parts = [
      ...m.loops.map((l) => `${l.device}${l.mountPoints.length > 0 ? ` (mounted at ${l.mountPoints.join(', ')})` : ''}`),
      ...m.mounts.map((mt) => `FUSE mount ${mt.mountPoint}`),
      ...m.pids.map((pid) => `rbd-fuse pid ${pid}`),
    ];
    const why = [...(isHeld ? [] : [`the ledger has no hold of node ${node} on volume ${m.image}`]), ...dead];
    const clear = clearCommands(m, state?.fusectlMounted ?? false);

    if (!isHeld) for (const { device, target } of mountedAt) findings.push(unheldMount(device, m.image, target, node));
    const inUse = mountedAt.length > 0;
    findings.push({
      check: 'rbd-mappings',
      // Only a lone process can do no harm: without a mount no I/O reaches it and nothing can hang on it.
      severity: m.loops.length === 0 && m.mounts.length === 0 ? 'warning' : 'error',
      message: `${isHeld ? 'dead' : 'stale'} rbd mapping of ${m.image} (${parts.join(', ')}): ${why.join('; ')}`,
      ...(isHeld && inUse
        ? {
            note:
              `its filesystem is mounted at ${mountedAt.map((x) => x.target).join(', ')} and gets I/O errors: delete the pod that uses it; ` +
              `kubelet's unmountdevice then clears the mapping, and the next attach maps it anew`,
          }
        : {
            fix: clear,
            note:
              (inUse ? `after unmounting ${mountedAt.map((x) => x.target).join(', ')} (see the mounts finding); ` : '') +
              'in this order nothing can hang on a dead or fenced rbd-fuse; then run latch doctor again',
          }),
    });
  }
  return findings;
}

/** The shell commands that clear a mapping, from kernel state only: detach, abort, kill, unmount (design c). */
function clearCommands(m: Mapping, fusectlMounted: boolean): string {
  const steps: string[] = m.loops.map((l) => `losetup -d ${l.device}`);
  const connections = m.mounts.flatMap((mt) => (mt.connection === undefined ? [] : [mt.connection]));
  if (connections.length > 0 && !fusectlMounted) steps.push(`mount -t fusectl fusectl ${FUSECTL}`);
  for (const c of connections) steps.push(`echo 1 > ${FUSECTL}/${c}/abort`);
  if (m.pids.length > 0) steps.push(`kill -KILL ${m.pids.join(' ')}`);
  for (let i = 0; i < m.mounts.length; i++) steps.push(`umount ${sh(m.mountPoint)}`);
  if (m.mounts.length > 0 || m.pids.length > 0) steps.push(`rmdir ${sh(m.mountPoint)}`);
  return steps.join('; ');
}
