// A driver call's turn on the host, taken before Node starts (helper.c exports takeTurn and turnCount, for tests).
//
// Taking turns: the single executable names this file as a library it needs (build.mjs), so the loader maps it and
// runs its constructor before Node starts. A driver call that does a volume's work waits there for one of a few turns
// on the host, before it pays for Node's start-up: see takeTurnAtStart below.

#define _GNU_SOURCE
#include "helper.h"
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

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

/**
 * The ops that take a turn: those that do a volume's work. init, getvolumename and isattached only read the ledger, and
 * expandvolume answers Not supported. test/unit/turn-ops.test.ts checks this list against the op table
 * (src/protocol/ops.ts), so that a new op is put on one side or the other.
 */
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
napi_value TakeTurn(napi_env env, napi_callback_info info) {
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
napi_value TurnCount(napi_env env, napi_callback_info info) {
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
