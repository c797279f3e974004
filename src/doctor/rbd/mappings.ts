// doctor, with the rbd backend: this node's rbd mappings (krbd devices, or rbd-fuse mounts with their loop devices)
// against the ledger's holds. Nothing below a FUSE mount is ever stat-ed or opened: a fenced rbd-fuse hangs every such
// call beyond any signal (design c), so mappings are read from /proc/self/mountinfo, /proc/PID/cmdline and
// /sys/block/loopN only.
import { realpath } from 'node:fs/promises';
import { basename, dirname } from 'node:path';
import { krbdMappings } from '../../backend/krbd.js';
import { deviceInUse } from '../../backend/devices.js';
import { fuseImageFile, isFuseMountPoint } from '../../backend/rbd-layout.js';
import type { Inventory } from '../../host/inventory.js';
import { isInUse, nodeHoldsDevice } from '../../ledger/arbitrate.js';
import type { VolumeDoc } from '../../ledger/types.js';
import { rbdFuseProcesses } from '../../sys/fuse.js';
import { listLoopDevices } from '../../sys/loop.js';
import { readMountInfo } from '../../sys/mounts.js';
import { sh, type AddFinding, type Finding } from '../findings.js';
import type { RbdConfig } from './identity.js';

const FUSECTL = '/sys/fs/fuse/connections';

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
  const under = (path: string) => isFuseMountPoint(dir, path);
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
  const isMapped = (volume: string) => state?.loops.some((l) => l.backingFile === fuseImageFile(state.mountDir, volume)) ?? false;
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

/**
 * The shell commands that clear a mapping, from kernel state only: detach, abort, kill, unmount (design c). The loop
 * device may let go of its file a moment after `losetup -d` (the kernel clears it on its last close), and until then a
 * plain umount is refused as busy: then the mount is detached lazily, which is safe once its connection is aborted
 * and its daemon killed (nothing can be served through it any more).
 */
function clearCommands(m: Mapping, fusectlMounted: boolean): string {
  const steps: string[] = m.loops.map((l) => `losetup -d ${l.device}`);
  const connections = m.mounts.flatMap((mt) => (mt.connection === undefined ? [] : [mt.connection]));
  if (connections.length > 0 && !fusectlMounted) steps.push(`mount -t fusectl fusectl ${FUSECTL}`);
  for (const c of connections) steps.push(`echo 1 > ${FUSECTL}/${c}/abort`);
  if (m.pids.length > 0) steps.push(`kill -KILL ${m.pids.join(' ')}`);
  for (let i = 0; i < m.mounts.length; i++) steps.push(`umount ${sh(m.mountPoint)} || umount -l ${sh(m.mountPoint)}`);
  if (m.mounts.length > 0 || m.pids.length > 0) steps.push(`rmdir ${sh(m.mountPoint)}`);
  return steps.join('; ');
}
