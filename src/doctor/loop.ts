// doctor: whether the kernel can set up loop devices at all.
import { stat } from 'node:fs/promises';
import type { AddFinding } from './findings.js';

export async function checkLoopSupport(add: AddFinding): Promise<void> {
  try {
    if ((await stat('/dev/loop-control')).isCharacterDevice()) {
      add({ check: 'loop', severity: 'ok', message: '/dev/loop-control is present: the kernel can set up loop devices' });
      return;
    }
  } catch {
    // reported below
  }
  add({
    check: 'loop',
    severity: 'error',
    message: '/dev/loop-control is missing: no loop devices can be set up',
    fix: 'modprobe loop && echo loop > /etc/modules-load.d/latch.conf',
    note: 'in a container: run it privileged',
  });
}
