// latch's native helper, for what Node does not do, or does at a cost every driver call pays: starting a child
// (spawn, reap; for src/sys/run.ts), holding a host-wide lock (lockFile; for src/sys/lock.ts), and waiting for a
// turn before Node starts (takeTurnAtStart).
//
// Starting a child: Node starts one with fork(2) (libuv), which copies the page tables of V8's address space and then
// has the parent fault on its own writes, 6-8 ms a child; and a child cannot be given PR_SET_PDEATHSIG through
// node:child_process, so every child went through util-linux's setpriv, one more exec (3 ms). A pod's lifecycle runs
// four tools, in three driver calls that each paid for loading node:child_process as well. vfork shares the parent's
// memory until the child execs, as glibc's posix_spawn does, and the child sets its death signal itself.
//
// What the child gets is what run() asked of node:child_process and setpriv: a new session (so a deadline can kill
// its whole process group), SIGKILL when the thread that started it dies, stdin/stdout/stderr from the three
// descriptors given (stdin /dev/null when -1), every signal at its default disposition and none blocked, and the
// environment given. Every other descriptor of the driver's is close-on-exec (Node opens them so).
//
// Holding a lock: a host-wide lock is the flock(2) of a file in a directory only root may write (src/sys/lock.ts), a
// call Node does not have: here it is a few system calls, where without the helper a child (util-linux's flock) takes it.
//
// Taking turns: the single executable names this file as a library it needs (build.mjs), so the loader maps it and
// runs its constructor before Node starts. A driver call that does a volume's work waits there for one of a few turns
// on the host, before it pays for Node's start-up: see takeTurnAtStart below.
//
// Built by build.mjs into the self-contained build's runtime directory, which its RPATH names; it uses only Node-API
// (ABI-stable), so one build serves every Node that can run latch.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <node_api.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/** Throws an Error whose code is the errno's name (ENOENT, ...), as Node's own errors have. */
static void throwErrno(napi_env env, const char *what, int err) {
  const char *name = strerrorname_np(err);
  char message[PATH_MAX + 512];
  snprintf(message, sizeof message, "%s: %s", what, strerror(err));
  napi_throw_error(env, name ? name : "EUNKNOWN", message);
}

static void freeStrings(char **strings) {
  if (!strings) return;
  for (char **p = strings; *p; p++) free(*p);
  free(strings);
}

/** A JS array of strings as a NULL-terminated array of C strings; NULL (with a pending exception) when it is not one. */
static char **toStrings(napi_env env, napi_value array) {
  uint32_t n;
  if (napi_get_array_length(env, array, &n) != napi_ok) {
    napi_throw_type_error(env, NULL, "expected an array of strings");
    return NULL;
  }
  char **out = calloc(n + 1, sizeof(char *));
  if (!out) {
    napi_throw_error(env, "ENOMEM", "out of memory");
    return NULL;
  }
  for (uint32_t i = 0; i < n; i++) {
    napi_value item;
    size_t length;
    if (napi_get_element(env, array, i, &item) != napi_ok ||
        napi_get_value_string_utf8(env, item, NULL, 0, &length) != napi_ok) {
      freeStrings(out);
      napi_throw_type_error(env, NULL, "expected an array of strings");
      return NULL;
    }
    out[i] = malloc(length + 1);
    if (!out[i]) {
      freeStrings(out);
      napi_throw_error(env, "ENOMEM", "out of memory");
      return NULL;
    }
    napi_get_value_string_utf8(env, item, out[i], length + 1, &length);
    // A NUL inside a string would cut an argument short; run() refuses them before they get here.
    if (strlen(out[i]) != length) {
      freeStrings(out);
      napi_throw_type_error(env, NULL, "a string contains a NUL byte");
      return NULL;
    }
  }
  return out;
}

/**
 * The child's side, between vfork and execve: only system calls, on the parent's stack, and no return. Reports the
 * errno of what failed in *failure (the parent's memory, which the child shares until it execs or exits).
 */
static void child(const char *file, char *const argv[], char *const envp[], int fds[3], pid_t parent,
                  volatile int *failure) {
  // Handlers are the parent's code: a signal that reached the child before exec must not run them. The mask was
  // all-blocked by the parent for this window.
  struct sigaction defaults;
  memset(&defaults, 0, sizeof defaults);
  defaults.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; sig++) {
    if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &defaults, NULL);  // EINVAL for glibc's own: ignored
  }
  if (setsid() < 0) goto fail;
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) goto fail;
  // The parent died before the death signal was set: nobody is left to kill us.
  if (getppid() != parent) {
    errno = ESRCH;
    goto fail;
  }
  if (fds[0] < 0) {
    fds[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fds[0] < 0) goto fail;
  }
  // Move every source above 2 first, so that no dup2 below overwrites a source that another still needs (a source
  // can be 0, 1 or 2 in a process that closed its own; node reopens them at start, but this costs nothing).
  for (int i = 0; i < 3; i++) {
    if (fds[i] < 3) {
      fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
      if (fds[i] < 0) goto fail;
    }
  }
  for (int i = 0; i < 3; i++) {
    if (dup2(fds[i], i) < 0) goto fail;  // the copy at i is not close-on-exec
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  execve(file, argv, envp);
fail:
  *failure = errno ? errno : EINVAL;
  _exit(127);
}

/**
 * spawn(file, argv, env, [stdin, stdout, stderr]) -> pid. `file` is a path (run() has looked it up), `argv` includes
 * argv[0], `env` is "NAME=value" strings, and a stdin of -1 is /dev/null. Throws with the errno's name as code when
 * the child could not be made or could not exec (ENOENT, EACCES, ENOEXEC, ...); such a child is reaped here.
 */
static napi_value Spawn(napi_env env, napi_callback_info info) {
  size_t argc = 4;
  napi_value args[4];
  if (napi_get_cb_info(env, info, &argc, args, NULL, NULL) != napi_ok || argc != 4) {
    napi_throw_type_error(env, NULL, "spawn(file, argv, env, fds)");
    return NULL;
  }
  size_t length;
  if (napi_get_value_string_utf8(env, args[0], NULL, 0, &length) != napi_ok) {
    napi_throw_type_error(env, NULL, "file must be a string");
    return NULL;
  }
  char *file = malloc(length + 1);
  if (!file) {
    napi_throw_error(env, "ENOMEM", "out of memory");
    return NULL;
  }
  napi_get_value_string_utf8(env, args[0], file, length + 1, &length);
  int fds[3];
  for (uint32_t i = 0; i < 3; i++) {
    napi_value fd;
    if (napi_get_element(env, args[3], i, &fd) != napi_ok || napi_get_value_int32(env, fd, &fds[i]) != napi_ok) {
      free(file);
      napi_throw_type_error(env, NULL, "fds must be three numbers");
      return NULL;
    }
  }
  char **argv = toStrings(env, args[1]);
  char **envp = argv ? toStrings(env, args[2]) : NULL;
  if (!argv || !envp) {
    free(file);
    freeStrings(argv);
    return NULL;
  }

  pid_t parent = getpid();
  volatile int failure = 0;
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  pid_t pid = vfork();
  if (pid == 0) child(file, argv, envp, fds, parent, &failure);
  int forkError = errno;
  pthread_sigmask(SIG_SETMASK, &previous, NULL);
  free(file);
  freeStrings(argv);
  freeStrings(envp);

  if (pid < 0) {
    throwErrno(env, "vfork", forkError);
    return NULL;
  }
  if (failure != 0) {
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    throwErrno(env, "spawn", failure);
    return NULL;
  }
  napi_value result;
  napi_create_int32(env, pid, &result);
  return result;
}

/**
 * reap(pid) -> undefined while the child runs, else [exit code, signal name]: [code, ""] when it exited, [-1, "SIGKILL"]
 * when a signal killed it. Never blocks.
 */
static napi_value Reap(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value arg;
  int32_t pid;
  if (napi_get_cb_info(env, info, &argc, &arg, NULL, NULL) != napi_ok || argc != 1 ||
      napi_get_value_int32(env, arg, &pid) != napi_ok || pid <= 0) {
    napi_throw_type_error(env, NULL, "reap(pid)");
    return NULL;
  }
  int status;
  pid_t done;
  do done = waitpid(pid, &status, WNOHANG);
  while (done < 0 && errno == EINTR);
  if (done < 0) {
    throwErrno(env, "waitpid", errno);
    return NULL;
  }
  napi_value result;
  if (done == 0) {
    napi_get_undefined(env, &result);
    return result;
  }
  char signalName[32] = "";
  if (WIFSIGNALED(status)) {
    const char *abbreviation = sigabbrev_np(WTERMSIG(status));
    if (abbreviation) snprintf(signalName, sizeof signalName, "SIG%s", abbreviation);
    else snprintf(signalName, sizeof signalName, "SIG%d", WTERMSIG(status));
  }
  napi_value code, name;
  napi_create_int32(env, WIFEXITED(status) ? WEXITSTATUS(status) : -1, &code);
  napi_create_string_utf8(env, signalName, NAPI_AUTO_LENGTH, &name);
  napi_create_array_with_length(env, 2, &result);
  napi_set_element(env, result, 0, code);
  napi_set_element(env, result, 1, name);
  return result;
}

// Locks and turns are files in one directory that only root may write (LOCK_DIR), held with flock(2): the kernel
// releases a flock when the last descriptor of its open file goes, however the holder ends (SIGKILL too), and nothing
// outside that directory can open the files, let alone hold them. They used to be abstract unix socket names, which
// have no permissions: any local user could bind them, and so stall every call of a volume, or keep the agent from
// starting. The files are left in place (unlinking a flock's file races with its next taker); they are empty, one per
// volume and image the node has seen, and the turns.

/** Where latch's locks and turns are. Under /var/lib/latch, which the agent's container shares with the host. */
#define LOCK_DIR "/var/lib/latch/locks"

/**
 * The directory `path`, created (mode 0700, its missing parents 0755) when missing, opened: a descriptor, or -1 with
 * errno set, and *refusal set when it is there but not to be trusted: a symbolic link, not a directory, owned by
 * another user than root or this process's, or writable by its group or others. Whoever could write it could hold
 * every lock in it.
 */
static int openLockDir(const char *path, const char **refusal) {
  *refusal = NULL;
  int dir = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dir < 0 && errno == ENOENT && path[0] == '/' && strlen(path) < PATH_MAX) {
    char partial[PATH_MAX];
    strcpy(partial, path);
    for (char *slash = strchr(partial + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
      *slash = '\0';
      if (mkdir(partial, 0755) != 0 && errno != EEXIST) return -1;
      *slash = '/';
    }
    if (mkdir(path, 0700) != 0 && errno != EEXIST) return -1;
    dir = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  }
  if (dir < 0) {
    // O_NOFOLLOW with O_DIRECTORY fails a link to a directory with ENOTDIR, not ELOOP.
    struct stat link;
    int err = errno;
    if ((err == ELOOP || err == ENOTDIR) && lstat(path, &link) == 0 && S_ISLNK(link.st_mode)) *refusal = "is a symbolic link";
    else if (err == ENOTDIR) *refusal = "is not a directory";
    errno = err;
    return -1;
  }
  struct stat status;
  if (fstat(dir, &status) != 0) {
    int err = errno;
    close(dir);
    errno = err;
    return -1;
  }
  if (status.st_uid != 0 && status.st_uid != geteuid()) *refusal = "is owned by another user";
  else if (status.st_mode & (S_IWGRP | S_IWOTH)) *refusal = "is writable by its group or others";
  if (*refusal) {
    close(dir);
    errno = EPERM;
    return -1;
  }
  return dir;
}

/** Throws the error openLockDir(path) ended with. */
static void throwLockDirError(napi_env env, const char *path, const char *refusal, int err) {
  char message[PATH_MAX + 128];
  if (refusal) {
    snprintf(message, sizeof message, "the lock directory %s %s: refused", path, refusal);
    napi_throw_error(env, "EPERM", message);
  } else {
    snprintf(message, sizeof message, "the lock directory %s", path);
    throwErrno(env, message, err);
  }
}

/** The file `name` in the directory `dir`, opened (created 0600 when missing) for flock; -1 with errno on an error. */
static int openLockFile(int dir, const char *name) {
  return openat(dir, name, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, 0600);
}

/** A JS string argument into `out` (of `size` bytes): 1 when it is one of 1 to size-1 bytes, else 0. */
static int stringArgument(napi_env env, napi_value value, char *out, size_t size) {
  size_t length;
  if (napi_get_value_string_utf8(env, value, NULL, 0, &length) != napi_ok || length == 0 || length >= size) return 0;
  napi_get_value_string_utf8(env, value, out, size, &length);
  return strlen(out) == length;
}

/** A lock file's or turn prefix's name: no slash, no leading dot, no NUL (stringArgument checks that). */
static int plainName(const char *name) {
  return name[0] != '.' && !strchr(name, '/');
}

/**
 * lockFile(dir, name) -> a descriptor holding an exclusive flock on the file `name` in the lock directory `dir` (see
 * openLockDir), or -1 when another holder has it. Never waits: src/sys/lock.ts tries again until its deadline. The
 * lock is released when the descriptor is closed or the process ends, however it ends.
 */
static napi_value LockFile(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value args[2];
  char dirPath[PATH_MAX], name[NAME_MAX + 1];
  if (napi_get_cb_info(env, info, &argc, args, NULL, NULL) != napi_ok || argc != 2 ||
      !stringArgument(env, args[0], dirPath, sizeof dirPath) || dirPath[0] != '/' ||
      !stringArgument(env, args[1], name, sizeof name) || !plainName(name)) {
    napi_throw_type_error(env, NULL, "lockFile(dir, name): an absolute directory and a plain file name");
    return NULL;
  }
  const char *refusal;
  int dir = openLockDir(dirPath, &refusal);
  if (dir < 0) {
    throwLockDirError(env, dirPath, refusal, errno);
    return NULL;
  }
  int fd = openLockFile(dir, name);
  int err = errno;
  close(dir);
  if (fd < 0) {
    throwErrno(env, "open the lock file", err);
    return NULL;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    err = errno;
    close(fd);
    if (err != EWOULDBLOCK) {
      throwErrno(env, "flock", err);
      return NULL;
    }
    fd = -1;
  }
  napi_value result;
  napi_create_int32(env, fd, &result);
  return result;
}

// Turns. kubelet runs a call per volume operation, all at once when many pods start: 64 pod lifecycles on 2 cores ran
// 64 Node start-ups side by side, each costing 20-45% more CPU than with one per core, each finding the caches full of
// the others' pages (docs/performance.md, "Turns"). So a call that does a volume's work first takes one of a few turns
// on the host, as many as it has usable CPUs plus one, and waits for one before Node starts when all are taken.
//
// A turn is the flock of a file "<prefix>-N" in the lock directory. A taker tries each with LOCK_NB. When all are held
// it queues for "<prefix>-queue-<turns>" with a blocking flock (the kernel queues blocked flocks of one file behind each other
// and wakes the first when it is let go, so waiters come out in the order they came): the one at the head of the queue
// looks at the turns every millisecond, takes the first that is free, and lets the queue go to the next. One process
// wakes per turn that frees, and only root can hold the files. A holder ends its turn by closing it: at exit, at its
// hold limit, or by dying (the kernel closes it).
//
// The waiting is bounded both ways, so that a turn can only delay a call, never fail or wedge it: a holder lets its
// turn go after TURN_HOLD_MS even while it still runs (a call that waits on a device or the network need not hold the
// others up), and a waiter that got none within TURN_WAIT_MS goes on without one.

#define TURN_PREFIX "turn"
#define TURN_HOLD_MS 1000
#define TURN_WAIT_MS 10000
#define TURN_LOOK_MS 1
#define MAX_TURNS 256

/** The ops that take a turn: those that do a volume's work. init, getvolumename and isattached only read the ledger. */
static const char *const TURN_OPS[] = {"attach", "detach", "waitforattach", "mountdevice", "unmountdevice",
                                       "mount", "unmount", "expandfs", NULL};

/** The descriptor of the turn this process holds, or -1: a process holds one turn at most. */
static int heldTurn = -1;

static long long nowMs(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/**
 * A blocking flock of `fd` in a thread of its own, which the taker waits for only until its deadline. A flock cannot
 * be given a deadline, so a taker that gives up leaves the thread waiting; when it gets the lock after all, it lets it
 * go at once (and closes the descriptor, which is then its own).
 */
struct blockedLock {
  pthread_mutex_t mutex;
  pthread_cond_t done;
  int fd;
  enum { WAITING, GOT, FAILED, ABANDONED } state;
  int references;
};

static void releaseBlockedLock(struct blockedLock *wait) {
  int last = --wait->references == 0;
  pthread_mutex_unlock(&wait->mutex);
  if (last) {
    pthread_cond_destroy(&wait->done);
    pthread_mutex_destroy(&wait->mutex);
    free(wait);
  }
}

static void *blockOnLock(void *argument) {
  struct blockedLock *wait = argument;
  int got;
  do got = flock(wait->fd, LOCK_EX) == 0;
  while (!got && errno == EINTR);
  pthread_mutex_lock(&wait->mutex);
  if (wait->state == ABANDONED) close(wait->fd);
  else {
    wait->state = got ? GOT : FAILED;
    pthread_cond_signal(&wait->done);
  }
  releaseBlockedLock(wait);
  return NULL;
}

/** Starts `run(argument)` in a detached thread with a small stack and every signal blocked (Node's handlers run on its own). */
static int startThread(void *(*run)(void *), void *argument) {
  pthread_attr_t attributes;
  pthread_t thread;
  if (pthread_attr_init(&attributes) != 0) return 0;
  pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attributes, 64 * 1024);
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  int made = pthread_create(&thread, &attributes, run, argument) == 0;
  pthread_sigmask(SIG_SETMASK, &previous, NULL);
  pthread_attr_destroy(&attributes);
  return made;
}

/**
 * Takes an exclusive flock of `fd`, waiting until `deadline` (nowMs()) at most: 1 when taken; 0 when not, and then
 * `fd` is no longer the caller's (a thread still waiting closes it).
 */
static int flockBy(int fd, long long deadline) {
  struct blockedLock *wait = calloc(1, sizeof *wait);
  pthread_condattr_t clock;
  if (!wait || pthread_condattr_init(&clock) != 0) {
    free(wait);
    close(fd);
    return 0;
  }
  pthread_condattr_setclock(&clock, CLOCK_MONOTONIC);
  pthread_mutex_init(&wait->mutex, NULL);
  pthread_cond_init(&wait->done, &clock);
  pthread_condattr_destroy(&clock);
  wait->fd = fd;
  wait->state = WAITING;
  wait->references = 2;
  if (!startThread(blockOnLock, wait)) {
    wait->references = 1;
    wait->state = FAILED;
  }
  pthread_mutex_lock(&wait->mutex);
  struct timespec at = {deadline / 1000, (long)(deadline % 1000) * 1000000};
  while (wait->state == WAITING && pthread_cond_timedwait(&wait->done, &wait->mutex, &at) != ETIMEDOUT) {
  }
  int got = wait->state == GOT;
  if (wait->state == WAITING) wait->state = ABANDONED;
  else if (!got) close(fd);
  releaseBlockedLock(wait);
  return got;
}

/**
 * The descriptors of the turns prefix-0 .. prefix-(turns-1) in `dir` (turns at most MAX_TURNS), into `fds`: 1, or 0 on
 * an error (none left open).
 */
static int openTurns(int dir, const char *prefix, int turns, int *fds) {
  char name[NAME_MAX + 1];
  for (int i = 0; i < turns && i < MAX_TURNS; i++) {
    snprintf(name, sizeof name, "%s-%d", prefix, i);
    fds[i] = openLockFile(dir, name);
    if (fds[i] < 0) {
      while (i-- > 0) close(fds[i]);
      return 0;
    }
  }
  return 1;
}

/** One of `fds` that a flock LOCK_NB took (the others closed), or -1 when every one is held (all left open). */
static int tryTurns(int *fds, int turns) {
  for (int i = 0; i < turns && i < MAX_TURNS; i++) {
    if (flock(fds[i], LOCK_EX | LOCK_NB) == 0) {
      for (int j = 0; j < turns && j < MAX_TURNS; j++)
        if (j != i) close(fds[j]);
      return fds[i];
    }
  }
  return -1;
}

/**
 * The descriptor of one of the turns prefix-0 .. prefix-(turns-1) in the lock directory `dirPath`, flocked here: a free
 * one at once, else the first that frees while this process is at the head of the queue; -1 when none came by
 * `deadline` (nowMs()), or on an error (an untrusted directory among them).
 */
static int waitForTurn(const char *dirPath, const char *prefix, int turns, long long deadline) {
  if (turns < 1 || turns > MAX_TURNS) return -1;
  const char *refusal;
  int dir = openLockDir(dirPath, &refusal);
  if (dir < 0) return -1;
  int *fds = calloc(turns, sizeof *fds);
  char queueName[NAME_MAX + 1];
  // A queue per count of turns: a head of the queue looks at its own count's turns only (a host's calls all count the
  // same; a test's LATCH_TURNS may not).
  snprintf(queueName, sizeof queueName, "%s-queue-%d", prefix, turns);
  int queue = -1;
  if (fds && openTurns(dir, prefix, turns, fds)) {
    int turn = tryTurns(fds, turns);
    if (turn < 0) queue = openLockFile(dir, queueName);
    if (turn < 0 && queue >= 0 && flockBy(queue, deadline)) {
      for (;;) {
        turn = tryTurns(fds, turns);
        if (turn >= 0 || deadline - nowMs() <= 0) break;
        struct timespec pause = {0, TURN_LOOK_MS * 1000000L};
        nanosleep(&pause, NULL);
      }
      close(queue);  // the next waiter's turn to look
    } else if (turn < 0 && queue >= 0) {
      queue = -1;  // flockBy's now
    }
    if (turn < 0)
      for (int i = 0; i < turns; i++) close(fds[i]);
    free(fds);
    close(dir);
    return turn;
  }
  free(fds);
  close(dir);
  return -1;
}

/** Lets go of the turn this process holds; once, from the hold limit's thread or at exit, whichever comes first. */
static void giveBackTurn(void) {
  int turn = __atomic_exchange_n(&heldTurn, -1, __ATOMIC_ACQ_REL);
  if (turn >= 0) close(turn);
}

static void *giveBackLater(void *argument) {
  int holdMs = (int)(intptr_t)argument;
  struct timespec hold = {holdMs / 1000, (long)(holdMs % 1000) * 1000000};
  while (nanosleep(&hold, &hold) != 0 && errno == EINTR) {
  }
  giveBackTurn();
  return NULL;
}

/**
 * Takes one of `turns` turns named by `prefix` in the lock directory `dir`, waiting up to waitMs for one, and lets it
 * go after holdMs or at exit, whichever comes first (or the kernel does, if the process is killed). How long it waited
 * in ms, or -1 when it went on without a turn (or already held one).
 */
static long long takeTurn(const char *dir, const char *prefix, int turns, int waitMs, int holdMs) {
  static int exitHookSet = 0;
  if (__atomic_load_n(&heldTurn, __ATOMIC_ACQUIRE) >= 0) return -1;
  long long started = nowMs();
  int fd = waitForTurn(dir, prefix, turns, started + waitMs);
  if (fd < 0) return -1;
  if (!exitHookSet) exitHookSet = atexit(giveBackTurn) == 0;
  __atomic_store_n(&heldTurn, fd, __ATOMIC_RELEASE);
  if (!startThread(giveBackLater, (void *)(intptr_t)holdMs)) {
    // Without the thread the turn would be held to the end of the call: better none at all.
    giveBackTurn();
    return -1;
  }
  return nowMs() - started;
}

/**
 * The number of turns, from LATCH_TURNS (`set`, or NULL) and the usable CPUs: LATCH_TURNS when it is a number (0: none
 * taken), else the CPUs plus one; never more than MAX_TURNS either way.
 */
static int turnCountOf(const char *set, long cpus) {
  if (set && *set && strspn(set, "0123456789") == strlen(set)) {
    // More than 9 digits is more than MAX_TURNS, and would overflow atoi.
    int asked = strlen(set) > 9 ? MAX_TURNS : atoi(set);
    return asked < MAX_TURNS ? asked : MAX_TURNS;
  }
  if (cpus < 1) cpus = 1;
  return cpus < MAX_TURNS - 1 ? (int)cpus + 1 : MAX_TURNS;
}

static int turnCount(void) {
  cpu_set_t cpus;
  return turnCountOf(getenv("LATCH_TURNS"), sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1);
}

/**
 * Runs when the loader maps this file into the single executable, before Node starts: a call of one of TURN_OPS takes a
 * turn, and says so to latch's code in LATCH_TURN ("<turns> <ms waited>", or "<turns> none" when it went on without
 * one), which the call reads into its log line and removes (src/protocol/driver.ts). Any other process (an admin
 * command, a node that loads the helper by path) is left alone, but for an inherited LATCH_TURN, which is removed.
 */
__attribute__((constructor)) static void takeTurnAtStart(int argc, char **argv) {
  if (getenv("LATCH_TURN")) unsetenv("LATCH_TURN");
  if (argc < 2 || !argv[1]) return;
  int gated = 0;
  for (const char *const *op = TURN_OPS; *op && !gated; op++) gated = strcmp(argv[1], *op) == 0;
  int turns = gated ? turnCount() : 0;
  if (turns == 0) return;
  long long waited = takeTurn(LOCK_DIR, TURN_PREFIX, turns, TURN_WAIT_MS, TURN_HOLD_MS);
  char fact[64];
  if (waited < 0) snprintf(fact, sizeof fact, "%d none", turns);
  else snprintf(fact, sizeof fact, "%d %lld", turns, waited);
  setenv("LATCH_TURN", fact, 1);
}

/**
 * takeTurn(dir, prefix, turns, waitMs, holdMs) -> ms waited, or -1 when it went on without a turn: what a driver call
 * does before Node starts (takeTurnAtStart, in LOCK_DIR), for tests, on names of their own.
 */
static napi_value TakeTurn(napi_env env, napi_callback_info info) {
  size_t argc = 5;
  napi_value args[5];
  char dir[PATH_MAX], prefix[64];
  int32_t turns, waitMs, holdMs;
  if (napi_get_cb_info(env, info, &argc, args, NULL, NULL) != napi_ok || argc != 5 ||
      !stringArgument(env, args[0], dir, sizeof dir) || dir[0] != '/' ||
      !stringArgument(env, args[1], prefix, sizeof prefix) || !plainName(prefix) ||
      napi_get_value_int32(env, args[2], &turns) != napi_ok || turns < 1 || turns > MAX_TURNS ||
      napi_get_value_int32(env, args[3], &waitMs) != napi_ok || waitMs < 0 ||
      napi_get_value_int32(env, args[4], &holdMs) != napi_ok || holdMs < 0) {
    napi_throw_type_error(env, NULL, "takeTurn(dir, prefix, turns 1-256, waitMs, holdMs)");
    return NULL;
  }
  napi_value result;
  napi_create_int64(env, takeTurn(dir, prefix, turns, waitMs, holdMs), &result);
  return result;
}

/** turnCount(LATCH_TURNS or null, usable CPUs) -> the number of turns a call would take one of: for tests. */
static napi_value TurnCount(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value args[2];
  char set[32];
  double cpus;
  napi_valuetype type;
  if (napi_get_cb_info(env, info, &argc, args, NULL, NULL) != napi_ok || argc != 2 || napi_typeof(env, args[0], &type) != napi_ok ||
      (type != napi_null && !stringArgument(env, args[0], set, sizeof set)) || napi_get_value_double(env, args[1], &cpus) != napi_ok ||
      !(cpus >= 0 && cpus <= 1e9)) {
    napi_throw_type_error(env, NULL, "turnCount(LATCH_TURNS or null, cpus)");
    return NULL;
  }
  napi_value result;
  napi_create_int32(env, turnCountOf(type == napi_null ? NULL : set, (long)cpus), &result);
  return result;
}

NAPI_MODULE_INIT() {
  napi_value function;
  napi_create_function(env, "spawn", NAPI_AUTO_LENGTH, Spawn, NULL, &function);
  napi_set_named_property(env, exports, "spawn", function);
  napi_create_function(env, "reap", NAPI_AUTO_LENGTH, Reap, NULL, &function);
  napi_set_named_property(env, exports, "reap", function);
  napi_create_function(env, "lockFile", NAPI_AUTO_LENGTH, LockFile, NULL, &function);
  napi_set_named_property(env, exports, "lockFile", function);
  napi_create_function(env, "takeTurn", NAPI_AUTO_LENGTH, TakeTurn, NULL, &function);
  napi_set_named_property(env, exports, "takeTurn", function);
  napi_create_function(env, "turnCount", NAPI_AUTO_LENGTH, TurnCount, NULL, &function);
  napi_set_named_property(env, exports, "turnCount", function);
  return exports;
}
