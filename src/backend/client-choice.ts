// Which node client `backend.client: "auto"` (the default) means on this node: the kernel client (krbd) where the
// kernel has the rbd module (loaded: /sys/bus/rbd; or loadable: listed in modules.dep or modules.builtin of the running
// kernel), else rbd-fuse + loop. krbd has no daemon that a restart of kubelet could kill, and no FUSE hop.
//
// The choice is made once per node and recorded in <mountDir>/.node-client: a client finds only its own mappings, so a
// node that started mapping with one must keep it (the module may become loadable later, when a package brings it).
// To choose again, remove that file while no volume is mapped on the node. An explicit "krbd" or "rbd-fuse" is used
// as it is.
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { release } from 'node:os';
import { join } from 'node:path';
import { writeFileAtomicSync } from '../atomic-file.js';
import type { RbdClientKind, RbdClientSetting } from '../config.js';
import { nodeClientFile } from './rbd-layout.js';

const CLIENTS: readonly RbdClientKind[] = ['krbd', 'rbd-fuse'];

/** Where the kernel's modules and sysfs are: the host's, except in tests. */
export interface KernelPaths {
  sys: string;
  modules: string;
}

const HOST: KernelPaths = { sys: '/sys', modules: join('/lib/modules', release()) };

/** The node client to use: the setting itself, or for "auto" the one recorded for this node (recorded now when `record`). */
export function chooseRbdClient(
  setting: RbdClientSetting,
  mountDir: string,
  options: { record: boolean; kernel?: KernelPaths },
): RbdClientKind {
  if (setting !== 'auto') return setting;
  const file = nodeClientFile(mountDir);
  const recorded = readRecorded(file);
  if (recorded !== undefined) return recorded;
  const chosen: RbdClientKind = kernelHasRbd(options.kernel ?? HOST) ? 'krbd' : 'rbd-fuse';
  if (options.record) {
    // Atomically: a concurrent call reads the whole word or nothing; durably: the node keeps its client after a reboot.
    mkdirSync(mountDir, { recursive: true, mode: 0o700 });
    writeFileAtomicSync(file, `${chosen}\n`, { mode: 0o644 });
  }
  return chosen;
}

function readRecorded(file: string): RbdClientKind | undefined {
  let text: string;
  try {
    text = readFileSync(file, 'utf8').trim();
  } catch {
    return undefined;
  }
  return CLIENTS.find((c) => c === text);
}

/** Whether the kernel has the rbd module loaded, or can load it (modules.dep), or has it built in. */
export function kernelHasRbd(kernel: KernelPaths): boolean {
  if (existsSync(join(kernel.sys, 'bus', 'rbd'))) return true;
  // e.g. "kernel/drivers/block/rbd.ko.zst: kernel/net/ceph/libceph.ko.zst" in modules.dep, the path in modules.builtin.
  const listsRbd = (name: string, pattern: RegExp): boolean => {
    try {
      return pattern.test(readFileSync(join(kernel.modules, name), 'utf8'));
    } catch {
      return false;
    }
  };
  return listsRbd('modules.dep', /^(\S*\/)?rbd\.ko(\.\w+)?:/m) || listsRbd('modules.builtin', /^(\S*\/)?rbd\.ko$/m);
}
