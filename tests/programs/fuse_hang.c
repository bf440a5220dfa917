/* A file system that never answers a read: what any user can mount with fusermount3
 * (no privilege needed), here mounted by root for uid/gid UID GID alone (no allow_other),
 * as fusermount3 would mount it for that user. It holds one file, `page` (16 KiB): opening
 * it works, reading its contents waits forever. Spoken over /dev/fuse directly (no libfuse).
 * Usage: fuse_hang MOUNTPOINT UID GID READY (READY is created once mounted; with
 * FUSE_HANG_ASKED=FILE, FILE at the first read asked). */
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

static unsigned uid, gid;

static void reply(int fd, uint64_t unique, int error, const void *body, size_t len) {
    char buf[sizeof(struct fuse_out_header) + 256];
    struct fuse_out_header *h = (struct fuse_out_header *)buf;
    h->len = sizeof *h + (error ? 0 : len);
    h->error = error;
    h->unique = unique;
    if (!error && len)
        memcpy(buf + sizeof *h, body, len);
    if (write(fd, buf, h->len) < 0 && errno != ENOENT)
        perror("fuse_hang: reply");
}

static void attr_of(uint64_t node, struct fuse_attr *a) {
    memset(a, 0, sizeof *a);
    a->ino = node;
    a->nlink = 1;
    a->uid = uid;
    a->gid = gid;
    a->blksize = 4096;
    if (node == FUSE_ROOT_ID) {
        a->mode = S_IFDIR | 0755;
    } else {
        a->mode = S_IFREG | 0444;
        a->size = 4 * 4096;
        a->blocks = 32;
    }
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: fuse_hang MOUNTPOINT UID GID READY\n");
        return 2;
    }
    uid = (unsigned)atoi(argv[2]);
    gid = (unsigned)atoi(argv[3]);
    int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        perror("fuse_hang: /dev/fuse");
        return 1;
    }
    char opts[128];
    snprintf(opts, sizeof opts, "fd=%d,rootmode=40000,user_id=%u,group_id=%u", fd, uid, gid);
    if (mount("commtap-hang", argv[1], "fuse", MS_NOSUID | MS_NODEV, opts) != 0) {
        perror("fuse_hang: mount");
        return 1;
    }
    static char req[(1 << 20) + 4096];
    int ready = 0;
    for (;;) {
        ssize_t n = read(fd, req, sizeof req);
        if (n < 0) {
            if (errno == ENOENT || errno == EINTR || errno == EAGAIN)
                continue;
            if (errno == ENODEV)
                return 0; /* unmounted */
            perror("fuse_hang: read");
            return 1;
        }
        struct fuse_in_header *in = (struct fuse_in_header *)req;
        void *arg = req + sizeof *in;
        switch (in->opcode) {
        case FUSE_INIT: {
            struct fuse_init_in *i = arg;
            struct fuse_init_out o;
            memset(&o, 0, sizeof o);
            o.major = FUSE_KERNEL_VERSION;
            o.minor = FUSE_KERNEL_MINOR_VERSION;
            o.max_readahead = i->max_readahead;
            o.max_write = 4096;
            o.max_background = 16;
            o.congestion_threshold = 12;
            reply(fd, in->unique, 0, &o, sizeof o);
            if (!ready) {
                ready = 1;
                int r = open(argv[4], O_CREAT | O_WRONLY, 0644);
                if (r >= 0)
                    close(r);
            }
            break;
        }
        case FUSE_LOOKUP: {
            if (in->nodeid != FUSE_ROOT_ID || strcmp((char *)arg, "page") != 0) {
                reply(fd, in->unique, -ENOENT, NULL, 0);
                break;
            }
            struct fuse_entry_out e;
            memset(&e, 0, sizeof e);
            e.nodeid = 2;
            e.generation = 1;
            e.entry_valid = 3600;
            e.attr_valid = 3600;
            attr_of(2, &e.attr);
            reply(fd, in->unique, 0, &e, sizeof e);
            break;
        }
        case FUSE_GETATTR: {
            struct fuse_attr_out a;
            memset(&a, 0, sizeof a);
            a.attr_valid = 3600;
            attr_of(in->nodeid, &a.attr);
            reply(fd, in->unique, 0, &a, sizeof a);
            break;
        }
        case FUSE_OPEN:
        case FUSE_OPENDIR: {
            struct fuse_open_out o;
            memset(&o, 0, sizeof o);
            o.fh = 1;
            reply(fd, in->unique, 0, &o, sizeof o);
            break;
        }
        case FUSE_READ: { /* never answered: whoever faults a page of `page` in waits */
            const char *asked = getenv("FUSE_HANG_ASKED");
            int a = asked ? open(asked, O_CREAT | O_WRONLY, 0644) : -1;
            if (a >= 0)
                close(a);
            break;
        }
        case FUSE_INTERRUPT: /* nor is the wait given up */
        case FUSE_FORGET:
        case FUSE_BATCH_FORGET:
            break;
        case FUSE_FLUSH:
        case FUSE_RELEASE:
        case FUSE_RELEASEDIR:
            reply(fd, in->unique, 0, NULL, 0);
            break;
        case FUSE_DESTROY:
            reply(fd, in->unique, 0, NULL, 0);
            return 0;
        default:
            reply(fd, in->unique, -ENOSYS, NULL, 0);
        }
    }
}
