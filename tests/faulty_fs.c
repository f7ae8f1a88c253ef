/* A FUSE file system for tests/device/test_storage_faults.py: BACKING's files under MOUNTPOINT, passed
 * through, except that reads of the byte ranges a control file names fail with EIO or come up short,
 * as a failing disk's would. The kernel sees a real file system: the firmware's mmap, pread and
 * O_DIRECT reads go through it, and its faults are the kernel's (EIO from pread, SIGBUS on a mapped
 * page), not a library's stand-in.
 *
 *   faulty_fs BACKING MOUNTPOINT CONTROL
 *
 * CONTROL is read again at every read; each line is one rule for the file named NAME:
 *   eio NAME START END    a read touching bytes [START, END) fails with EIO
 *   short NAME START      a read spanning byte START delivers only the bytes before it
 * Runs in the foreground, single-threaded, until unmounted (umount MOUNTPOINT). */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char backing[PATH_MAX];
static char control[PATH_MAX];

static void real_path(char *out, const char *path)
{
    snprintf(out, PATH_MAX, "%s%s", backing, path);
}

/* The rule for a read of [offset, offset + size) of `path`: 0 none, -EIO, or the bytes it may deliver. */
static long long rule_for(const char *path, off_t offset, size_t size)
{
    FILE *f = fopen(control, "r");
    if (f == NULL) {
        return 0;
    }
    const char *name = strrchr(path, '/') != NULL ? strrchr(path, '/') + 1 : path;
    char kind[16], file[256], line[512];
    long long a, b, result = 0;
    while (result == 0 && fgets(line, sizeof line, f) != NULL) {
        int n = sscanf(line, "%15s %255s %lld %lld", kind, file, &a, &b);
        if (n < 3 || strcmp(file, name) != 0) {
            continue;
        }
        const long long lo = (long long)offset, hi = (long long)offset + (long long)size;
        if (strcmp(kind, "eio") == 0 && n == 4 && lo < b && hi > a) {
            result = -EIO;
        } else if (strcmp(kind, "short") == 0 && lo <= a && hi > a) {
            result = a - lo + 1; /* + 1: 0 would mean no rule; the caller takes one off */
        }
    }
    fclose(f);
    return result;
}

static void *fs_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
    (void)conn;
    cfg->use_ino = 1;
    cfg->attr_timeout = 0;
    cfg->entry_timeout = 0;
    cfg->negative_timeout = 0;
    cfg->kernel_cache = 0;
    return NULL;
}

static int fs_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
    char p[PATH_MAX];
    if (fi != NULL) {
        return fstat((int)fi->fh, st) == 0 ? 0 : -errno;
    }
    real_path(p, path);
    return lstat(p, st) == 0 ? 0 : -errno;
}

static int fs_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t offset, struct fuse_file_info *fi,
                      enum fuse_readdir_flags flags)
{
    (void)offset;
    (void)fi;
    (void)flags;
    char p[PATH_MAX];
    real_path(p, path);
    DIR *d = opendir(p);
    if (d == NULL) {
        return -errno;
    }
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        fill(buf, e->d_name, NULL, 0, 0);
    }
    closedir(d);
    return 0;
}

static int fs_open(const char *path, struct fuse_file_info *fi)
{
    char p[PATH_MAX];
    real_path(p, path);
    int fd = open(p, fi->flags & ~(O_DIRECT | O_CREAT | O_EXCL));
    if (fd < 0) {
        return -errno;
    }
    fi->fh = (uint64_t)fd;
    return 0;
}

static int fs_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
    char p[PATH_MAX];
    real_path(p, path);
    int fd = open(p, (fi->flags & ~O_DIRECT) | O_CREAT, mode);
    if (fd < 0) {
        return -errno;
    }
    fi->fh = (uint64_t)fd;
    return 0;
}

static int fs_read(const char *path, char *buf, size_t size, off_t offset, struct fuse_file_info *fi)
{
    long long rule = rule_for(path, offset, size);
    if (rule < 0) {
        return (int)rule;
    }
    if (rule > 0) {
        size = (size_t)(rule - 1);
    }
    ssize_t n = pread((int)fi->fh, buf, size, offset);
    return n < 0 ? -errno : (int)n;
}

static int fs_write(const char *path, const char *buf, size_t size, off_t offset, struct fuse_file_info *fi)
{
    (void)path;
    ssize_t n = pwrite((int)fi->fh, buf, size, offset);
    return n < 0 ? -errno : (int)n;
}

static int fs_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
    char p[PATH_MAX];
    if (fi != NULL) {
        return ftruncate((int)fi->fh, size) == 0 ? 0 : -errno;
    }
    real_path(p, path);
    return truncate(p, size) == 0 ? 0 : -errno;
}

static int fs_rename(const char *from, const char *to, unsigned int flags)
{
    if (flags != 0) {
        return -EINVAL;
    }
    char a[PATH_MAX], b[PATH_MAX];
    real_path(a, from);
    real_path(b, to);
    return rename(a, b) == 0 ? 0 : -errno;
}

static int fs_unlink(const char *path)
{
    char p[PATH_MAX];
    real_path(p, path);
    return unlink(p) == 0 ? 0 : -errno;
}

static int fs_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
    char p[PATH_MAX];
    if (fi != NULL) {
        return futimens((int)fi->fh, tv) == 0 ? 0 : -errno;
    }
    real_path(p, path);
    return utimensat(AT_FDCWD, p, tv, 0) == 0 ? 0 : -errno;
}

static int fs_release(const char *path, struct fuse_file_info *fi)
{
    (void)path;
    close((int)fi->fh);
    return 0;
}

static const struct fuse_operations ops = {
    .init = fs_init,
    .getattr = fs_getattr,
    .readdir = fs_readdir,
    .open = fs_open,
    .create = fs_create,
    .read = fs_read,
    .write = fs_write,
    .truncate = fs_truncate,
    .rename = fs_rename,
    .unlink = fs_unlink,
    .utimens = fs_utimens,
    .release = fs_release,
};

int main(int argc, char **argv)
{
    if (argc != 4 || realpath(argv[1], backing) == NULL || realpath(argv[3], control) == NULL) {
        fprintf(stderr, "usage: faulty_fs BACKING MOUNTPOINT CONTROL (BACKING and CONTROL must exist)\n");
        return 2;
    }
    char *fuse_argv[] = {argv[0], "-f", "-s", argv[2], NULL};
    return fuse_main(4, fuse_argv, &ops, NULL);
}
