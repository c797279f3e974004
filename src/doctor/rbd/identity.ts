// The node's Ceph identity as doctor checks it: the rbd configuration with the node client chosen here, and the caps
// that identity should have, in the words of the ceph command that gives them (the caps themselves: sys/rbd.ts).
import type { Config, RbdBackendConfig, RbdClientKind } from '../../config.js';
import { nodeCaps } from '../../sys/rbd.js';
import { sh } from '../findings.js';

/** An rbd configuration with the node client that "auto" stands for here (backend/client-choice.ts). */
export type RbdConfig = Config & { backend: RbdBackendConfig & { client: RbdClientKind } };

/** The node caps of docs/operations.md ("The rbd backend") as ceph's arguments: mon '...' osd '...'. */
export function nodeCapsWords(pool: string): string {
  return nodeCaps(pool).map(sh).join(' ');
}

/** What the node's identity may do on the monitors: `profile rbd` there minus its blocklisting. */
export function nodeMonCaps(pool: string): string {
  const caps = nodeCaps(pool);
  return caps[caps.indexOf('mon') + 1] ?? '';
}
