// doctor, with the rbd backend: the Ceph tools this node needs, and the packages that bring them.
import type { RbdBackendConfig } from '../../config.js';
import { findTool, toolSearchPath } from '../../sys/run.js';
import type { AddFinding, Severity } from '../findings.js';

const CEPH_TOOLS = [
  { tool: 'rbd', deb: 'ceph-common', why: 'creates, resizes, removes and (krbd) maps the images', severity: 'error' as Severity },
  {
    tool: 'rbd-fuse',
    deb: 'rbd-fuse',
    why: "is this node's client for the images (rbd-fuse + a loop device)",
    severity: 'error' as Severity,
    client: 'rbd-fuse',
  },
  { tool: 'ceph', deb: 'ceph-common', why: "checks the cluster (doctor) and runs the fencer's commands", severity: 'warning' as Severity },
  {
    tool: 'rados',
    deb: 'ceph-common',
    why: "lets doctor check that this node's identity may write to the pool",
    severity: 'warning' as Severity,
  },
];

export async function checkCephTools(rbd: RbdBackendConfig, env: NodeJS.ProcessEnv, add: AddFinding): Promise<Set<string>> {
  const searchPath = toolSearchPath(env);
  const found = new Set<string>();
  for (const spec of CEPH_TOOLS) {
    if (spec.client !== undefined && spec.client !== rbd.client) continue;
    if (findTool(spec.tool, searchPath)) {
      found.add(spec.tool);
      continue;
    }
    add({
      check: 'tools',
      severity: spec.severity,
      message: `${spec.tool} not found in ${searchPath.join(':')}: it ${spec.why}`,
      fix: `apt-get install -y ${spec.deb}`,
      note: `RHEL, Fedora: dnf install -y ${spec.deb}; the packages should match the cluster's Ceph release or be close to it`,
    });
  }
  if (found.size > 0) add({ check: 'tools', severity: 'ok', message: `found the Ceph tools ${[...found].join(', ')}` });
  return found;
}
