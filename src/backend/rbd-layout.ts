// What the rbd backend keeps in a node's mount dir (backend.mountDir), in one place: the rbd-fuse client, the backend,
// the PV secrets' keyrings, the node client's choice and doctor all name these paths from here.
//
//   <mountDir>/<image>/                   an rbd-fuse mount point (`rbd-fuse -r IMAGE`: that image alone)
//   <mountDir>/<image>/<image>            the image's file in it: the loop device's backing file
//   <mountDir>/.logs/<image>.log          that daemon's log (its sessions' global ids: sys/fuse.ts, rbdFuseGlobalIds)
//   <mountDir>/.clients/<image>           the client instance that serves the image's mapping (either node client)
//   <mountDir>/.keys/client.<id>.keyring  the cephx key of a PV's secret (node/secrets.ts)
//   <mountDir>/.node-client               which node client "auto" chose on this node (client-choice.ts)
//   <mountDir>/.export-<image>@<snap>.…   a snapshot exported for a backup, removed on release
//
// Everything but the mount points is a dot-name, so no image (a volume name never starts with '.') collides with it,
// and nothing but rbd-fuse is ever below a mount point: a fenced mount hangs whoever looks inside.
import { basename, dirname, join } from 'node:path';
import { tempPathFor } from '../atomic-file.js';

/** The rbd-fuse mount point of `image`. */
export function fuseMountPoint(mountDir: string, image: string): string {
  return join(mountDir, image);
}

/** The image's file in its rbd-fuse mount, which the loop device is set up over. */
export function fuseImageFile(mountDir: string, image: string): string {
  return join(mountDir, image, image);
}

/** The image whose rbd-fuse file `backingFile` is, when it is one of `mountDir`'s (<mountDir>/<image>/<image>). */
export function imageOfFuseFile(mountDir: string, backingFile: string): string | undefined {
  const image = basename(backingFile);
  return backingFile === fuseImageFile(mountDir, image) ? image : undefined;
}

/** Whether `path` is a mount point of `mountDir`'s (directly below it), as rbd-fuse's command line names it. */
export function isFuseMountPoint(mountDir: string, path: string): boolean {
  return path.startsWith('/') && dirname(path) === mountDir && !basename(path).startsWith('.');
}

/** Where the daemon's log directory is: beside the mount points, never below one. */
export function fuseLogDir(mountDir: string): string {
  return join(mountDir, '.logs');
}

/** The log of the image's rbd-fuse daemon. */
export function fuseLogFile(mountDir: string, image: string): string {
  return join(fuseLogDir(mountDir), `${image}.log`);
}

/** Where the instance that serves the image's mapping is recorded. */
export function clientRecordDir(mountDir: string): string {
  return join(mountDir, '.clients');
}

/** The file that names the client instance serving `image`'s mapping. */
export function clientRecordFile(mountDir: string, image: string): string {
  return join(clientRecordDir(mountDir), image);
}

/** Where the keyrings of PV secrets' identities are written. */
export function keyringDir(mountDir: string): string {
  return join(mountDir, '.keys');
}

/** The keyring file of the cephx identity `client.<clientId>`. */
export function keyringFile(mountDir: string, clientId: string): string {
  return join(keyringDir(mountDir), `client.${clientId}.keyring`);
}

/** The record of the node client "auto" chose on this node. */
export function nodeClientFile(mountDir: string): string {
  return join(mountDir, '.node-client');
}

/** A fresh file to export a snapshot into (a temp name of atomic-file.ts: a killed export is recognisable). */
export function snapshotExportFile(mountDir: string, image: string, snapshot: string): string {
  return tempPathFor(join(mountDir, `export-${image}@${snapshot}`));
}
