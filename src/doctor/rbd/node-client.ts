// doctor, with the rbd backend: the node client latch maps images with here (krbd or rbd-fuse), what it needs of the
// kernel, and which other client this kernel could offer.
import { stat } from 'node:fs/promises';
import { RbdBackend } from '../../backend/rbd.js';
import type { AddFinding } from '../findings.js';
import type { RbdConfig } from './identity.js';

async function exists(path: string): Promise<boolean> {
  try {
    await stat(path);
    return true;
  } catch {
    return false;
  }
}

/** Which node client latch uses here, what it needs, and which other client this kernel could offer. */
export async function checkNodeClient(config: RbdConfig, add: AddFinding): Promise<void> {
  const rbd = config.backend;
  const { kind } = new RbdBackend({ ...rbd, maxSize: config.maxSize, timeoutMs: config.commandTimeout * 1000 }).client;
  const krbd = await exists('/sys/bus/rbd');
  const nbd = (await exists('/sys/module/nbd')) || (await exists('/dev/nbd0'));
  const others =
    `kernel rbd: ${krbd ? 'available (/sys/bus/rbd)' : 'not available (no rbd module)'}, ` +
    `rbd-nbd: ${nbd ? 'available (nbd module)' : 'not available (no nbd module)'}`;
  if (rbd.client === 'krbd') {
    add(
      krbd
        ? {
            check: 'rbd-client',
            severity: 'ok',
            message: `node client ${kind}: rbd device map, one client instance per volume (noshare); ${others}`,
          }
        : {
            check: 'rbd-client',
            severity: 'error',
            message: `node client ${kind}: the kernel has no rbd module (/sys/bus/rbd is missing), so no volume can be mapped`,
            fix: 'modprobe rbd && echo rbd > /etc/modules-load.d/latch-rbd.conf',
            note: 'or set backend.client to "rbd-fuse" once no volume is mapped on this node',
          },
    );
    return;
  }
  if (!(await exists('/dev/fuse'))) {
    add({
      check: 'rbd-client',
      severity: 'error',
      message: `node client ${kind}: /dev/fuse is missing, so rbd-fuse cannot mount (${others})`,
      fix: 'modprobe fuse && echo fuse > /etc/modules-load.d/latch-fuse.conf',
      note: 'in a container: run it privileged, with /dev/fuse',
    });
    return;
  }
  add({
    check: 'rbd-client',
    severity: 'ok',
    message: `node client ${kind}: one rbd-fuse per volume under ${rbd.mountDir}, a loop device over its file; ${others}`,
    ...(krbd && {
      note: 'the kernel client serves I/O without FUSE (docs/performance.md, "rbd"): set backend.client to "krbd" once no volume is mapped on this node',
    }),
  });
}
