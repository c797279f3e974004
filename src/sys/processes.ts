// Whether a process of this host still exists: how a dead writer's leftovers (lock files, temp files, temporary
// snapshots named after their pid) are told from a live writer's.
import { readFileSync } from 'node:fs';

/** True when `pid` is a live process of this host (EPERM: it exists, owned by someone else). */
export function processExists(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * When the process started (field 22 of /proc/<pid>/stat, in clock ticks since boot), or undefined when it is gone:
 * with the pid, it names one process, where a pid alone may have been reused.
 */
export function processStartTime(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The command name (field 2) is in parentheses and may hold spaces or parentheses: count from the last ')'.
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19];
  } catch {
    return undefined;
  }
}
