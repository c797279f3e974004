// latch's native helper, for what Node does not do, or does at a cost every driver call pays: starting a child
// (spawn, reap; for src/sys/run.ts), holding a host-wide lock (holdName; for src/sys/lock.ts), and waiting for a
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
// Holding a lock: a host-wide lock is an abstract unix socket name that one process has bound (src/sys/lock.ts).
// Binding one through node:net loads it and its cluster support and turns the event loop, about 10 ms of a call that
// takes a volume's lock; here it is two system calls.
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
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/** Throws an Error whose code is the errno's name (ENOENT, ...), as Node's own errors have. */
static void throwErrno(napi_env env, const char *what, int err) {
  const char *name = strerrorname_np(err);
  char message[256];
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

/**
 * The abstract address "\0" + name (`length` bytes, without a NUL of its own), padded with NULs: bound by its whole
 * structure, as Node 20's node:net (libuv) binds an abstract name, since an address of any other length is another
 * name to the kernel. `length` is at most sizeof sun_path - 1.
 */
static void abstractAddress(struct sockaddr_un *address, const char *name, size_t length) {
  memset(address, 0, sizeof *address);
  address->sun_family = AF_UNIX;
  memcpy(address->sun_path + 1, name, length);
}

/**
 * holdName(name) -> a descriptor, or -1 when another process holds the name. Binds a unix socket to the abstract
 * name "\0" + name, which the kernel frees when the descriptor is closed or the process ends, however it ends. The
 * name is the same address Node 20's node:net binds for the path "\0" + name, so both exclude each other.
 */
static napi_value HoldName(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value arg;
  struct sockaddr_un address;
  size_t length;
  if (napi_get_cb_info(env, info, &argc, &arg, NULL, NULL) != napi_ok || argc != 1 ||
      napi_get_value_string_utf8(env, arg, NULL, 0, &length) != napi_ok || length == 0 ||
      length >= sizeof address.sun_path - 1) {
    napi_throw_type_error(env, NULL, "holdName(name): a name of 1 to 106 bytes");
    return NULL;
  }
  char name[sizeof address.sun_path];
  napi_get_value_string_utf8(env, arg, name, sizeof name, &length);
  abstractAddress(&address, name, length);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    throwErrno(env, "socket", errno);
    return NULL;
  }
  if (bind(fd, (struct sockaddr *)&address, sizeof address) != 0) {
    int err = errno;
    close(fd);
    if (err != EADDRINUSE) {
      throwErrno(env, "bind", err);
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
// A turn is an abstract unix socket name "latch-turn-N", bound and listening: the kernel frees it when its holder
// ends, however it ends. A waiter connects to every held turn and sleeps in poll(2); its connections wait in the
// holders' listen queues, in order. A holder that is done (at exit, or at its hold limit) hands its listening socket
// itself to the first waiter in its queue (SCM_RIGHTS), which then holds the turn, name and queue alike: each turn
// passes to one waiter, in the order they came, and wakes nobody else. A holder that dies without handing over
// (SIGKILL) closes the socket, which resets every connection queued on it: those waiters try again from the start.
//
// The waiting is bounded both ways, so that a turn can only delay a call, never fail or wedge it: a holder hands its
// turn on after TURN_HOLD_MS even while it still runs (a call that waits on a device or the network need not hold the
// others up), and a waiter that got none within TURN_WAIT_MS goes on without one.

#define TURN_PREFIX "latch-turn"
#define TURN_HOLD_MS 1000
#define TURN_WAIT_MS 10000
#define MAX_TURNS 256

/** The ops that take a turn: those that do a volume's work. init, getvolumename and isattached only read the ledger. */
static const char *const TURN_OPS[] = {"attach", "detach", "waitforattach", "mountdevice", "unmountdevice",
                                       "mount", "unmount", "expandfs", NULL};

/** The listening socket of the turn this process holds, or -1: a process holds one turn at most. */
static int heldTurn = -1;

static long long nowMs(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/** The abstract address of turn `index`: "\0" + prefix + "-" + index. */
static void turnAddress(struct sockaddr_un *address, const char *prefix, int index) {
  char name[sizeof address->sun_path - 1];
  int length = snprintf(name, sizeof name, "%s-%d", prefix, index);
  abstractAddress(address, name, length < (int)sizeof name ? (size_t)length : sizeof name - 1);
}

/** The listening socket a holder handed over on `connection`, close-on-exec here; -1 when none came (yet). */
static int receiveTurn(int connection) {
  char byte;
  struct iovec data = {.iov_base = &byte, .iov_len = 1};
  union {
    struct cmsghdr header;
    char space[CMSG_SPACE(sizeof(int))];
  } control;
  struct msghdr message = {.msg_iov = &data, .msg_iovlen = 1, .msg_control = control.space,
                           .msg_controllen = sizeof control.space};
  if (recvmsg(connection, &message, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) <= 0) return -1;
  struct cmsghdr *header = CMSG_FIRSTHDR(&message);
  if (!header || header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) return -1;
  int fd;
  memcpy(&fd, CMSG_DATA(header), sizeof fd);
  return fd;
}

/**
 * Hands the turn `turn` (its listening socket) to the first waiter in its queue that is still there, or frees it when
 * nobody waits.
 */
static void handOver(int turn) {
  for (;;) {
    int waiter = accept4(turn, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (waiter < 0) break;  // nobody waits (EAGAIN), or an error: the name is freed below
    char byte = 0;
    struct iovec data = {.iov_base = &byte, .iov_len = 1};
    union {
      struct cmsghdr header;
      char space[CMSG_SPACE(sizeof(int))];
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr message = {.msg_iov = &data, .msg_iovlen = 1, .msg_control = control.space,
                             .msg_controllen = sizeof control.space};
    struct cmsghdr *header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(header), &turn, sizeof turn);
    ssize_t sent = sendmsg(waiter, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    close(waiter);
    if (sent == 1) break;  // handed over: the waiter holds it now
    // That waiter is gone (it gave up, was killed, or got another turn first): the next one.
  }
  close(turn);
}

/**
 * The listening socket of one of the turns prefix-0 .. prefix-(turns-1): a free name bound here, or a held one handed
 * over by its holder; -1 when none came by `deadline` (nowMs()), or on an error. A waiter waits in the queue of every
 * turn, so that it is served by whichever turn comes to it first; a second turn that reaches it at the same time is
 * handed on at once. A signal's handler that interrupts the wait does not end it.
 */
static int waitForTurn(const char *prefix, int turns, long long deadline) {
  int connections[MAX_TURNS];
  struct pollfd polled[MAX_TURNS];
  for (;;) {
    struct sockaddr_un address;
    for (int i = 0; i < turns; i++) {
      int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) return -1;
      turnAddress(&address, prefix, i);
      if (bind(fd, (struct sockaddr *)&address, sizeof address) == 0 && listen(fd, SOMAXCONN) == 0) return fd;
      close(fd);
    }
    if (deadline - nowMs() <= 0) return -1;
    int n = 0, queued = 1;
    while (queued && n < turns) {
      int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) break;
      turnAddress(&address, prefix, n);
      queued = connect(fd, (struct sockaddr *)&address, sizeof address) == 0;
      if (queued) connections[n++] = fd;
      else close(fd);
    }
    int turn = -1, again = n < turns;
    if (again) {
      // A turn that took no connection: its holder is between bind and listen, or just gone (its name free now), or
      // its queue is full. Look again shortly.
      struct timespec pause = {0, 1000000};
      nanosleep(&pause, NULL);
    }
    while (turn < 0 && !again) {
      for (int i = 0; i < n; i++) polled[i] = (struct pollfd){.fd = connections[i], .events = POLLIN};
      long long left = deadline - nowMs();
      if (left > 0) poll(polled, n, left > 60000 ? 60000 : (int)left);
      // Also at the deadline: a turn handed over just then is taken, not dropped with the connection.
      for (int i = 0; i < n; i++) {
        int got = receiveTurn(connections[i]);
        if (got >= 0 && turn < 0) turn = got;
        else if (got >= 0) handOver(got);
        // Reset: that turn's holder ended without handing it over. Its name is free: try again from the start.
        else if (polled[i].revents & (POLLIN | POLLHUP | POLLERR)) again = 1;
      }
      if (turn < 0 && left <= 0) {
        for (int i = 0; i < n; i++) close(connections[i]);
        return -1;
      }
    }
    for (int i = 0; i < n; i++) close(connections[i]);
    if (turn >= 0) return turn;
  }
}

/** Hands on the turn this process holds; once, from the hold limit's thread or at exit, whichever comes first. */
static void giveBackTurn(void) {
  int turn = __atomic_exchange_n(&heldTurn, -1, __ATOMIC_ACQ_REL);
  if (turn >= 0) handOver(turn);
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
 * Takes one of `turns` turns named by `prefix`, waiting up to waitMs for one, and hands it on after holdMs or at exit,
 * whichever comes first (or lets the kernel free it, if the process is killed). How long it waited in ms, or -1 when it
 * went on without a turn (or already held one).
 */
static long long takeTurn(const char *prefix, int turns, int waitMs, int holdMs) {
  static int exitHookSet = 0;
  if (__atomic_load_n(&heldTurn, __ATOMIC_ACQUIRE) >= 0) return -1;
  long long started = nowMs();
  int fd = waitForTurn(prefix, turns, started + waitMs);
  if (fd < 0) return -1;
  if (!exitHookSet) exitHookSet = atexit(giveBackTurn) == 0;
  __atomic_store_n(&heldTurn, fd, __ATOMIC_RELEASE);
  pthread_attr_t attributes;
  pthread_t thread;
  int made = pthread_attr_init(&attributes) == 0;
  if (made) {
    pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attributes, 64 * 1024);
    // Every signal blocked in the thread, so that Node's handlers run on its own threads only.
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    made = pthread_create(&thread, &attributes, giveBackLater, (void *)(intptr_t)holdMs) == 0;
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    pthread_attr_destroy(&attributes);
  }
  if (!made) {
    // Without the thread the turn would be held to the end of the call: better none at all.
    giveBackTurn();
    return -1;
  }
  return nowMs() - started;
}

/** The number of turns: LATCH_TURNS when it is a number from 0 (none taken) to 256, else the usable CPUs plus one. */
static int turnCount(void) {
  const char *set = getenv("LATCH_TURNS");
  if (set && *set && strlen(set) <= 3 && strspn(set, "0123456789") == strlen(set) && atoi(set) <= MAX_TURNS)
    return atoi(set);
  cpu_set_t cpus;
  int count = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  return (count > 0 ? count : 1) + 1;
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
  long long waited = takeTurn(TURN_PREFIX, turns, TURN_WAIT_MS, TURN_HOLD_MS);
  char fact[64];
  if (waited < 0) snprintf(fact, sizeof fact, "%d none", turns);
  else snprintf(fact, sizeof fact, "%d %lld", turns, waited);
  setenv("LATCH_TURN", fact, 1);
}

/**
 * takeTurn(prefix, turns, waitMs, holdMs) -> ms waited, or -1 when it went on without a turn: what a driver call does
 * before Node starts (takeTurnAtStart), for tests, on names of their own.
 */
static napi_value TakeTurn(napi_env env, napi_callback_info info) {
  size_t argc = 4;
  napi_value args[4];
  char prefix[64];
  size_t length;
  int32_t turns, waitMs, holdMs;
  if (napi_get_cb_info(env, info, &argc, args, NULL, NULL) != napi_ok || argc != 4 ||
      napi_get_value_string_utf8(env, args[0], prefix, sizeof prefix, &length) != napi_ok || length == 0 ||
      length >= sizeof prefix - 1 || napi_get_value_int32(env, args[1], &turns) != napi_ok || turns < 1 ||
      turns > MAX_TURNS || napi_get_value_int32(env, args[2], &waitMs) != napi_ok || waitMs < 0 ||
      napi_get_value_int32(env, args[3], &holdMs) != napi_ok || holdMs < 0) {
    napi_throw_type_error(env, NULL, "takeTurn(prefix, turns 1-256, waitMs, holdMs)");
    return NULL;
  }
  napi_value result;
  napi_create_int64(env, takeTurn(prefix, turns, waitMs, holdMs), &result);
  return result;
}

NAPI_MODULE_INIT() {
  napi_value function;
  napi_create_function(env, "spawn", NAPI_AUTO_LENGTH, Spawn, NULL, &function);
  napi_set_named_property(env, exports, "spawn", function);
  napi_create_function(env, "reap", NAPI_AUTO_LENGTH, Reap, NULL, &function);
  napi_set_named_property(env, exports, "reap", function);
  napi_create_function(env, "holdName", NAPI_AUTO_LENGTH, HoldName, NULL, &function);
  napi_set_named_property(env, exports, "holdName", function);
  napi_create_function(env, "takeTurn", NAPI_AUTO_LENGTH, TakeTurn, NULL, &function);
  napi_set_named_property(env, exports, "takeTurn", function);
  return exports;
}
