// Host-wide locks for src/sys/lock.ts (helper.c exports lockFile).
//
// Holding a lock: a host-wide lock is the flock(2) of a file in a directory only root may write (src/sys/lock.ts), a
// call Node does not have: here it is a few system calls, where without the helper a child (util-linux's flock) takes it.
//
// Locks and turns are files in one directory that only root may write (LOCK_DIR), held with flock(2): the kernel
// releases a flock when the last descriptor of its open file goes, however the holder ends (SIGKILL too), and nothing
// outside that directory can open the files, let alone hold them. They used to be abstract unix socket names, which
// have no permissions: any local user could bind them, and so stall every call of a volume, or keep the agent from
// starting. The files are left in place (unlinking a flock's file races with its next taker); they are empty, one per
// volume and image the node has seen, and the turns.

#define _GNU_SOURCE
#include "helper.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/**
 * The directory `path`, created (mode 0700, its missing parents 0755) when missing, opened: a descriptor, or -1 with
 * errno set, and *refusal set when it is there but not to be trusted: a symbolic link, not a directory, owned by
 * another user than root or this process's, or writable by its group or others. Whoever could write it could hold
 * every lock in it.
 */
int openLockDir(const char *path, const char **refusal) {
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
int openLockFile(int dir, const char *name) {
  return openat(dir, name, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, 0600);
}

/**
 * lockFile(dir, name) -> a descriptor holding an exclusive flock on the file `name` in the lock directory `dir` (see
 * openLockDir), or -1 when another holder has it. Never waits: src/sys/lock.ts tries again until its deadline. The
 * lock is released when the descriptor is closed or the process ends, however it ends.
 */
napi_value LockFile(napi_env env, napi_callback_info info) {
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
