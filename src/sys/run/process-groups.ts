// Every child is the leader of its own process group, so a deadline, or the driver's SIGTERM, kills the whole group:
// grandchildren included. The groups of the children still running are kept here.
import { readdirSync, readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';

/** How long a group has after SIGTERM before SIGKILL, and a child after SIGKILL before it is no longer waited for. */
export const KILL_GRACE_MS = 2_000;
const GROUP_POLL_MS = 20;

/** Process group ids (= pids, since every child is a group leader) of the children still running. */
export const running = new Set<number>();

/**
 * Kills the process group of every child still running, with SIGKILL, synchronously.
 * For the protocol layer's SIGTERM handler: kubelet's own deadline must not leave our children behind.
 */
export function killAllChildren(): void {
  for (const pgid of running) {
    signalGroup(pgid, 'SIGKILL');
  }
}

/** Number of children currently running (for tests and diagnostics). */
export function runningChildren(): number {
  return running.size;
}

export function signalGroup(pgid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pgid, signal);
  } catch {
    // ESRCH: the group is already gone.
  }
}

/**
 * Waits until every member of the group has exited (those that obey SIGTERM take a moment to die, more under load),
 * or until the grace period's SIGKILL has been sent.
 */
export async function untilGroupGone(pgid: number, killed: Promise<void>): Promise<void> {
  let sent = false;
  void killed.then(() => {
    sent = true;
  });
  while (!sent && groupAlive(pgid)) await sleep(GROUP_POLL_MS);
}

/**
 * Whether any process of the group is still running. Zombies do not count: an orphan that died keeps its group
 * "alive" for kill(2) until init reaps it, and it needs no SIGKILL.
 */
function groupAlive(pgid: number): boolean {
  let entries: string[];
  try {
    entries = readdirSync('/proc');
  } catch {
    try {
      process.kill(-pgid, 0);
      return true;
    } catch (err) {
      return (err as NodeJS.ErrnoException).code === 'EPERM';
    }
  }
  for (const entry of entries) {
    if (entry.charCodeAt(0) < 48 || entry.charCodeAt(0) > 57) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
    } catch {
      continue;
    }
    // pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses, so split after the last ')'.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (Number(fields[2]) === pgid && fields[0] !== 'Z' && fields[0] !== 'X') return true;
  }
  return false;
}
