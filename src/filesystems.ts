// The one table of filesystems latch makes and grows. Everything else derives from it: the fsTypes the config and
// the options accept, how blockdev formats and grows, which capability a grow needs, doctor's tool list, and the
// packages scripts/setup.sh and install/Dockerfile install (a unit test checks those two against this table).

export interface FilesystemSpec {
  /** mkfs command and its arguments before the device. Lazy ext init: a large volume formats in seconds. */
  mkfs: readonly [string, ...string[]];
  /** The tool that grows it online, and whether it takes the device or the mount point. */
  grow: { tool: string; args: readonly string[]; target: 'device' | 'mountPoint' };
  /** A capability the kernel demands of the process that grows it online (resize2fs: CAP_SYS_RESOURCE). */
  growNeeds?: { capability: 'CAP_SYS_RESOURCE'; bit: number };
  /** Packages providing both tools. */
  packages: { deb: string; rpm: string };
}

const EXT_MKFS_OPTIONS = ['-F', '-q', '-E', 'lazy_itable_init=1,lazy_journal_init=1'] as const;
const EXT_GROW = { tool: 'resize2fs', args: [], target: 'device' } as const;
const CAP_SYS_RESOURCE = { capability: 'CAP_SYS_RESOURCE', bit: 24 } as const;
const E2FSPROGS = { deb: 'e2fsprogs', rpm: 'e2fsprogs' } as const;

export const FILESYSTEMS = {
  ext4: { mkfs: ['mkfs.ext4', ...EXT_MKFS_OPTIONS], grow: EXT_GROW, growNeeds: CAP_SYS_RESOURCE, packages: E2FSPROGS },
  ext3: { mkfs: ['mkfs.ext3', ...EXT_MKFS_OPTIONS], grow: EXT_GROW, growNeeds: CAP_SYS_RESOURCE, packages: E2FSPROGS },
  xfs: {
    mkfs: ['mkfs.xfs', '-q'],
    grow: { tool: 'xfs_growfs', args: [], target: 'mountPoint' },
    packages: { deb: 'xfsprogs', rpm: 'xfsprogs' },
  },
  btrfs: {
    mkfs: ['mkfs.btrfs', '-q'],
    grow: { tool: 'btrfs', args: ['filesystem', 'resize', 'max'], target: 'mountPoint' },
    packages: { deb: 'btrfs-progs', rpm: 'btrfs-progs' },
  },
} as const satisfies Record<string, FilesystemSpec>;

export type FsType = keyof typeof FILESYSTEMS;
export const FS_TYPES = Object.keys(FILESYSTEMS) as FsType[];

/**
 * Filesystems latch never makes but still grows when it finds them on a volume (made by hand before latch managed
 * it): ext2 grows like ext3 and ext4.
 */
const GROWN_ONLY: Record<string, Pick<FilesystemSpec, 'grow' | 'growNeeds'>> = {
  ext2: { grow: EXT_GROW, growNeeds: CAP_SYS_RESOURCE },
};

export function isFsType(name: string): name is FsType {
  return Object.hasOwn(FILESYSTEMS, name);
}

/** How to grow a filesystem found on a device, or undefined when latch cannot grow it. */
export function growSpecOf(fsType: string): Pick<FilesystemSpec, 'grow' | 'growNeeds'> | undefined {
  return isFsType(fsType) ? FILESYSTEMS[fsType] : GROWN_ONLY[fsType];
}
