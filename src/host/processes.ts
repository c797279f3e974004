// Processes of this host by name, from /proc (or a fake one for tests, $LATCH_PROC_ROOT): what doctor needs to find
// kube-controller-manager, and plugin-dir.ts kubelet.
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';

export interface HostProcess {
  pid: number;
  argv: string[];
  /** /proc/<pid>/comm: the name, cut at 15 characters by the kernel. */
  comm: string;
}

/** The processes `matches` accepts, lowest pid first; those gone meanwhile or unreadable are skipped. */
export async function findProcesses(procRoot: string, matches: (p: HostProcess) => boolean): Promise<HostProcess[]> {
  let entries: string[];
  try {
    entries = await readdir(procRoot);
  } catch {
    return [];
  }
  const pids = entries
    .filter((e) => /^[0-9]+$/.test(e))
    .map(Number)
    .sort((a, b) => a - b);
  const found: HostProcess[] = [];
  for (const pid of pids) {
    let argv: string[];
    try {
      argv = (await readFile(join(procRoot, String(pid), 'cmdline'), 'utf8')).split('\0');
    } catch {
      continue;
    }
    if (argv[argv.length - 1] === '') argv.pop();
    const comm = await readFile(join(procRoot, String(pid), 'comm'), 'utf8').then(
      (c) => c.trim(),
      () => '',
    );
    const p = { pid, argv, comm };
    if (matches(p)) found.push(p);
  }
  return found;
}
