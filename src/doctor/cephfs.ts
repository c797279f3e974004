// latch doctor's checks of shared volumes (backend.cephfs): the node client is there, the file system's MDS answers
// as the node's identity, every CephFS mount of this node's identity is one the ledger knows of (a stale one is an
// error, with the commands that take it down without hanging on a dead client), and each mounted volume's quota use.
import { existsSync, readFileSync } from 'node:fs';
import { sharedVolumesFor } from '../backend/cephfs.js';
import type { Context } from '../context.js';
import { errorMessage } from '../errors.js';
import { nodeHoldsDevice } from '../ledger/arbitrate.js';
import { fuseMountsAt } from '../sys/fuse.js';
import { mdsStatus, subvolumeInfo } from '../sys/cephfs.js';
import { findTool, toolSearchPath } from '../sys/run.js';
import { formatSize } from '../size.js';
import { sh, type AddFinding } from './findings.js';

/** The longest a CephFS check's ceph call may take. */
const CEPHFS_CHECK_MS = 15_000;

/** A volume this full (quota use) is reported as a warning. */
const FULL = 0.9;

export async function checkSharedVolumes(ctx: Context, env: NodeJS.ProcessEnv, add: AddFinding): Promise<void> {
  const rbd = ctx.config.backend;
  if (rbd.type !== 'rbd' || rbd.cephfs === undefined) return;
  const cephfs = rbd.cephfs;
  let shared;
  try {
    shared = sharedVolumesFor(ctx.config);
  } catch (err) {
    add({ check: 'cephfs', severity: 'error', message: `shared volumes cannot be used here: ${errorMessage(err)}` });
    return;
  }
  if (!shared) return;
  // The node client.
  if (shared.clientKind === 'ceph-fuse') {
    const found = findTool('ceph-fuse', toolSearchPath(env));
    if (!found)
      add({
        check: 'cephfs',
        severity: 'error',
        message: 'ceph-fuse is missing: shared volumes cannot be mounted',
        fix: 'apt-get install -y ceph-fuse',
      });
    else if (!existsSync('/dev/fuse')) add({ check: 'cephfs', severity: 'error', message: 'no /dev/fuse: ceph-fuse cannot mount' });
    else add({ check: 'cephfs', severity: 'ok', message: `node client: ceph-fuse (${found})` });
  } else {
    const inKernel = /^\S*\s+ceph$/m.test(readFileSafe('/proc/filesystems'));
    add(
      inKernel
        ? { check: 'cephfs', severity: 'ok', message: 'node client: the kernel CephFS client' }
        : {
            check: 'cephfs',
            severity: 'error',
            message: 'backend.cephfs.client is "kernel", but the kernel has no ceph filesystem',
            fix: 'modprobe ceph',
          },
    );
  }
  // The MDS, as the node's identity; every call bounded as doctor's rbd checks are (a quota look-up per mount
  // included), never run()'s 120 s default.
  const identity = { cephConf: rbd.cephConf, clientId: rbd.clientId, keyring: rbd.keyring, commandTimeoutMs: CEPHFS_CHECK_MS };
  try {
    const { active, sessionTimeoutSeconds } = await mdsStatus(identity, cephfs.fsName, CEPHFS_CHECK_MS);
    add(
      active
        ? { check: 'cephfs', severity: 'ok', message: `file system ${cephfs.fsName} has an active MDS (as client.${rbd.clientId})` }
        : { check: 'cephfs', severity: 'error', message: `file system ${cephfs.fsName} has no active MDS: shared volumes hang or fail` },
    );
    // A dead client's caps stall the manager's subvolume calls until its session times out (docs/operations.md,
    // "Shared volumes on CephFS", Limits): a commandTimeout at or below that fails those calls meanwhile.
    if (sessionTimeoutSeconds !== undefined && ctx.config.commandTimeout <= sessionTimeoutSeconds) {
      add({
        check: 'cephfs',
        severity: 'warning',
        message:
          `commandTimeout (${ctx.config.commandTimeout} s) is not above ${cephfs.fsName}'s session_timeout (${sessionTimeoutSeconds} s): ` +
          "while a dead client's session lasts, shared volumes' mounts, creations and deletions fail instead of waiting for it",
        fix: `set "commandTimeout" above ${sessionTimeoutSeconds} in ${ctx.config.source}`,
      });
    }
  } catch (err) {
    add({
      check: 'cephfs',
      severity: 'error',
      message: `the MDS map of ${cephfs.fsName} cannot be read as client.${rbd.clientId}: ${errorMessage(err)}`,
      note: "the node's mon caps need 'allow service mds r' (docs/operations.md, \"Shared volumes on CephFS\")",
    });
  }
  // This node's mounts against the ledger, and their quota use.
  const node = ctx.config.nodeName;
  for (const { target, volume } of await shared.ownMounts()) {
    const doc = volume === undefined ? undefined : await ctx.ledger.get(volume).catch(() => undefined);
    if (!doc || !doc.spec.shared || !nodeHoldsDevice(doc, node)) {
      const fuse = (await fuseMountsAt(target))[0];
      const minor = fuse?.majorMinor.split(':')[1];
      const abort = minor === undefined ? '' : `echo 1 > /sys/fs/fuse/connections/${minor}/abort; `;
      add({
        check: 'cephfs',
        severity: 'error',
        message: `stale CephFS mount at ${target}${volume ? ` (volume ${volume})` : ''}: the ledger has no hold of node ${node} on it`,
        fix: `${abort}umount ${sh(target)}`,
      });
      continue;
    }
    const info =
      volume === undefined
        ? undefined
        : await subvolumeInfo(identity, { fsName: cephfs.fsName, group: cephfs.group, volume }).catch(() => undefined);
    if (!info || info.quotaBytes === undefined) continue;
    const use = info.usedBytes / info.quotaBytes;
    add({
      check: 'cephfs',
      severity: use >= FULL ? 'warning' : 'ok',
      message: `shared volume ${volume}: ${formatSize(info.usedBytes)} of ${formatSize(info.quotaBytes)} used (${Math.round(use * 100)}%)`,
      ...(use >= FULL && { fix: `latch volume expand ${volume} --size SIZE` }),
    });
  }
}

function readFileSafe(path: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return '';
  }
}
