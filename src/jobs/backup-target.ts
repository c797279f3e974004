// The backup target from the configuration, or a message that says how to configure one.
import type { BackupTarget } from '../backup/layout.js';
import type { Config } from '../config.js';
import { LatchError } from '../errors.js';

export function backupTargetOf(config: Config): BackupTarget {
  if (!config.backupTarget) {
    throw new LatchError(
      `no backup target is configured: set "backupTarget": {"type": "dir", "path": "/mnt/backups"} in ${config.source === 'built-in defaults' ? 'the configuration file' : config.source} (a directory every node can reach, e.g. an NFS or CephFS mount), or an S3 bucket: {"type": "s3", "endpoint": ..., "bucket": ..., "credentialsFile": ...} (docs/operations.md, "Backups")`,
    );
  }
  return config.backupTarget;
}
