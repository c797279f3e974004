// doctor: the tools latch runs, found where run() finds them, with the package that provides each.
import type { Config } from '../config.js';
import { FILESYSTEMS, FS_TYPES, type FsType } from '../filesystems.js';
import { findTool, toolSearchPath } from '../sys/run.js';
import type { AddFinding, Severity } from './findings.js';

export interface ToolSpec {
  tool: string;
  /** Debian/Ubuntu package, RHEL/Fedora package. */
  deb: string;
  rpm: string;
  why: string;
  severity: Severity;
  /** The filesystem that needs it, for tools only some filesystems need. */
  fsType?: FsType;
}

/** Tools every node needs, whatever its filesystems. */
const BASE_TOOLS: ToolSpec[] = [
  { tool: 'losetup', deb: 'mount', rpm: 'util-linux', why: 'sets up the loop devices', severity: 'error' },
  { tool: 'blkid', deb: 'util-linux', rpm: 'util-linux', why: 'finds existing filesystems (never format over one)', severity: 'error' },
  { tool: 'mount', deb: 'mount', rpm: 'util-linux', why: 'mounts volumes', severity: 'error' },
  { tool: 'umount', deb: 'mount', rpm: 'util-linux', why: 'unmounts volumes', severity: 'error' },
  {
    tool: 'setpriv',
    deb: 'util-linux',
    rpm: 'util-linux',
    why:
      'makes every child die with a killed driver call where the driver runs under plain node (the self-contained ' +
      "build's native helper does that itself); without it an orphaned losetup -d could hit another volume's device",
    severity: 'warning',
  },
  ...['getfattr', 'setfattr'].map((tool): ToolSpec => ({
    tool,
    deb: 'attr',
    rpm: 'attr',
    why:
      "reads and sets the extended attributes and ACLs of shared volumes' files in their backups and restores (without " +
      'it these fail rather than lose them)',
    severity: 'warning',
  })),
];

/** The tools a node with these filesystems needs: the base tools, then each filesystem's mkfs and grow tool. */
export function requiredTools(allowed: readonly FsType[], defaultFsType: FsType): ToolSpec[] {
  const tools = [...BASE_TOOLS];
  const growers = new Set<string>();
  for (const fsType of allowed) {
    const { mkfs, grow, packages } = FILESYSTEMS[fsType];
    const isDefault = fsType === defaultFsType;
    tools.push({
      tool: mkfs[0],
      ...packages,
      why: `formats new ${fsType} volumes (${isDefault ? 'the defaultFsType' : 'in allowedFsTypes'})`,
      severity: isDefault ? 'error' : 'warning',
      fsType,
    });
    if (!growers.has(grow.tool)) {
      growers.add(grow.tool);
      tools.push({ tool: grow.tool, ...packages, why: `grows ${fsType} filesystems (expandfs)`, severity: 'warning' });
    }
  }
  return tools;
}

export async function checkTools(config: Config | undefined, env: NodeJS.ProcessEnv, add: AddFinding): Promise<void> {
  const searchPath = toolSearchPath(env);
  const found: string[] = [];
  for (const spec of requiredTools(config?.allowedFsTypes ?? FS_TYPES, config?.defaultFsType ?? 'ext4')) {
    if (findTool(spec.tool, searchPath)) {
      found.push(spec.tool);
      continue;
    }
    const removable = spec.fsType !== undefined && spec.severity === 'warning';
    add({
      check: 'tools',
      severity: spec.severity,
      message: `${spec.tool} not found in ${searchPath.join(':')}: it ${spec.why}`,
      fix: `apt-get install -y ${spec.deb}`,
      note:
        `RHEL, Fedora: dnf install -y ${spec.rpm}` +
        (removable ? `; or remove "${spec.fsType}" from allowedFsTypes in ${config?.source ?? 'the configuration'}` : ''),
    });
  }
  add({ check: 'tools', severity: 'ok', message: `found ${found.join(', ') || 'none of the tools'}` });
}
