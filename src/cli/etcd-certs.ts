// latch install --make-etcd-certs (hidden): what the cluster install's Job runs, once, to give latch's own etcd its
// TLS material: the Secrets of host/etcd-secrets.ts, each made only if missing. It needs the pod's ServiceAccount
// (allowed to get and create Secrets in latch's namespace) and the client Service's cluster IP, which Kubernetes puts
// in the pod's environment: nodes reach etcd at that address, so the members' certificate must name it.
import { readFile } from 'node:fs/promises';
import { LatchError } from '../errors.js';
import { ETCD, LATCH_NAMESPACE, ensureEtcdSecrets, inClusterSecretApi, serviceHostVariable } from '../host/etcd-secrets.js';
import type { CommandIO } from './io.js';

export async function makeEtcdCerts(io: CommandIO): Promise<void> {
  const variable = serviceHostVariable(ETCD.clientService);
  const clusterIp = io.env[variable];
  if (!clusterIp) {
    throw new LatchError(
      `$${variable} is not set: the Service ${ETCD.clientService} did not exist when this pod started; the Job's next pod will have it`,
    );
  }
  // etcd checks a peer's certificate against the peer's address by a reverse lookup, which answers the member's name
  // under the cluster's DNS domain: the certificate names it under cluster.local, and under this cluster's own domain.
  const domain = clusterDomain(await readFile('/etc/resolv.conf', 'utf8').catch(() => ''));
  const names = [clusterIp, ...(domain && domain !== 'cluster.local' ? [`*.${ETCD.name}.${LATCH_NAMESPACE}.svc.${domain}`] : [])];
  // $LATCH_SERVICE_ACCOUNT_DIR: where a test puts a token and a CA (a pod has them in the standard place).
  const results = await ensureEtcdSecrets(await inClusterSecretApi(io.env, io.env.LATCH_SERVICE_ACCOUNT_DIR), names);
  io.out(`${results.map((r) => `${r.action} Secret ${r.secret}`).join('\n')}\n`);
}

/** The cluster's DNS domain from a pod's resolv.conf: its search list holds `svc.<domain>`. */
export function clusterDomain(resolvConf: string): string | undefined {
  const search = /^search\s+(.*)$/m.exec(resolvConf)?.[1]?.split(/\s+/) ?? [];
  const svc = search.find((d) => /^svc\.[a-z0-9]([a-z0-9.-]*[a-z0-9])?$/.test(d));
  return svc?.slice('svc.'.length);
}
