// The driver as a distroless kube-controller-manager container runs it: in a root file system that holds the
// driver's directory and nothing else (no /lib, no /usr, no shell, no /proc, no /etc), with an empty environment.
// doctor's trial `init` and the empty-root test use it; the driver's own directory is linked (or copied) into a
// temp dir at the path KCM sees it at, and the call is made through chroot.
import { copyFile, link, lstat, mkdir, mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { LatchError } from '../errors.js';
import { findTool, run, toolSearchPath, type RunResult } from '../sys/run.js';

export interface EmptyRoot {
  /** The temp dir that is the root. */
  root: string;
  /** The driver as the call names it: its path inside the root. */
  driver: string;
  remove(): Promise<void>;
}

/**
 * A temp root holding only a copy of `driverDir` (as this process sees it) at `seenAsDriverDir` (where the
 * runner sees it: the interpreter and RPATH written into the driver are that path).
 */
export async function emptyRootWith(driverDir: string, seenAsDriverDir: string, driverFile: string): Promise<EmptyRoot> {
  const root = await mkdtemp(join(tmpdir(), 'latch-empty-root-'));
  const remove = () => rm(root, { recursive: true, force: true });
  try {
    await copyTree(driverDir, join(root, seenAsDriverDir));
  } catch (err) {
    await remove();
    throw err;
  }
  return { root, driver: join(seenAsDriverDir, basename(driverFile)), remove };
}

/** Hard links where the file system allows (a self-contained build is 100 MB), copies elsewhere; modes kept. */
async function copyTree(from: string, to: string): Promise<void> {
  await mkdir(to, { recursive: true, mode: 0o755 });
  for (const name of await readdir(from)) {
    const source = join(from, name);
    const target = join(to, name);
    const info = await lstat(source);
    if (info.isDirectory()) await copyTree(source, target);
    else if (info.isFile()) await link(source, target).catch(() => copyFile(source, target));
    // Anything else (a symlink out of the plugin dir, a socket) is not there for KCM either.
  }
}

/** One call of the driver in the empty root: chroot, an empty environment, no stdin. */
export async function callInEmptyRoot(emptyRoot: EmptyRoot, args: string[], timeoutMs = 60_000): Promise<RunResult> {
  const searchPath = toolSearchPath();
  const env = findTool('env', searchPath);
  const chroot = findTool('chroot', searchPath);
  if (!env || !chroot) throw new LatchError('env and chroot (coreutils) are needed to run the driver in an empty root');
  // env -i runs outside the root and clears the environment, then chroot enters it: nothing of ours leaks in.
  return run(env, ['-i', chroot, emptyRoot.root, emptyRoot.driver, ...args], { timeoutMs, okExitCodes: [1] });
}
