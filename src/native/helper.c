// latch's native helper, for what Node does not do, or does at a cost every driver call pays: starting a child
// (spawn, reap; spawn.c, for src/sys/run/spawn.ts), holding a host-wide lock (lockFile; lock.c, for src/sys/lock.ts),
// and waiting for a turn before Node starts (takeTurnAtStart; turns.c). This file is the Node-API module that exports
// them, and the small helpers they share (helper.h).
//
// Built by build.mjs into the self-contained build's runtime directory, which its RPATH names; it uses only Node-API
// (ABI-stable), so one build serves every Node that can run latch.

#define _GNU_SOURCE
#include "helper.h"
#include <limits.h>
#include <stdio.h>
#include <string.h>

void throwErrno(napi_env env, const char *what, int err) {
  const char *name = strerrorname_np(err);
  char message[PATH_MAX + 512];
  snprintf(message, sizeof message, "%s: %s", what, strerror(err));
  napi_throw_error(env, name ? name : "EUNKNOWN", message);
}

int stringArgument(napi_env env, napi_value value, char *out, size_t size) {
  size_t length;
  if (napi_get_value_string_utf8(env, value, NULL, 0, &length) != napi_ok || length == 0 || length >= size) return 0;
  napi_get_value_string_utf8(env, value, out, size, &length);
  return strlen(out) == length;
}

int plainName(const char *name) {
  return name[0] != '.' && !strchr(name, '/');
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
