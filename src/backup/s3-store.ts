// An S3 target's store: the keys of layout.ts below `prefix` in `bucket`, through the AWS SDK's S3 client (loaded
// only here, on first use by a backup, a restore or a listing of an S3 target: never by a driver call). Path-style
// requests (Ceph's RADOS Gateway, MinIO and AWS all take them), Signature V4.
//
// Why it is safe on an object store: a PUT stores an object whole or not at all, so a chunk or manifest is never seen
// half-written, and there are no temp files to clean up; a backup killed mid-upload leaves chunks that no manifest
// names (reused by the next backup, removed by gc) and no manifest. The lock needs conditional writes (s3-lock.ts).
//
// Secrets: the credentials are read from root-only files at each client creation and given to the SDK in memory.
// They are never in a message: every S3 failure is reworded here from the error's name and HTTP status alone.
import { Agent as HttpAgent } from 'node:http';
import { Agent as HttpsAgent } from 'node:https';
import { readFile } from 'node:fs/promises';
import { rootCertificates } from 'node:tls';
import { join } from 'node:path';
import type * as SdkModule from '@aws-sdk/client-s3';
import type { S3Client } from '@aws-sdk/client-s3';
import { LatchError } from '../errors.js';
import { readPrivateFile } from './keys.js';
import { describeTarget, type S3Target } from './layout.js';
import type { GetResult, StoredObject, TargetStore } from './target-store.js';

type Sdk = typeof SdkModule;

interface Credentials {
  accessKeyId: string;
  secretAccessKey: string;
}

// What S3 access keys look like (AWS: 16-128 characters; RGW makes 20 and 40): printable, no spaces.
const KEY_PATTERN = /^[\x21-\x7e]{1,256}$/;

/** The target's credentials, from its credentialsFile or its credentialsDir (a Kubernetes secret volume). */
async function readCredentials(target: S3Target): Promise<Credentials> {
  if (target.credentialsFile !== undefined) {
    const path = target.credentialsFile;
    const refuse = (why: string) => new LatchError(`the S3 credentials file ${path} (backupTarget.credentialsFile) ${why}`);
    const raw = await readPrivateFile(path, refuse);
    let parsed: unknown;
    try {
      parsed = JSON.parse(raw.toString('utf8'));
    } catch {
      throw refuse('is not JSON ({"accessKeyId": "...", "secretAccessKey": "..."})');
    } finally {
      raw.fill(0);
    }
    const { accessKeyId, secretAccessKey } = (parsed ?? {}) as Record<string, unknown>;
    if (typeof accessKeyId !== 'string' || !KEY_PATTERN.test(accessKeyId)) throw refuse('has no valid "accessKeyId"');
    if (typeof secretAccessKey !== 'string' || !KEY_PATTERN.test(secretAccessKey)) throw refuse('has no valid "secretAccessKey"');
    return { accessKeyId, secretAccessKey };
  }
  const dir = target.credentialsDir;
  if (dir === undefined) throw new LatchError('the S3 backup target names no credentials (backupTarget.credentialsFile or credentialsDir)');
  const one = async (name: keyof Credentials) => {
    const path = join(dir, name);
    const refuse = (why: string) =>
      new LatchError(
        `the S3 credentials file ${path} (backupTarget.credentialsDir) ${why}${why.includes('chmod') ? ' (a Kubernetes secret volume: defaultMode 0400)' : ''}`,
      );
    const raw = await readPrivateFile(path, refuse, dir);
    const value = raw.toString('utf8').trim();
    raw.fill(0);
    if (!KEY_PATTERN.test(value)) throw refuse(`does not hold a valid ${name}`);
    return value;
  };
  return { accessKeyId: await one('accessKeyId'), secretAccessKey: await one('secretAccessKey') };
}

/** The S3 error's name and HTTP status, the only parts of it that latch repeats (its message may quote a request). */
function errorOf(err: unknown): { name: string; status: number | undefined; code: string | undefined } {
  const e = err as { name?: string; code?: string; $metadata?: { httpStatusCode?: number } };
  return { name: e.name ?? 'Error', status: e.$metadata?.httpStatusCode, code: e.code };
}

const UNREACHABLE = ['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'EHOSTUNREACH', 'ENETUNREACH', 'ENOTFOUND', 'EAI_AGAIN'];

export class S3Store implements TargetStore {
  /** Learnt from the store: it takes If-Match only without the ETag's quotes (RGW 16.2; replaceIf). */
  private unquotedIfMatch = false;

  constructor(
    private readonly target: S3Target,
    private readonly sdk: Sdk,
    private readonly client: S3Client,
  ) {}

  private key(key: string): string {
    return `${this.target.prefix}${key}`;
  }

  /** An S3 failure as a LatchError that says what to do, naming the target but nothing secret. */
  fault(err: unknown, doing: string): Error {
    if (err instanceof LatchError) return err;
    const { name, status, code } = errorOf(err);
    const where = describeTarget(this.target);
    if (name === 'NoSuchBucket' || (doing === 'checking the bucket' && status === 404)) {
      return new LatchError(
        `the bucket ${this.target.bucket} does not exist at ${this.target.endpoint} (backupTarget.bucket): create it first; latch never creates it`,
      );
    }
    if (['InvalidAccessKeyId', 'SignatureDoesNotMatch', 'AccessDenied', 'Forbidden'].includes(name) || status === 403) {
      return new LatchError(
        `the S3 target ${where} refused the credentials while ${doing} (${name}${status ? `, HTTP ${status}` : ''}): check the ` +
          "access key in backupTarget's credentials and that the user may read and write the bucket",
      );
    }
    if (UNREACHABLE.includes(code ?? name) || name === 'TimeoutError' || name === 'RequestTimeout') {
      return new LatchError(
        `the S3 target ${where} did not answer while ${doing} (${code ?? name}); nothing that was under way was published`,
      );
    }
    return new LatchError(`the S3 target ${where} failed while ${doing}: ${name}${status ? ` (HTTP ${status})` : ''}`);
  }

  async check(): Promise<void> {
    try {
      await this.client.send(new this.sdk.HeadBucketCommand({ Bucket: this.target.bucket }));
    } catch (err) {
      // A HEAD's error has no body, so no name ("Unknown"): a listing of one key says which refusal it is.
      if (errorOf(err).status !== 403 && errorOf(err).status !== 404) throw this.fault(err, 'checking the bucket');
      try {
        await this.client.send(new this.sdk.ListObjectsV2Command({ Bucket: this.target.bucket, Prefix: this.key(''), MaxKeys: 1 }));
      } catch (named) {
        throw this.fault(named, 'checking the bucket');
      }
      throw this.fault(err, 'checking the bucket');
    }
  }

  async put(key: string, data: Buffer | string): Promise<void> {
    const body = typeof data === 'string' ? Buffer.from(data) : data;
    try {
      await this.client.send(
        new this.sdk.PutObjectCommand({ Bucket: this.target.bucket, Key: this.key(key), Body: body, ContentLength: body.length }),
      );
    } catch (err) {
      throw this.fault(err, `writing ${key}`);
    }
  }

  async get(key: string, maxBytes: number): Promise<GetResult> {
    try {
      const got = await this.client.send(new this.sdk.GetObjectCommand({ Bucket: this.target.bucket, Key: this.key(key) }));
      const body = got.Body as (AsyncIterable<Uint8Array> & { destroy?: () => void }) | undefined;
      if (got.ContentLength !== undefined && got.ContentLength > maxBytes) {
        body?.destroy?.();
        return { found: true, tooLarge: got.ContentLength };
      }
      const parts: Buffer[] = [];
      let length = 0;
      for await (const part of body ?? []) {
        length += part.length;
        if (length > maxBytes) {
          body?.destroy?.();
          return { found: true, tooLarge: length };
        }
        parts.push(Buffer.from(part.buffer, part.byteOffset, part.length));
      }
      return { found: true, data: Buffer.concat(parts, length) };
    } catch (err) {
      if (errorOf(err).name === 'NoSuchKey') return { found: false };
      throw this.fault(err, `reading ${key}`);
    }
  }

  async exists(key: string): Promise<boolean> {
    try {
      await this.client.send(new this.sdk.HeadObjectCommand({ Bucket: this.target.bucket, Key: this.key(key) }));
      return true;
    } catch (err) {
      const { name, status } = errorOf(err);
      if (name === 'NotFound' || name === 'NoSuchKey' || status === 404) return false;
      throw this.fault(err, `looking for ${key}`);
    }
  }

  async list(prefix: string): Promise<StoredObject[]> {
    const found: StoredObject[] = [];
    let token: string | undefined;
    const base = this.key('');
    try {
      do {
        const page = await this.client.send(
          new this.sdk.ListObjectsV2Command({ Bucket: this.target.bucket, Prefix: this.key(prefix), ContinuationToken: token }),
        );
        for (const object of page.Contents ?? []) {
          if (object.Key?.startsWith(base)) found.push({ key: object.Key.slice(base.length), size: object.Size ?? 0 });
        }
        token = page.IsTruncated ? page.NextContinuationToken : undefined;
      } while (token !== undefined);
    } catch (err) {
      throw this.fault(err, `listing ${prefix}`);
    }
    return found;
  }

  async delete(key: string): Promise<number | undefined> {
    try {
      await this.client.send(new this.sdk.DeleteObjectCommand({ Bucket: this.target.bucket, Key: this.key(key) }));
      return undefined;
    } catch (err) {
      throw this.fault(err, `deleting ${key}`);
    }
  }

  async flush(): Promise<void> {
    // A PUT is durable when it is answered.
  }

  async tidy(): Promise<number> {
    // No temp objects: a PUT that did not finish stored nothing.
    return 0;
  }

  // The lock's primitives (s3-lock.ts): a write that only creates, and one that only replaces a given version.

  /** The lock object's text, ETag and Last-Modified (the store's clock), or undefined when there is none. */
  async readLock(key: string): Promise<{ text: string; etag: string; modified: Date } | undefined> {
    try {
      const got = await this.client.send(new this.sdk.GetObjectCommand({ Bucket: this.target.bucket, Key: this.key(key) }));
      // A lock is a line of JSON; anything much larger is junk, kept out of memory (and read as unreadable).
      let text = '';
      if ((got.ContentLength ?? 0) <= 64 * 1024) text = (await got.Body?.transformToString('utf8')) ?? '';
      else (got.Body as { destroy?: () => void } | undefined)?.destroy?.();
      return { text, etag: got.ETag ?? '', modified: got.LastModified ?? new Date(0) };
    } catch (err) {
      if (errorOf(err).name === 'NoSuchKey') return undefined;
      throw this.fault(err, `reading ${key}`);
    }
  }

  /** PUT with If-None-Match: *: the new ETag, or undefined when the object exists already (412). */
  async createIfAbsent(key: string, text: string): Promise<string | undefined> {
    return this.conditionalPut(key, text, { IfNoneMatch: '*' });
  }

  /**
   * PUT with If-Match: ETAG: the new ETag, or undefined when the object is no longer that version (412). RGW (16.2)
   * compares If-Match with the ETag as stored, without its quotes, and refuses the quoted form that AWS takes; so
   * a refusal of the quoted form while the ETag is still the one given is asked again unquoted.
   */
  async replaceIf(key: string, text: string, etag: string): Promise<string | undefined> {
    const quoted = etag.startsWith('"') ? etag : `"${etag}"`;
    const unquoted = quoted.slice(1, -1);
    if (this.unquotedIfMatch) return this.conditionalPut(key, text, { IfMatch: unquoted });
    const replaced = await this.conditionalPut(key, text, { IfMatch: quoted });
    if (replaced !== undefined) return replaced;
    const now = await this.readLock(key);
    if (now === undefined || now.etag !== etag) return undefined;
    const again = await this.conditionalPut(key, text, { IfMatch: unquoted });
    if (again !== undefined) this.unquotedIfMatch = true;
    return again;
  }

  private async conditionalPut(
    key: string,
    text: string,
    condition: { IfNoneMatch?: string; IfMatch?: string },
  ): Promise<string | undefined> {
    try {
      const put = await this.client.send(
        new this.sdk.PutObjectCommand({ Bucket: this.target.bucket, Key: this.key(key), Body: text, ...condition }),
      );
      return put.ETag ?? '';
    } catch (err) {
      const { name, status } = errorOf(err);
      // 409 ConditionalRequestConflict: AWS's answer to two conditional writes at once; the other one won.
      if (name === 'PreconditionFailed' || status === 412 || status === 409) return undefined;
      throw this.fault(err, `writing ${key}`);
    }
  }
}

/** A store for the target: the SDK loaded, the client made with the target's credentials and CA. */
export async function openS3Store(target: S3Target): Promise<S3Store> {
  // The SDK warns on stderr about Node versions it will drop; latch keeps stderr for nothing but its own errors.
  process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED = 'true';
  const sdk = await import('@aws-sdk/client-s3');
  let ca: string[] | undefined;
  if (target.caFile !== undefined) {
    try {
      ca = [...rootCertificates, await readFile(target.caFile, 'utf8')];
    } catch (err) {
      throw new LatchError(
        `the CA file ${target.caFile} (backupTarget.caFile) cannot be read (${(err as NodeJS.ErrnoException).code ?? 'error'})`,
      );
    }
  }
  const client = new sdk.S3Client({
    endpoint: target.endpoint,
    region: target.region ?? 'us-east-1',
    forcePathStyle: true,
    // The SDK keeps credentials until they expire: a minute, so that a long-running agent picks up a rotated secret
    // (or a file whose mode went wrong) within a minute.
    credentials: async () => ({ ...(await readCredentials(target)), expiration: new Date(Date.now() + 60_000) }),
    // Everything that decides where and how requests go is explicit: a host's own AWS settings (environment, ~/.aws)
    // do not change it.
    useFipsEndpoint: false,
    useDualstackEndpoint: false,
    useArnRegion: false,
    disableS3ExpressSessionAuth: true,
    // Chunks and manifests carry their own checks (codec.ts, manifest.ts); the SDK's own would cost a pass.
    requestChecksumCalculation: 'WHEN_REQUIRED',
    responseChecksumValidation: 'WHEN_REQUIRED',
    retryMode: 'standard',
    maxAttempts: 3,
    // Every request has a deadline: connecting, and any silence while a request is under way.
    requestHandler: {
      connectionTimeout: 10_000,
      requestTimeout: 120_000,
      httpAgent: new HttpAgent({ keepAlive: true, maxSockets: 16 }),
      httpsAgent: new HttpsAgent({ keepAlive: true, maxSockets: 16, ...(ca && { ca }) }),
    },
  });
  return new S3Store(target, sdk, client);
}
