// doctor: rbd-fuse daemons a service restart would kill. Every rbd-fuse serves an attached volume; one left in a
// systemd service's cgroup (kubelet's, when a driver from before latch started them elsewhere ran it) dies with
// `systemctl restart <service>` (KillMode=control-group, the default), and the pods' I/O on its volume fails.
import { serviceOf } from '../../sys/cgroup.js';
import { rbdFuseProcesses } from '../../sys/fuse.js';
import type { AddFinding } from './report.js';

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
