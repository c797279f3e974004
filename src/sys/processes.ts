// Whether a process of this host still exists: how a dead writer's leftovers (lock files, temp files, temporary
// snapshots named after their pid) are told from a live writer's.

/** True when `pid` is a live process of this host (EPERM: it exists, owned by someone else). */
export function processExists(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}
