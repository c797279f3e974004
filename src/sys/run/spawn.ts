// Starting a child and collecting its outcome: through the native helper's vfork where it loads, else node:child_process.
import { spawn } from 'node:child_process';
import { closeSync, writeSync } from 'node:fs';
import { errorMessage } from '../../errors.js';
import { nativeHelper, type NativeHelper } from '../native.js';
import { MAX_BUFFER, closeFiles, outputFiles, readFiles, unnamedFile, type Output } from './output-files.js';
import { signalGroup } from './process-groups.js';
import { setprivPath } from './search-path.js';

export interface Collected extends Output {
  /** undefined when a signal killed the child or it could not be started. */
  exitCode: number | undefined;
  signal: NodeJS.Signals | undefined;
  /** Why it could not be started (ENOENT, EACCES, ...). */
  errorCode: string | undefined;
}

/** A started child: its pid (= its process group's id; undefined when it could not be started) and its outcome. */
export interface Started {
  pid: number | undefined;
  done: Promise<Collected>;
}

export interface SpawnOptions {
  input: string | undefined;
  stdinFd: number | undefined;
  env: NodeJS.ProcessEnv;
}

/**
 * Starts `executable` in a new session (so a deadline can kill grandchildren too, through its process group) with
 * stdin from `input` or /dev/null, and collects its stdout and stderr once it has exited.
 *
 * A child must not outlive the driver: kubelet SIGKILLs a driver call without telling it, and an orphaned
 * `losetup -d /dev/loop3` that runs later detaches whichever volume has loop3 by then. So the kernel kills every child
 * with us (PR_SET_PDEATHSIG): set by the native helper where it loads, else by util-linux's setpriv, which execs the
 * command with it set.
 *
 * The output goes to two files without a name (outputFiles), read once the child is gone, rather than to pipes: a pipe
 * is a libuv handle and a stream to read it through, which measured 4 ms more per child (a first spawn 10.4 ms
 * against 6.5, its exit 3.5 against 1.5), five times in a pod's lifecycle. Where such a file cannot be made, pipes.
 */
export function spawnCollecting(executable: string, args: string[], options: SpawnOptions): Started {
  const files = outputFiles();
  const helper = files && nativeHelper();
  if (files && helper) return spawnThroughHelper(helper, executable, args, files, options);
  const setpriv = setprivPath();
  const [file, argv] = setpriv ? [setpriv, ['--pdeathsig', 'SIGKILL', '--', executable, ...args]] : [executable, args];
  return spawnThroughNode(file, argv, files, options);
}

/**
 * node:child_process (rather than execa: every driver call that runs a tool paid for evaluating execa and for its
 * per-child machinery, measured 10-25 ms of a call's CPU, more than the tool itself).
 */
function spawnThroughNode(file: string, argv: string[], files: { out: number; err: number } | undefined, options: SpawnOptions): Started {
  let child;
  try {
    child = spawn(file, argv, {
      detached: true,
      stdio: [options.stdinFd ?? (options.input === undefined ? 'ignore' : 'pipe'), files?.out ?? 'pipe', files?.err ?? 'pipe'],
      env: options.env,
    });
  } catch (err) {
    if (files) closeFiles(files);
    throw err;
  }
  const done = new Promise<Collected>((resolve) => {
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let size = 0;
    let isMaxBuffer = false;
    const collect = (into: Buffer[]) => (chunk: Buffer) => {
      if (isMaxBuffer) return;
      size += chunk.length;
      if (size > MAX_BUFFER) {
        isMaxBuffer = true;
        if (child.pid !== undefined) signalGroup(child.pid, 'SIGKILL');
        return;
      }
      into.push(chunk);
    };
    child.stdout?.on('data', collect(out));
    child.stderr?.on('data', collect(err));
    const text = (chunks: Buffer[]) => Buffer.concat(chunks).toString('utf8');
    // Taken once: a child that could not be started sends 'error' and then 'close', and the files are closed after
    // the first read.
    let collected: Output | undefined;
    const output = (): Output => (collected ??= files ? readFiles(files) : { stdout: text(out), stderr: text(err), isMaxBuffer });
    child.once('error', (error: NodeJS.ErrnoException) => {
      // Not started; an error after the start (a failed kill) changes nothing, and 'close' reports the exit.
      if (child.pid !== undefined) return;
      resolve({ ...output(), exitCode: undefined, signal: undefined, errorCode: error.code });
    });
    child.once('close', (code, signal) =>
      resolve({ ...output(), exitCode: code ?? undefined, signal: signal ?? undefined, errorCode: undefined }),
    );
  });
  if (options.input !== undefined && child.stdin) {
    // A child that exits without reading its input closes the pipe under us: that is its business, not an error.
    child.stdin.on('error', () => {});
    child.stdin.end(options.input);
  }
  return { pid: child.pid, done };
}

/**
 * vfork and execve through the helper. Its children are not libuv's, so they are reaped here, when SIGCHLD says that
 * one has exited; the listener is there only while a child of the helper's runs (Node's signal listeners do not keep
 * the process alive).
 */
function spawnThroughHelper(
  helper: NativeHelper,
  executable: string,
  args: string[],
  files: { out: number; err: number },
  options: SpawnOptions,
): Started {
  let stdin = -1;
  let pid: number;
  try {
    if (options.stdinFd === undefined && options.input !== undefined) {
      stdin = unnamedFile();
      // At position 0, which leaves the file's offset where the child starts reading: at its start.
      writeSync(stdin, options.input, 0);
    }
    const env = Object.entries(options.env).flatMap(([name, value]) => (value === undefined ? [] : [`${name}=${value}`]));
    if (!exited.size) process.on('SIGCHLD', reapExited);
    pid = helper.spawn(executable, [executable, ...args], env, [options.stdinFd ?? stdin, files.out, files.err]);
  } catch (error) {
    if (!exited.size) process.off('SIGCHLD', reapExited);
    closeFiles(files);
    const errorCode = (error as NodeJS.ErrnoException).code ?? errorMessage(error);
    return {
      pid: undefined,
      done: Promise.resolve({ stdout: '', stderr: '', isMaxBuffer: false, exitCode: undefined, signal: undefined, errorCode }),
    };
  } finally {
    if (stdin >= 0) closeSync(stdin);
  }
  const done = new Promise<Collected>((resolve) => {
    exited.set(pid, {
      helper,
      settle: (status) => {
        const [code, signal] = status ?? [-1, ''];
        resolve({
          ...readFiles(files),
          exitCode: code >= 0 ? code : undefined,
          signal: signal ? (signal as NodeJS.Signals) : undefined,
          errorCode: status ? undefined : 'ECHILD',
        });
      },
    });
  });
  reapExited(); // one that exited already
  return { pid, done };
}

/**
 * The helper's running children: the helper that started each (which reaps it) and what to do when it has exited
 * (with undefined when it could not be waited for).
 */
const exited = new Map<number, { helper: NativeHelper; settle: (status: [number, string] | undefined) => void }>();

function reapExited(): void {
  for (const [pid, { helper, settle }] of exited) {
    let status: [number, string] | undefined;
    try {
      status = helper.reap(pid);
      if (status === undefined) continue;
    } catch {
      // ECHILD: not ours to wait for any more. Nothing else can happen to a pid of our own.
    }
    exited.delete(pid);
    settle(status);
  }
  if (!exited.size) process.off('SIGCHLD', reapExited);
}
