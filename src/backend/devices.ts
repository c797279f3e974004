// Which of a volume's block devices is the one in use, for every backend that sets up devices on the node (loop
// devices over images or over rbd-fuse's files, krbd mappings) and for doctor.
import { LatchError } from '../errors.js';
import { mountedSources } from '../sys/mounts.js';

/**
 * Of one volume's devices (lowest first; more than one only after a crash between two set-ups, or callers that raced),
 * the one every caller uses: the mounted one, else the first. Doctor tells the others apart by the same rule.
 */
export function deviceInUse<T extends { device: string }>(devices: readonly T[], mounted: ReadonlySet<string>): T | undefined {
  return devices.find((d) => mounted.has(d.device)) ?? devices[0];
}

/** deviceInUse, reading the mount table only when there is a choice. */
export async function deviceToUse<T extends { device: string }>(devices: readonly T[]): Promise<T | undefined> {
  return devices.length <= 1 ? devices[0] : deviceInUse(devices, await mountedSources());
}

/** Keeps the device in use and frees (with `free`) the other ones nothing mounts; returns the kept device's path. */
export async function keepOneDevice<T extends { device: string }>(devices: readonly T[], free: (dup: T) => Promise<void>): Promise<string> {
  const mounted = await mountedSources();
  const keep = deviceInUse(devices, mounted);
  if (!keep) throw new LatchError('no device to keep');
  for (const dup of devices) if (dup !== keep && !mounted.has(dup.device)) await free(dup).catch(() => undefined);
  return keep.device;
}
