// Where latch's own etcd keeps its TLS material: three Secrets in latch's namespace, made once by the Job of the
// cluster install (`latch install --make-etcd-certs`) and kept. Each is created only if missing, and never replaced,
// so running the Job again (a retry, a second `kubectl apply`) changes nothing:
//
//   latch-etcd-ca      ca.crt, ca.key            the CA; its key stays here, so a missing certificate can be made later
//   latch-etcd-member  ca.crt, tls.crt, tls.key  what every member serves clients and peers with (and dials peers with)
//   latch-etcd-client  ca.crt, tls.crt, tls.key  what every node and the control plane use to reach the ledger
//
// The CA is made first: a Job killed half-way leaves it, and the next run signs what is missing with it.
import { request } from 'node:https';
import { readFile } from 'node:fs/promises';
import { LatchError, errorMessage } from '../errors.js';
import { issueEtcdCert, makeEtcdCa, type CertAndKey } from './etcd-certs.js';

/** The names the manifests (host/manifests.ts) and the certificates share. */
export const LATCH_NAMESPACE = 'latch-system';
export const ETCD = {
  /** The StatefulSet, and its headless Service (the members' stable names: latch-etcd-0.latch-etcd.latch-system.svc). */
  name: 'latch-etcd',
  /** The Service with a cluster IP that nodes reach from the host's network (no cluster DNS there). */
  clientService: 'latch-etcd-client',
  members: 3,
  clientPort: 2379,
  peerPort: 2380,
  metricsPort: 2381,
  secrets: { ca: 'latch-etcd-ca', member: 'latch-etcd-member', client: 'latch-etcd-client' },
} as const;

/** The variable in which Kubernetes tells a pod a Service's cluster IP (for Services that existed when it started). */
export function serviceHostVariable(service: string): string {
  return `${service.toUpperCase().replace(/-/g, '_')}_SERVICE_HOST`;
}

/** The DNS names a member's certificate is valid for (any member's, and the client Service's). */
function memberNames(namespace = LATCH_NAMESPACE): string[] {
  return [
    `*.${ETCD.name}.${namespace}.svc`,
    `*.${ETCD.name}.${namespace}.svc.cluster.local`,
    `${ETCD.clientService}.${namespace}.svc`,
    `${ETCD.clientService}.${namespace}.svc.cluster.local`,
    'localhost',
    '127.0.0.1',
  ];
}

/** The Secrets API of one namespace, as much as the Job needs. */
export interface SecretApi {
  /** The Secret's data (decoded), or undefined when there is none of that name. */
  get(name: string): Promise<Record<string, string> | undefined>;
  /** Creates it; false when one of that name exists already (made meanwhile by another run). */
  create(name: string, type: string, data: Record<string, string>): Promise<boolean>;
}

export interface EnsureResult {
  secret: string;
  action: 'created' | 'kept';
}

/**
 * Makes the Secrets that are missing; a Secret that exists is kept as it is. `extraNames`: more names and addresses
 * the member certificate is valid for (the client Service's cluster IP; a test's loopback address).
 */
export async function ensureEtcdSecrets(api: SecretApi, extraNames: readonly string[] = []): Promise<EnsureResult[]> {
  const results: EnsureResult[] = [];
  let caData = await api.get(ETCD.secrets.ca);
  if (caData === undefined) {
    const ca = await makeEtcdCa();
    const created = await api.create(ETCD.secrets.ca, 'Opaque', { 'ca.crt': ca.cert, 'ca.key': ca.key });
    results.push({ secret: ETCD.secrets.ca, action: created ? 'created' : 'kept' });
    caData = created ? { 'ca.crt': ca.cert, 'ca.key': ca.key } : await api.get(ETCD.secrets.ca);
  } else {
    results.push({ secret: ETCD.secrets.ca, action: 'kept' });
  }
  const caCert = caData?.['ca.crt'];
  const caKey = caData?.['ca.key'];
  if (caCert === undefined || caKey === undefined) {
    throw new LatchError(
      `the Secret ${ETCD.secrets.ca} lacks ca.crt or ca.key; delete it and the other latch-etcd-* Secrets to start anew`,
    );
  }
  const ca: CertAndKey = { cert: caCert, key: caKey };
  const leaves = [
    { secret: ETCD.secrets.member, request: { commonName: ETCD.name, names: [...memberNames(), ...extraNames], server: true } },
    { secret: ETCD.secrets.client, request: { commonName: 'latch', server: false } },
  ];
  for (const leaf of leaves) {
    if ((await api.get(leaf.secret)) !== undefined) {
      results.push({ secret: leaf.secret, action: 'kept' });
      continue;
    }
    const issued = await issueEtcdCert(ca, leaf.request);
    const created = await api.create(leaf.secret, 'kubernetes.io/tls', {
      'ca.crt': ca.cert,
      'tls.crt': issued.cert,
      'tls.key': issued.key,
    });
    results.push({ secret: leaf.secret, action: created ? 'created' : 'kept' });
  }
  return results;
}

/** Where a pod finds its ServiceAccount's token and the API server's CA. */
const SERVICE_ACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';
const API_TIMEOUT_MS = 30_000;

/**
 * The Secrets API of latch's namespace through the API server, as the pod's ServiceAccount (in a pod only; a test
 * gives its own `serviceAccountDir`).
 */
export async function inClusterSecretApi(env: NodeJS.ProcessEnv, serviceAccountDir = SERVICE_ACCOUNT_DIR): Promise<SecretApi> {
  const namespace = LATCH_NAMESPACE;
  const host = env.KUBERNETES_SERVICE_HOST;
  const port = env.KUBERNETES_SERVICE_PORT ?? '443';
  if (!host) throw new LatchError('--make-etcd-certs runs in a pod of the cluster install (no KUBERNETES_SERVICE_HOST here)');
  let token: string;
  let ca: Buffer;
  try {
    token = (await readFile(`${serviceAccountDir}/token`, 'utf8')).trim();
    ca = await readFile(`${serviceAccountDir}/ca.crt`);
  } catch (err) {
    throw new LatchError(`--make-etcd-certs: the pod's ServiceAccount token cannot be read: ${errorMessage(err)}`);
  }
  const call = (method: 'GET' | 'POST', path: string, body?: unknown) =>
    new Promise<{ status: number; body: string }>((resolve, reject) => {
      const payload = body === undefined ? undefined : JSON.stringify(body);
      const req = request(
        {
          host: host.includes(':') ? `[${host}]` : host,
          port,
          method,
          path,
          ca,
          timeout: API_TIMEOUT_MS,
          headers: { authorization: `Bearer ${token}`, accept: 'application/json', ...(payload && { 'content-type': 'application/json' }) },
        },
        (res) => {
          let text = '';
          res.setEncoding('utf8').on('data', (d: string) => (text += d));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
          res.on('error', reject);
        },
      );
      req.on('timeout', () => req.destroy(new Error(`the API server did not answer within ${API_TIMEOUT_MS} ms`)));
      req.on('error', reject);
      req.end(payload);
    });
  const base = `/api/v1/namespaces/${namespace}/secrets`;
  const failed = (what: string, answer: { status: number; body: string }) =>
    new LatchError(`${what}: the API server answered ${answer.status}: ${answer.body.slice(0, 300)}`);
  return {
    async get(name) {
      const answer = await call('GET', `${base}/${name}`);
      if (answer.status === 404) return undefined;
      if (answer.status !== 200) throw failed(`reading the Secret ${name}`, answer);
      const data = (JSON.parse(answer.body) as { data?: Record<string, string> }).data ?? {};
      return Object.fromEntries(Object.entries(data).map(([k, v]) => [k, Buffer.from(v, 'base64').toString('utf8')]));
    },
    async create(name, type, data) {
      const secret = {
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name, namespace, labels: { 'app.kubernetes.io/name': 'latch' } },
        type,
        data: Object.fromEntries(Object.entries(data).map(([k, v]) => [k, Buffer.from(v, 'utf8').toString('base64')])),
      };
      const answer = await call('POST', base, secret);
      if (answer.status === 409) return false;
      if (answer.status !== 201 && answer.status !== 200) throw failed(`creating the Secret ${name}`, answer);
      return true;
    },
  };
}
