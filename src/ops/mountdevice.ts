// mountdevice <deviceMountPath> <devicePath> <json> (node): put a filesystem on the volume only if it has none,
// mount it at kubelet's global path, and check with findmnt that the right device is mounted there.
import { mkdir, realpath, stat } from 'node:fs/promises';
import { LatchError } from '../errors.js';
import type { VolumeDoc } from '../ledger/types.js';
import { failure, success } from '../protocol/reply.js';
import { makeFs, probeFsType } from '../sys/blockdev.js';
import { findmnt, mount, mountsAt, umount } from '../sys/mounts.js';
import { openBackend, openLedger } from './services.js';
import type { OpCall } from './types.js';

export async function run(call: OpCall) {
  const { config } = call;
  const options = call.options!;
  const node = config.nodeName;
  const path = call.args.deviceMountPath!;
  const ledger = await openLedger(config);
  const backend = await openBackend(config);
  const name = await ledger.resolve(options);
  call.facts.volume = name;

  const doc = await ledger.get(name);
  const entry = doc?.status.nodes[node];
  if (!doc || !entry || (entry.phase !== 'attaching' && entry.phase !== 'attached')) {
    return failure(`volume ${name} is not attached to node ${node} (${doc ? doc.status.state : 'unknown volume'}); waitforattach comes first`);
  }
  const device = await backend.findDevice(name);
  if (!device) return failure(`volume ${name} has no device on node ${node}; waitforattach sets it up`);
  const given = await realpath(call.args.devicePath!).catch(() => call.args.devicePath!);
  if (given !== device) {
    const owner = await backend.volumeOfDevice(given);
    return failure(
      `device ${call.args.devicePath} is not the device of volume ${name} (${device})` +
        (owner ? `: it belongs to volume ${owner}` : ': it is not a latch volume'),
    );
  }
  call.facts.device = device;
  await ensureDirectory(path);

  const mounted = await mountsAt(path);
  if (mounted.length > 0) {
    const top = mounted[mounted.length - 1]!;
    if (top.source === device) return success(); // already done
    return failure(`${path} already has ${top.source} mounted; not mounting volume ${name} over it`);
  }

  const readOnly = options.readOnly || entry.readOnly;
  const fsType = await ensureFilesystem(doc, device, options.fsType, readOnly, node);
  if (doc.status.filesystem !== fsType) {
    await ledger.update(name, (d) => (d && d.status.filesystem !== fsType ? { ...d, status: { ...d.status, filesystem: fsType } } : d));
  }

  await mount(device, path, { fsType, options: options.mountOptions, readOnly });
  const check = await findmnt(path);
  if (check?.source !== device) {
    await umount(path);
    return failure(`after mounting, findmnt shows ${check?.source ?? 'nothing'} at ${path} instead of ${device}; undone`);
  }
  return success();
}

/** Returns the filesystem to mount: the one on the device, or a new one when (and only when) the device is blank. */
async function ensureFilesystem(
  doc: VolumeDoc,
  device: string,
  wanted: string | undefined,
  readOnly: boolean,
  node: string,
): Promise<string> {
  const found = await probeFsType(device);
  if (found) {
    if (wanted && wanted !== found) {
      throw new LatchError(`volume ${doc.name} holds a ${found} filesystem, but ${wanted} was asked for; latch never reformats a volume`);
    }
    return found;
  }
  if (doc.status.filesystem) {
    throw new LatchError(
      `volume ${doc.name} held a ${doc.status.filesystem} filesystem but its device shows none now; ` +
        'refusing to format it (inspect the image before anything else)',
    );
  }
  if (readOnly) {
    throw new LatchError(`volume ${doc.name} is blank and was asked for read-only: there is nothing to mount; attach it read-write once to format it`);
  }
  const others = Object.keys(doc.status.nodes).filter((n) => n !== node);
  if (others.length > 0) {
    throw new LatchError(`volume ${doc.name} is blank but also held by ${others.join(', ')}; refusing to format it`);
  }
  const fsType = wanted ?? doc.spec.fsType;
  await makeFs(device, fsType);
  return fsType;
}

async function ensureDirectory(path: string): Promise<void> {
  const info = await stat(path).catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return undefined;
    throw err;
  });
  if (!info) await mkdir(path, { recursive: true, mode: 0o750 });
  else if (!info.isDirectory()) throw new LatchError(`mount path ${path} exists and is not a directory`);
}
