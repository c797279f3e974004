// The TLS material of latch's own etcd (the one `latch install --print-manifests` runs as a StatefulSet): a CA, one
// certificate its members serve and peer with, and one client certificate for the nodes and the control plane. Made
// once, by the Job the manifests start (`latch install --make-etcd-certs`, cli/etcd-certs.ts), and kept in Secrets.
//
// The CA signs for latch's etcd only, and that etcd holds nothing but latch's ledger: a client certificate of this CA
// opens latch's ledger and nothing else of the cluster (never the Kubernetes API's etcd, whose keys open every Secret).
// Keys are RSA 2048, made by node:crypto; node-forge (pure JavaScript, loaded only here) writes the certificates.
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { isIP } from 'node:net';
import type * as Forge from 'node-forge';

/** A certificate and its key, PEM. */
export interface CertAndKey {
  cert: string;
  key: string;
}

/** Ten years: a member whose certificate expires stops serving, so these outlive any cluster we expect. */
const VALIDITY_DAYS = 3650;

let forgeModule: typeof Forge | undefined;
async function forge(): Promise<typeof Forge> {
  forgeModule ??= ((await import('node-forge')) as unknown as { default: typeof Forge }).default;
  return forgeModule;
}

function rsaKeyPem(): string {
  return generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
}

/** A new certificate's frame: key, serial (positive, random), validity, subject. */
async function frame(commonName: string): Promise<{ cert: Forge.pki.Certificate; key: string; f: typeof Forge }> {
  const f = await forge();
  const key = rsaKeyPem();
  const privateKey = f.pki.privateKeyFromPem(key);
  const cert = f.pki.createCertificate();
  cert.publicKey = f.pki.setRsaPublicKey(privateKey.n, privateKey.e);
  const serial = randomBytes(16);
  serial[0] = (serial[0] ?? 0) & 0x7f; // a positive INTEGER
  cert.serialNumber = serial.toString('hex');
  const now = Date.now();
  cert.validity.notBefore = new Date(now - 60 * 60 * 1000); // an hour of clock skew between nodes
  cert.validity.notAfter = new Date(now + VALIDITY_DAYS * 24 * 60 * 60 * 1000);
  cert.setSubject([{ name: 'commonName', value: commonName }]);
  return { cert, key, f };
}

/** The CA that signs the members' and the clients' certificates. */
export async function makeEtcdCa(): Promise<CertAndKey> {
  const { cert, key, f } = await frame('latch-etcd-ca');
  cert.setIssuer(cert.subject.attributes);
  cert.setExtensions([
    { name: 'basicConstraints', cA: true, pathLenConstraint: 0, critical: true },
    { name: 'keyUsage', keyCertSign: true, cRLSign: true, digitalSignature: true, critical: true },
    { name: 'subjectKeyIdentifier' },
  ]);
  cert.sign(f.pki.privateKeyFromPem(key), f.md.sha256.create());
  return { cert: f.pki.certificateToPem(cert), key };
}

export interface LeafRequest {
  commonName: string;
  /** DNS names and IP addresses it is valid for (a server's); wildcards allowed in DNS names. */
  names?: readonly string[];
  /** serverAuth: an etcd member serves clients and peers with it (and dials peers with it: clientAuth too). */
  server: boolean;
}

/** A certificate signed by `ca`: a member's (server, also a client of its peers) or a client's. */
export async function issueEtcdCert(ca: CertAndKey, request: LeafRequest): Promise<CertAndKey> {
  const { cert, key, f } = await frame(request.commonName);
  const caCert = f.pki.certificateFromPem(ca.cert);
  cert.setIssuer(caCert.subject.attributes);
  const altNames = (request.names ?? []).map((name) => (isIP(name) ? { type: 7, ip: name } : { type: 2, value: name }));
  cert.setExtensions([
    { name: 'basicConstraints', cA: false, critical: true },
    { name: 'keyUsage', digitalSignature: true, keyEncipherment: true, critical: true },
    { name: 'extKeyUsage', serverAuth: request.server, clientAuth: true },
    ...(altNames.length > 0 ? [{ name: 'subjectAltName', altNames }] : []),
    { name: 'authorityKeyIdentifier', keyIdentifier: caCert.generateSubjectKeyIdentifier().getBytes() },
  ]);
  cert.sign(f.pki.privateKeyFromPem(ca.key), f.md.sha256.create());
  return { cert: f.pki.certificateToPem(cert), key };
}
