// Control groups, for the one child that must outlive its driver call (run.ts, startDaemon: rbd-fuse). kubelet runs
// the driver inside its own cgroup, and a routine `systemctl restart kubelet` (KillMode=control-group, the default)
// kills every process in it: every rbd-fuse the driver started, and with them the pods' I/O. A new session and process
// group do not help; only leaving the cgroup does. Two ways, in this order:
//  - where systemd runs the host (/run/systemd/system exists): a transient scope of its own (systemd-run --scope),
//    which systemd itself keeps apart from kubelet's service;
//  - otherwise: latch's own cgroup, `latch` under the root of each hierarchy a service manager kills by (cgroup v2,
//    and the v1 name=systemd hierarchy where it is mounted): the caller moves itself there just for the fork of the
//    daemon's start-up, so the daemon is born outside the caller's cgroup, and moves back at once.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const CGROUP_ROOT = '/sys/fs/cgroup';
/** The cgroup latch's daemons are moved to where no systemd runs the host, under the root of each hierarchy. */
export const OWN_CGROUP = 'latch';

/** Whether systemd is the host's service manager (its own test: sd_booted(3)). */
export function hostRunsSystemd(): boolean {
  return existsSync('/run/systemd/system');
}

/** One cgroup hierarchy a service manager kills a service by: where it is mounted and how /proc/PID/cgroup names it. */
interface Hierarchy {
  mount: string;
  /** The line of /proc/PID/cgroup for this hierarchy: `0` (v2) or `name=systemd` (v1). */
  controllers: string;
}

/**
 * The hierarchies a service's processes are tracked (and killed) by: the cgroup v2 one (at /sys/fs/cgroup on a
 * unified host, /sys/fs/cgroup/unified on a hybrid one) and v1's name=systemd where it is mounted.
 */
function hierarchies(root = CGROUP_ROOT): Hierarchy[] {
  const found: Hierarchy[] = [];
  if (existsSync(join(root, 'cgroup.controllers'))) found.push({ mount: root, controllers: '' });
  else if (existsSync(join(root, 'unified', 'cgroup.controllers'))) found.push({ mount: join(root, 'unified'), controllers: '' });
  if (existsSync(join(root, 'systemd', 'cgroup.procs'))) found.push({ mount: join(root, 'systemd'), controllers: 'name=systemd' });
  return found;
}

/**
 * A process's cgroup in each hierarchy of /proc/PID/cgroup: `''` for v2 (line `0::PATH`), the controller list for
 * v1 (`name=systemd`, `cpu,cpuacct`, ...). undefined when the process is gone.
 */
export function cgroupsOf(pid: number | 'self'): Map<string, string> | undefined {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/cgroup`, 'utf8');
  } catch {
    return undefined;
  }
  const found = new Map<string, string>();
  for (const line of text.split('\n')) {
    const m = /^\d+:([^:]*):(.*)$/.exec(line);
    if (m) found.set(m[1] as string, m[2] as string);
  }
  return found;
}

/**
 * The systemd service whose cgroup holds the process (`kubelet.service`, ...), in the v2 or the name=systemd
 * hierarchy: a restart of that service kills it. undefined when it is in no service's cgroup (a scope, latch's own
 * cgroup, the root) or is gone.
 */
export function serviceOf(pid: number): string | undefined {
  const groups = cgroupsOf(pid);
  for (const key of ['', 'name=systemd']) {
    const service = groups
      ?.get(key)
      ?.split('/')
      .filter((part) => part.endsWith('.service'))
      .pop();
    if (service !== undefined) return service;
  }
  return undefined;
}

/**
 * Runs `start` (which must fork the daemon synchronously, as child_process.spawn does) with this process moved into
 * latch's own cgroup in each hierarchy, and moves it back to where it was right after, whatever happens. A child
 * forked meanwhile stays in latch's cgroup, out of the caller's. Where the cgroups cannot be written (not root, no
 * cgroup filesystem), `start` runs where the caller is: doctor reports daemons left in a service's cgroup.
 */
export function forkOutsideOwnCgroup<T>(start: () => T, root = CGROUP_ROOT): T {
  const own = cgroupsOf('self');
  const moved: Array<{ mount: string; back: string }> = [];
  for (const { mount, controllers } of hierarchies(root)) {
    const back = own?.get(controllers);
    if (back === undefined || back === `/${OWN_CGROUP}`) continue;
    const target = join(mount, OWN_CGROUP);
    try {
      mkdirSync(target, { recursive: true, mode: 0o755 });
      writeFileSync(join(target, 'cgroup.procs'), String(process.pid));
      moved.push({ mount, back });
    } catch {
      // Not root, or a hierarchy we may not write: left as it is.
    }
  }
  try {
    return start();
  } finally {
    for (const { mount, back } of moved) {
      try {
        writeFileSync(join(mount, back, 'cgroup.procs'), String(process.pid));
      } catch {
        // The caller's cgroup is gone (its service stopped): this process stays in latch's, which harms nothing.
      }
    }
  }
}
