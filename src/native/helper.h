// The native helper's parts, and what they share: helper.c (the module, and the small helpers below), spawn.c
// (starting and reaping a child), lock.c (host-wide locks), turns.c (a driver call's turn before Node starts).
#ifndef LATCH_HELPER_H
#define LATCH_HELPER_H

#include <node_api.h>
#include <stddef.h>

/** Where latch's locks and turns are. Under /var/lib/latch, which the agent's container shares with the host. */
#define LOCK_DIR "/var/lib/latch/locks"

/** Throws an Error whose code is the errno's name (ENOENT, ...), as Node's own errors have. */
void throwErrno(napi_env env, const char *what, int err);
/** A JS string argument into `out` (of `size` bytes): 1 when it is one of 1 to size-1 bytes, else 0. */
int stringArgument(napi_env env, napi_value value, char *out, size_t size);
/** A lock file's or turn prefix's name: no slash, no leading dot, no NUL (stringArgument checks that). */
int plainName(const char *name);

/** The lock directory `path`, created when missing and opened, or -1 (lock.c). */
int openLockDir(const char *path, const char **refusal);
/** The file `name` in the lock directory `dir`, opened for flock, or -1 (lock.c). */
int openLockFile(int dir, const char *name);

// The functions the module exports (helper.c registers them).
napi_value Spawn(napi_env env, napi_callback_info info);
napi_value Reap(napi_env env, napi_callback_info info);
napi_value LockFile(napi_env env, napi_callback_info info);
napi_value TakeTurn(napi_env env, napi_callback_info info);
napi_value TurnCount(napi_env env, napi_callback_info info);

#endif
