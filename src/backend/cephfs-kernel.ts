// The kernel CephFS client, where the kernel has the ceph module (real nodes; this machine has none, so it is tested
// against a fake mount table and a fake mount command: test/unit/backend-cephfs-kernel.test.ts).
//
//   mount -t ceph :/volumes/GROUP/VOLUME/UUID TARGET -o name=ID,secretfile=F,mds_namespace=FS,conf=CONF[,ro]
//
// The leading ":" makes mount.ceph read the monitors' addresses from the conf. The key goes to the kernel through a
// root-only file holding the bare key, taken from the identity's keyring (never argv, never a message). A mount is
// found in mountinfo: fsType ceph, its source ends with ":" and the subvolume's path, and its superblock options name
// the identity (name=ID), which is how simulated nodes on one host, each with its own identity, tell theirs apart.
// The kernel client has no admin socket, so no client instance is noted at mount: the node records its cephx entity
// alone (`entity:ID`, SharedVolumes.clientOf), and a fence finds its sessions on the MDS by the subvolume they mount
// and that entity (cephfs-sessions.ts: the kernel client sends both in its session metadata, as ceph-fuse does).
// That needs one identity per node, latch's default; a node sharing its identity with another holder is not fenced.
import { chmod, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { LatchError } from '../errors.js';
import { readMountInfo, type MountInfo } from '../sys/mounts.js';
import type { CephIdentity } from '../sys/rbd.js';
import { run } from '../sys/run.js';
import type { SharedClient, SharedMount } from './cephfs-client.js';

export interface KernelCephOptions {
  identity: CephIdentity;
  fsName: string;
  /** Where the secret file is written (the node-private mount dir). */
  mountDir: string;
  timeoutMs: number;
  /** The kernel's mount table; the host's unless a test gives its own. */
  mountTable?: () => Promise<MountInfo[]>;
  /** Runs mount(8)/umount(8); the host's unless a test gives its own. */
  exec?: (command: 'mount' | 'umount', args: string[], timeoutMs: number) => Promise<void>;
}

export class KernelCephClient implements SharedClient {
  readonly kind = 'kernel';
  private readonly table: () => Promise<MountInfo[]>;
  private readonly exec: NonNullable<KernelCephOptions['exec']>;

  constructor(private readonly options: KernelCephOptions) {
    this.table = options.mountTable ?? readMountInfo;
    this.exec = options.exec ?? (async (command, args, timeoutMs) => void (await run(command, args, { timeoutMs })));
  }

  private get secretFile(): string {
    return join(this.options.mountDir, `.${this.options.identity.clientId}.secret`);
  }

  /** The bare key of the identity, from its keyring (`key = AQ...`), into the root-only secret file. */
  private async writeSecret(): Promise<void> {
    const keyring = await readFile(this.options.identity.keyring, 'utf8').catch((err: unknown) => {
      throw new LatchError(`cannot read the keyring of client.${this.options.identity.clientId}`, { cause: err });
    });
    const key = /^\s*key\s*=\s*(\S+)\s*$/m.exec(keyring)?.[1];
    if (key === undefined) throw new LatchError(`the keyring of client.${this.options.identity.clientId} holds no key`);
    await writeFile(this.secretFile, `${key}\n`, { mode: 0o600 });
    await chmod(this.secretFile, 0o600);
  }

  async mount(root: string, target: string, options: { readOnly: boolean }): Promise<void> {
    await this.writeSecret();
    const { identity, fsName } = this.options;
    const opts = [`name=${identity.clientId}`, `secretfile=${this.secretFile}`, `mds_namespace=${fsName}`, `conf=${identity.cephConf}`];
    if (options.readOnly) opts.push('ro');
    await this.exec('mount', ['-t', 'ceph', `:${root}`, target, '-o', opts.join(',')], this.options.timeoutMs);
    if (!(await this.mountAt(target))) throw new LatchError(`mount -t ceph returned, but mountinfo shows no CephFS mount at ${target}`);
  }

  async mountAt(target: string, table?: MountInfo[]): Promise<SharedMount | undefined> {
    const mount = (table ?? (await this.table())).find((m) => m.mountPoint === target && m.fsType === 'ceph' && this.isOurs(m));
    if (!mount) return undefined;
    return { mount, root: rootOf(mount) };
  }

  private isOurs(mount: MountInfo): boolean {
    return mount.superOptions.includes(`name=${this.options.identity.clientId}`);
  }

  async unmount(target: string, options: { hung?: boolean } = {}): Promise<void> {
    if (!(await this.mountAt(target))) return;
    try {
      // A hung client would hold a plain umount for its whole deadline: -f from the start.
      await this.exec('umount', options.hung === true ? ['-f', target] : [target], this.options.timeoutMs);
    } catch {
      // A client the cluster refuses (fenced) or cannot reach: -f aborts its pending requests, then it goes lazily.
      await this.exec('umount', ['-f', target], this.options.timeoutMs).catch(() => this.exec('umount', ['--lazy', target], 10_000));
    }
  }

  async abort(target: string): Promise<void> {
    if (await this.mountAt(target)) await this.exec('umount', ['-f', target], this.options.timeoutMs).catch(() => undefined);
  }

  async mounts(): Promise<{ target: string; root: string }[]> {
    return (await this.table())
      .filter((m) => m.fsType === 'ceph' && this.isOurs(m))
      .flatMap((m) => {
        const root = rootOf(m);
        return root === undefined ? [] : [{ target: m.mountPoint, root }];
      });
  }
}

/** The path of the file system a kernel CephFS mount shows: its source after the monitors, `MONS:/PATH`. */
function rootOf(mount: MountInfo): string | undefined {
  const at = mount.source.indexOf(':/');
  if (at < 0) return undefined;
  const path = mount.source.slice(at + 1);
  // A bind of a subdirectory shows its own root; the client's mount shows "/".
  return mount.root === '/' ? path : undefined;
}
