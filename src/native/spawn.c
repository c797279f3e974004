// Starting and reaping a child for src/sys/run/spawn.ts (helper.c exports spawn and reap).
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

#define _GNU_SOURCE
#include "helper.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

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
napi_value Spawn(napi_env env, napi_callback_info info) {
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
napi_value Reap(napi_env env, napi_callback_info info) {
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
