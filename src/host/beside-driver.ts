// What is installed beside the driver, in <driver dir>/.latch/, so that the driver runs where nothing else is: a
// control plane's kube-controller-manager in a distroless container, which sees the plugin dir and nothing more.
//
//   latch~loop/loop                        the driver; its interpreter and RPATH name the runtime below
//   latch~loop/.latch/runtime-<sha12>/     the loader and libraries of the self-contained build, by content
//   latch~loop/.latch/config.json          with --config-beside-driver: the configuration (0600)
//   latch~loop/.latch/etcd-{ca,cert,key}.pem   and the etcd client's files it names, relative to it (0600)
//
// Every file is written under a temp name and renamed into place, and the runtime is a directory renamed in whole
// under a name of its content, so the driver only ever names a complete runtime: it is installed before the driver
// that names it, and a runtime is removed only two installs later (a call of the previous driver may be starting).
// kubelet's prober ignores names starting with '.', so the runtime's rename does not make it re-probe.
import { X509Certificate, createHash, createPrivateKey } from 'node:crypto';
import { constants } from 'node:fs';
import { copyFile, lstat, mkdir, open, readdir, readFile, rename, rm, stat } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { BESIDE_DRIVER_DIR, type Config } from '../config.js';
import { errorMessage, LatchError } from '../errors.js';
import { leftoverOf, syncDir, tempPathFor, writeFileAtomic } from '../atomic-file.js';
import { withHostLock } from '../sys/lock.js';
import { fileDigest } from './driver-file.js';
import { readRuntimeSlots, slotEdit, type ByteEdit } from './elf.js';

/** A temp file or directory of ours this old was left by an install that was killed; the next install removes it. */
const STALE_TEMP_MS = 10 * 60 * 1000;

/** The runtime a self-contained build ships beside itself (build.mjs): `bin/latch-sea.runtime/`. */
export function runtimeBeside(executable: string): string {
  return `${executable}.runtime`;
}

/** `<driver dir>/.latch`. */
function besideDir(driverDir: string): string {
  return join(driverDir, BESIDE_DRIVER_DIR);
}

interface RuntimeFile {
  name: string;
  sha256: string;
  mode: number;
}

export interface RuntimePlan {
  /** Where the runtime is copied from. */
  sourceDir: string;
  files: RuntimeFile[];
  /** `<driver dir>/.latch/runtime-<sha12>`, as the installer sees it. */
  installedDir: string;
  /** The changes to the executable's interpreter and RPATH that make it use the installed runtime. */
  edits: ByteEdit[];
}

/**
 * What installing `executable` with the runtime in `sourceDir` into `driverDir` takes. `seenAsDriverDir` is the
 * driver dir as kubelet and kube-controller-manager see it (the paths written into the executable are theirs).
 */
export async function planRuntime(executable: string, sourceDir: string, driverDir: string, seenAsDriverDir: string): Promise<RuntimePlan> {
  const slots = await readRuntimeSlots(executable);
  if (!slots || slots.interpreter.size < 256 || slots.rpath.size < 256) {
    throw new LatchError(
      `${executable} has no room to be pointed at the runtime beside it (built before the runtime was shipped?); rebuild it with npm run build:sea`,
    );
  }
  const loader = basename(slots.interpreter.value);
  let names: string[];
  try {
    names = (await readdir(sourceDir)).sort();
  } catch (err) {
    throw new LatchError(`cannot read the runtime ${sourceDir}: ${errorMessage(err)}`);
  }
  if (!names.includes(loader)) throw new LatchError(`the runtime ${sourceDir} lacks the loader ${loader}; rebuild with npm run build:sea`);
  const files: RuntimeFile[] = [];
  for (const name of names) {
    const path = join(sourceDir, name);
    const info = await stat(path);
    if (!info.isFile()) throw new LatchError(`the runtime ${sourceDir} holds ${name}, which is not a file`);
    files.push({ name, sha256: (await fileDigest(path)).sha256, mode: info.mode & 0o755 });
  }
  const digest = createHash('sha256');
  for (const f of files) digest.update(`${f.name}\0${f.sha256}\0${f.mode}\n`);
  const dirName = `runtime-${digest.digest('hex').slice(0, 12)}`;
  const seenAs = join(besideDir(seenAsDriverDir), dirName);
  return {
    sourceDir,
    files,
    installedDir: join(besideDir(driverDir), dirName),
    edits: [slotEdit(slots.interpreter, join(seenAs, loader), 'loader'), slotEdit(slots.rpath, seenAs, 'library')],
  };
}

/**
 * Whether two executables are the same build, whatever runtime each was pointed at: equal once their interpreter
 * and RPATH slots are blanked (an installed driver differs from its source in exactly those).
 */
export async function sameBuild(a: string, b: string): Promise<boolean> {
  const blanked = async (file: string) => {
    const slots = await readRuntimeSlots(file);
    const edits = slots ? [slots.interpreter, slots.rpath].map((s) => ({ offset: s.offset, bytes: Buffer.alloc(s.size) })) : [];
    return (await fileDigest(file, edits)).sha256;
  };
  try {
    const [x, y] = await Promise.all([blanked(a), blanked(b)]);
    return x === y;
  } catch {
    return false;
  }
}

/** Whether the planned runtime is installed, complete and unchanged. */
async function runtimeInstalled(plan: RuntimePlan): Promise<boolean> {
  try {
    const names = (await readdir(plan.installedDir)).sort();
    if (names.join('\0') !== plan.files.map((f) => f.name).join('\0')) return false;
    for (const f of plan.files) {
      const path = join(plan.installedDir, f.name);
      if (((await lstat(path)).mode & 0o7777) !== f.mode || (await fileDigest(path)).sha256 !== f.sha256) return false;
    }
    return true;
  } catch {
    return false;
  }
}

/** Installs the planned runtime unless it is there already: copied into a temp directory, renamed in whole. */
export async function installRuntime(plan: RuntimePlan): Promise<void> {
  if (await runtimeInstalled(plan)) return;
  const beside = dirname(plan.installedDir);
  await ensureBesideDir(beside);
  const temp = tempPathFor(plan.installedDir);
  await mkdir(temp, { mode: 0o755 });
  try {
    for (const f of plan.files) {
      const target = join(temp, f.name);
      await copyFile(join(plan.sourceDir, f.name), target, constants.COPYFILE_EXCL);
      const handle = await open(target, 'r+');
      try {
        await handle.chmod(f.mode);
        await handle.sync();
      } finally {
        await handle.close();
      }
      if ((await fileDigest(target)).sha256 !== f.sha256) {
        throw new LatchError(`${join(plan.sourceDir, f.name)} changed while it was being copied (a build running?); run install again`);
      }
    }
    await syncDir(temp);
    const placed = await rename(temp, plan.installedDir).then(
      () => true,
      (err: NodeJS.ErrnoException) => {
        if (err.code === 'ENOTEMPTY' || err.code === 'EEXIST') return false;
        throw err;
      },
    );
    if (!placed) {
      // There is one of that name already: damaged, since it was not intact above (or intact now: put there by an
      // install in another mount namespace, whose lock is not ours). A damaged one goes aside, as rename cannot
      // replace a directory that is not empty; the driver naming it was broken already.
      if (!(await runtimeInstalled(plan))) {
        const aside = tempPathFor(plan.installedDir);
        await rename(plan.installedDir, aside);
        await rename(temp, plan.installedDir);
        await rm(aside, { recursive: true, force: true });
      }
      await rm(temp, { recursive: true, force: true });
    }
    await syncDir(beside);
  } catch (err) {
    await rm(temp, { recursive: true, force: true });
    throw err;
  }
}

/**
 * Runs `fn` while no other install or uninstall of this driver dir runs on this host: the last to rename a driver
 * must be the last to prune runtimes, or it could remove the one the driver names.
 */
export function withDriverDirLock<T>(driverDir: string, fn: () => Promise<T>): Promise<T> {
  return withHostLock(
    ['install', driverDir],
    300_000,
    () => `another latch install or uninstall of ${driverDir} has been running for 5 minutes`,
    fn,
  );
}

/** The runtime directory (its name) an installed driver names, when it names one beside it. */
export async function runtimeNamedBy(driverFile: string, seenAsDriverDir: string): Promise<string | undefined> {
  try {
    const slots = await readRuntimeSlots(driverFile);
    const dir = slots && dirname(slots.interpreter.value);
    return dir && dirname(dir) === besideDir(seenAsDriverDir) ? basename(dir) : undefined;
  } catch {
    return undefined;
  }
}

/** The loader an installed driver names in its own .latch directory, when it is missing there. */
export async function missingRuntime(driverFile: string, driverDir: string): Promise<string | undefined> {
  const slots = await readRuntimeSlots(driverFile).catch(() => undefined);
  const loader = slots?.interpreter.value;
  if (!loader?.startsWith(`${besideDir(driverDir)}/`)) return undefined; // the host's loader, or another path's view
  return (await stat(loader).then(
    () => true,
    () => false,
  ))
    ? undefined
    : loader;
}

/** Removes the runtimes other than `keep`, and temp files and directories of killed installs. */
export async function pruneBesideDir(driverDir: string, keep: readonly string[]): Promise<void> {
  const beside = besideDir(driverDir);
  let names: string[];
  try {
    names = await readdir(beside);
  } catch {
    return;
  }
  for (const name of names) {
    const path = join(beside, name);
    try {
      if (/^runtime-[0-9a-f]{12}$/.test(name) && !keep.includes(name)) await rm(path, { recursive: true, force: true });
      // Older installs put a damaged runtime aside as <temp>.old; now that is a temp name of its own.
      else if (leftoverOf(name.replace(/\.old$/, '')) !== undefined && Date.now() - (await lstat(path)).mtimeMs > STALE_TEMP_MS) {
        await rm(path, { recursive: true, force: true });
      }
    } catch {
      // Another install removed it meanwhile.
    }
  }
}

/** The etcd client's files as the configuration beside the driver names them (relative to it). */
const TLS_NAMES = { ca: 'etcd-ca.pem', cert: 'etcd-cert.pem', key: 'etcd-key.pem' } as const;

/**
 * The configuration to write beside the driver: the file `config` was loaded from, with the etcd client's files
 * to be copied beside it and named relative to it. Read and checked before anything is written: the certificate
 * must match its key (kube-controller-manager should not find out on its first attach).
 */
export async function prepareConfigBeside(config: Config): Promise<ConfigBeside> {
  let raw: Record<string, unknown> = {};
  if (config.source !== 'built-in defaults') {
    raw = JSON.parse(await readFile(config.source, 'utf8')) as Record<string, unknown>;
  }
  const copies: { name: string; data: Buffer }[] = [];
  if (config.store.type === 'etcd' && config.store.tls) {
    const tls = config.store.tls;
    if (tls.cert !== undefined && tls.key !== undefined) await checkCertificateMatchesKey(tls.cert, tls.key);
    const named: Record<string, string> = {};
    for (const field of ['ca', 'cert', 'key'] as const) {
      const from = tls[field];
      if (from === undefined) continue;
      copies.push({ name: TLS_NAMES[field], data: await readFile(from) });
      named[field] = TLS_NAMES[field];
    }
    raw = { ...raw, store: { ...(raw.store as Record<string, unknown>), tls: named } };
  }
  return { config: Buffer.from(`${JSON.stringify(raw, null, 2)}\n`), copies };
}

/** What prepareConfigBeside read and checked, to be written beside the driver. */
export interface ConfigBeside {
  config: Buffer;
  copies: { name: string; data: Buffer }[];
}

/** Writes what prepareConfigBeside read; returns the configuration's path and the files it names. */
export async function writeConfigBeside(driverDir: string, prepared: ConfigBeside): Promise<{ path: string; files: string[] }> {
  const beside = besideDir(driverDir);
  await ensureBesideDir(beside);
  // The files the configuration names first, then the configuration: it never names a file that is not there.
  for (const copy of prepared.copies) await writePrivate(join(beside, copy.name), copy.data);
  const path = join(beside, 'config.json');
  await writePrivate(path, prepared.config);
  await syncDir(beside);
  return { path, files: prepared.copies.map((c) => join(beside, c.name)) };
}

async function checkCertificateMatchesKey(certFile: string, keyFile: string): Promise<void> {
  let matches: boolean;
  try {
    const certificate = new X509Certificate(await readFile(certFile));
    matches = certificate.checkPrivateKey(createPrivateKey(await readFile(keyFile)));
  } catch (err) {
    throw new LatchError(`the etcd client certificate ${certFile} or its key ${keyFile} cannot be read: ${errorMessage(err)}`);
  }
  if (!matches) throw new LatchError(`the etcd client certificate ${certFile} does not match the key ${keyFile}; nothing was installed`);
}

/** Writes a file readable by its owner alone, under a temp name renamed into place; the same file is left alone. */
async function writePrivate(path: string, data: Buffer): Promise<void> {
  const same = await Promise.all([readFile(path), lstat(path)]).then(
    ([old, info]) => old.equals(data) && info.isFile() && (info.mode & 0o777) === 0o600,
    () => false,
  );
  // The directory is fsynced once, after all of them (writeConfigBeside).
  if (!same) await writeFileAtomic(path, data, { sync: 'file' });
}

async function ensureBesideDir(beside: string): Promise<void> {
  const created = await mkdir(beside, { recursive: true, mode: 0o755 });
  if (created !== undefined) await syncDir(dirname(beside));
}

/** Removes everything beside the driver (uninstall, after the driver itself). */
export async function removeBesideDir(driverDir: string): Promise<boolean> {
  const beside = besideDir(driverDir);
  const present = await lstat(beside).then(
    () => true,
    () => false,
  );
  if (present) await rm(beside, { recursive: true, force: true });
  return present;
}
