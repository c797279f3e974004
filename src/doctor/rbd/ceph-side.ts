// doctor, with the rbd backend: the Ceph side of this node (tools, conf and keyring, the cluster as this node's own
// identity, what that identity may do, the lock-breaking setting, the node client), one file per check; its rbd
// mappings against the ledger are mappings.ts. Measured facts behind each check: docs/design/rbd-backend.md.
//
// Two rules hold throughout. A key is never printed: keyrings are checked for their mode and their section names
// only, and the output of `ceph auth get` is parsed for caps and dropped. Nothing below a FUSE mount is ever stat-ed
// or opened (mappings.ts), and every Ceph call has a deadline (ceph-call.ts).
import type { AddFinding } from '../findings.js';
import { checkBreakLockSetting } from './break-lock.js';
import { checkCephTools } from './ceph-tools.js';
import { checkCluster } from './cluster.js';
import { checkCephFiles } from './conf-and-keyring.js';
import type { RbdConfig } from './identity.js';
import { checkNodeClient } from './node-client.js';

/** Everything about this node's Ceph side that needs no ledger. */
export async function checkRbd(config: RbdConfig, env: NodeJS.ProcessEnv, add: AddFinding): Promise<void> {
  const rbd = config.backend;
  const tools = await checkCephTools(rbd, env, add);
  const filesOk = await checkCephFiles(rbd, add);
  await checkNodeClient(config, add);
  if (!tools.has('rbd')) {
    add({ check: 'ceph', severity: 'warning', message: 'the cluster was not checked: the rbd tool is missing (see above)' });
    return;
  }
  await checkBreakLockSetting(rbd, add);
  if (!filesOk) {
    add({ check: 'ceph', severity: 'warning', message: 'the cluster was not checked: fix the conf or keyring first (see above)' });
    return;
  }
  await checkCluster(rbd, tools, add);
}
