// Non-attach mode's layout on a node: one node-private staging mount per volume that every pod bind-mounts from,
// and the pod a pod volume dir belongs to, read from the path alone (unmount gets nothing else).
import { cutOffIfFenced } from './fence.js';
import { rmdir } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import type { Config } from '../config.js';
import type { Context } from '../context.js';
import { releaseDevice, unmountTop, unmountTopOnceFree } from './device.js';

/** Mounts stacked at a staging path that leaving the node takes down. */
const MAX_STACKED = 16;

/**
 * `<stateDir>/staging/<node>/<volume>`. The node name is part of the path so that simulated nodes sharing a
 * stateDir (tests, the demo) never share a staging mount.
 */
export function stagingPath(config: Pick<Config, 'stateDir' | 'nodeName'>, name: string): string {
  return join(config.stateDir, 'staging', config.nodeName, name);
}

// kubelet's pod volume dir: <root>/pods/<podUID>/volumes/<vendor~driver>/<name>
const POD_VOLUME_DIR = /\/pods\/([^/]+)\/volumes\/[^/]+\/[^/]+$/;

/** The pod UID in kubelet's layout, else the whole path. */
export function podKeyOf(podDir: string): string {
  return POD_VOLUME_DIR.exec(podDir)?.[1] ?? podDir;
}

/**
 * The volume is no longer wanted on this node by any ticket: unmount the staging path, then release the device and
 * confirm it in the ledger. Returns the device when it is still mounted elsewhere (kept; the node keeps its hold,
 * so no other node can take the volume over while something here may still write to it).
 */
export async function leaveNode(ctx: Context, name: string): Promise<string | undefined> {
  const staging = stagingPath(ctx.config, name);
  const cut = await cutOffIfFenced(ctx, name);
  // Every mount stacked there goes; the last of the device's mounts frees a loop device with it (unmountTop).
  for (let i = 0; i < MAX_STACKED; i++) if (!(await (cut ? unmountTopOnceFree : unmountTop)(ctx, staging))) break;
  await rmdir(staging).catch(() => undefined);
  await rmdir(dirname(staging)).catch(() => undefined); // the node's staging dir, once empty
  return releaseDevice(ctx, name);
}
