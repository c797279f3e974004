// A PV's secretRef with the rbd backend: the cephx identity and key that the PV's secret names, instead of the node's
// own. kubelet passes secrets to `mount` only (non-attach mode; docs/protocol.md), as `kubernetes.io/secret/<key>`
// options, which parseOptions decodes. The key goes into a keyring file (0600, in the node-private mountDir) that the
// Ceph tools read: never into argv, a message or the log.
import { mkdir, readFile } from 'node:fs/promises';
import { writeFileAtomic } from '../atomic-file.js';
import { configuredBackend } from '../backend/index.js';
import { keyringDir, keyringFile } from '../backend/rbd-layout.js';
import type { Context } from '../context.js';
import { LatchError } from '../errors.js';

const CEPHX_ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;
// A cephx key is base64 (AQ... and 40 characters for Ceph's own keys); nothing else may reach the keyring file.
const CEPHX_KEY = /^[A-Za-z0-9+/]{16,}={0,2}$/;

/** The call's context, with a backend that uses the secret's identity when the PV names one (rbd only). */
export async function contextForSecrets(ctx: Context, secrets: Record<string, string>): Promise<Context> {
  const rbd = ctx.config.backend;
  const key = secrets.key ?? secrets.userKey;
  if (rbd.type !== 'rbd' || key === undefined) return ctx;
  const clientId = secrets.userId ?? secrets.userID ?? rbd.clientId;
  if (!CEPHX_ID.test(clientId) || clientId.startsWith('client.')) {
    throw new LatchError('the secret\'s "userId" is not a cephx id (letters, digits, ".", "_", "-"; without "client.")');
  }
  if (!CEPHX_KEY.test(key)) throw new LatchError('the secret\'s "key" is not a cephx key (base64)');

  const keyring = keyringFile(rbd.mountDir, clientId);
  const content = `[client.${clientId}]\n\tkey = ${key}\n`;
  if ((await readFile(keyring, 'utf8').catch(() => undefined)) !== content) {
    await mkdir(keyringDir(rbd.mountDir), { recursive: true, mode: 0o700 });
    await writeFileAtomic(keyring, content);
  }
  ctx.log.cephxId = clientId;
  return { ...ctx, backend: configuredBackend({ ...ctx.config, backend: { ...rbd, clientId, keyring } }) };
}
