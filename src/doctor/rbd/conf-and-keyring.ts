// doctor, with the rbd backend: the Ceph conf and the keyring of the node's identity. A key is never printed: the
// keyring is checked for its mode and its section names only.
import { constants } from 'node:fs';
import { access, readFile, stat } from 'node:fs/promises';
import type { RbdBackendConfig } from '../../config.js';
import { errorMessage } from '../../errors.js';
import { sh, type AddFinding } from '../findings.js';
import { nodeCapsWords } from './identity.js';

/** The conf and keyring are there, readable, and the keyring is root's alone with a section for this identity. */
export async function checkCephFiles(rbd: RbdBackendConfig, add: AddFinding): Promise<boolean> {
  const name = `client.${rbd.clientId}`;
  let ok = true;

  const conf = await readPrivateFile(rbd.cephConf);
  if (typeof conf === 'string') {
    ok = false;
    add({
      check: 'ceph',
      severity: 'error',
      message: `the Ceph conf ${rbd.cephConf} cannot be read: ${conf}`,
      note: `on an admin host, "ceph config generate-minimal-conf" prints one (fsid and mon_host); copy it to ${rbd.cephConf}, or set backend.cephConf`,
    });
  } else if (/^\s*key\s*=/m.test(conf.text) && (conf.mode & 0o077) !== 0) {
    add({
      check: 'ceph',
      severity: 'warning',
      message: `the Ceph conf ${rbd.cephConf} holds a key and is readable by others (mode ${octal(conf.mode)})`,
      fix: `chmod 600 ${sh(rbd.cephConf)}`,
      note: `better: keep keys in the keyring file (${rbd.keyring}) only`,
    });
  } else {
    add({ check: 'ceph', severity: 'ok', message: `Ceph conf ${rbd.cephConf} is readable` });
  }

  const keyring = await readPrivateFile(rbd.keyring);
  if (typeof keyring === 'string') {
    add({
      check: 'ceph',
      severity: 'error',
      message: `the keyring of ${name}, ${rbd.keyring}, cannot be read: ${keyring}`,
      fix: `umask 077; ceph auth get-or-create client.${rbd.clientId} ${nodeCapsWords(rbd.pool)} -o ${sh(rbd.keyring)}`,
      note: `on an admin host (the caps are this node's: docs/operations.md, "The rbd backend"); then copy the file to this node, mode 0600`,
    });
    return false;
  }
  const sections = [...keyring.text.matchAll(/^\s*\[([^\]]+)\]/gm)].map((m) => m[1]?.trim());
  if (!sections.includes(name) || !/^\s*key\s*=\s*\S/m.test(keyring.text)) {
    ok = false;
    add({
      check: 'ceph',
      severity: 'error',
      message:
        `the keyring ${rbd.keyring} has no key for ${name}` +
        (sections.length > 0 ? ` (it has section(s) ${sections.join(', ')})` : ' (no [client.…] section in it)'),
      note: `on an admin host: ceph auth get ${name} -o FILE, and copy FILE to ${rbd.keyring} (mode 0600); or set backend.clientId to the identity the keyring is for`,
    });
  }
  if ((keyring.mode & 0o077) !== 0 || keyring.uid !== 0) {
    add({
      check: 'ceph',
      severity: 'warning',
      message:
        `the keyring ${rbd.keyring} is not private to root (mode ${octal(keyring.mode)}, owner uid ${keyring.uid}): ` +
        `whoever can read it can act as ${name} on the cluster`,
      fix: `chown root:root ${sh(rbd.keyring)} && chmod 600 ${sh(rbd.keyring)}`,
    });
  } else if (ok) {
    add({ check: 'ceph', severity: 'ok', message: `keyring ${rbd.keyring} has the key of ${name} and is private to root (mode 0600)` });
  }
  return ok;
}

function octal(mode: number): string {
  return (mode & 0o7777).toString(8).padStart(4, '0');
}

/** The file's text, mode and owner, or why it cannot be read. Its text never leaves this module. */
async function readPrivateFile(path: string): Promise<{ text: string; mode: number; uid: number } | string> {
  try {
    const info = await stat(path);
    if (!info.isFile()) return 'it is not a regular file';
    await access(path, constants.R_OK);
    return { text: await readFile(path, 'utf8'), mode: info.mode, uid: info.uid };
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    return code === 'ENOENT' ? 'it does not exist' : code === 'EACCES' ? 'permission denied' : errorMessage(err);
  }
}
