// doctor: rbd-fuse daemons a service restart would kill. Every rbd-fuse serves an attached volume; one left in a
// systemd service's cgroup (kubelet's, when a driver from before latch started them elsewhere ran it) dies with
// `systemctl restart <service>` (KillMode=control-group, the default), and the pods' I/O on its volume fails.
// And rbd-fuse daemons an older latch started with librbd's cache on, which a fence can make lie about fsync.
import { realpath } from 'node:fs/promises';
import { isFuseMountPoint } from '../backend/rbd-layout.js';
import { serviceOf } from '../sys/cgroup.js';
import { rbdFuseProcesses, runsWithoutRbdCache } from '../sys/fuse.js';
import type { AddFinding } from './findings.js';

export async function checkDaemonCgroups(add: AddFinding): Promise<void> {
  const daemons = await rbdFuseProcesses();
  let exposed = 0;
  for (const { pid, argv } of daemons) {
    const service = serviceOf(pid);
    if (service === undefined) continue;
    exposed++;
    // rbd-fuse's last argument is its mount point.
    const mountPoint = argv.filter((a) => a.length > 0).pop() ?? '?';
    add({
      check: 'rbd-daemons',
      severity: 'warning',
      message:
        `rbd-fuse (pid ${pid}, serving ${mountPoint}) runs in the cgroup of ${service}: ` +
        `restarting ${service} kills it, and the I/O of the pods using that volume fails`,
      note:
        `do not restart ${service} until the volume has been detached and attached again (move its pods), which starts ` +
        `its rbd-fuse outside any service; or prefer the kernel client (backend.client "krbd" or "auto"), which has no daemon`,
    });
  }
  if (daemons.length > 0 && exposed === 0) {
    add({
      check: 'rbd-daemons',
      severity: 'ok',
      message: `${daemons.length} rbd-fuse daemon(s), none in a service's cgroup: a restart of kubelet leaves them running`,
    });
  }
}

/**
 * The rbd-fuse daemons serving mounts under `mountDir` (this node's, startRbdFuse) that run with librbd's cache,
 * started before latch turned it off: after a fence, such a daemon's fsync can report success for writes that never
 * land (docs/design/rbd-backend.md j). Only a new mapping starts a daemon without it.
 */
export async function checkDaemonCache(mountDir: string, add: AddFinding): Promise<void> {
  let dir: string;
  try {
    dir = await realpath(mountDir); // the directory itself, never a mount point below it
  } catch {
    return; // nothing was ever mapped here
  }
  const daemons = (await rbdFuseProcesses()).flatMap(({ pid, argv }) => {
    const mountPoint = argv.find((arg) => isFuseMountPoint(dir, arg));
    return mountPoint === undefined ? [] : [{ pid, argv, mountPoint }];
  });
  let cached = 0;
  for (const { pid, argv, mountPoint } of daemons) {
    if (runsWithoutRbdCache(argv)) continue;
    cached++;
    add({
      check: 'rbd-cache',
      severity: 'warning',
      message:
        `rbd-fuse pid ${pid} (serving ${mountPoint}) runs with librbd's cache: if this node is fenced, ` +
        `its fsync can report success for writes that never reach the volume`,
      note: `detach the volume and attach it again (move its pods): latch starts its new rbd-fuse with --rbd-cache false`,
    });
  }
  if (daemons.length > 0 && cached === 0) {
    add({ check: 'rbd-cache', severity: 'ok', message: `${daemons.length} rbd-fuse daemon(s) under ${dir}, all with librbd's cache off` });
  }
}
