/* The metadata ops of a timed phase (stat, open, close) run as one compiled program: one
 * call from Python for a rank's whole pass, each op stamped in C immediately before and
 * after it. Python, between every op, costs 2-3 us a pair of an open and a close, and at
 * two ranks a core it doubled a libcephfs pair that takes 6 us in C: the storage's
 * latency, not the interpreter's, is what a rank should time (stampede/oploop.py says how
 * it is loaded, stampede/run/metadata_loop.py what the program is).
 *
 * Plain C, no Python API: loaded with ctypes, so the call releases the GIL and the
 * libcephfs watchdog thread keeps looking (at `progress`: the step in progress, since when).
 * Stamps are CLOCK_MONOTONIC nanoseconds, the clock of Python's time.perf_counter_ns. */
#define _GNU_SOURCE
#define _FILE_OFFSET_BITS 64   /* as Python's os.stat and os.open: files past 2 GiB anywhere */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { OP_STAT = 0, OP_OPEN = 1, OP_CLOSE = 2 };
enum { KIND_POSIX = 0, KIND_CEPHFS = 1 };
#define SKIPPED INT64_MIN   /* a close of a handle whose open failed: no op, no sample */

/* How to make each call (stampede.oploop.Calls says the same fields). */
struct calls {
    int32_t kind;
    int32_t open_flags;
    uint32_t stat_want;     /* libcephfs: ceph_statx's want mask */
    uint32_t stat_flags;    /* libcephfs: ceph_statx's flags */
    void *context;          /* libcephfs: the mount (struct ceph_mount_info *) */
    void *open_fn, *close_fn, *stat_fn;   /* libcephfs: ceph_open, ceph_close, ceph_statx */
};

typedef int (*ceph_open_fn)(void *, const char *, int, uint32_t);
typedef int (*ceph_close_fn)(void *, int);
typedef int (*ceph_statx_fn)(void *, const char *, void *, unsigned int, unsigned int);

static int64_t now_ns(void) {
    struct timespec at;
    clock_gettime(CLOCK_MONOTONIC, &at);
    return (int64_t)at.tv_sec * 1000000000LL + at.tv_nsec;
}

/* One call: a handle, 0 (stat, close) or -errno. */
static int64_t call(const struct calls *calls, int32_t op, const char *path, int64_t handle) {
    /* what a stat fills: struct stat or struct ceph_statx, both well under this */
    union { struct stat posix; char ceph[512]; } found;
    int code;
    if (calls->kind == KIND_CEPHFS) {
        if (op == OP_STAT)
            return ((ceph_statx_fn)calls->stat_fn)(calls->context, path, &found,
                                                   calls->stat_want, calls->stat_flags);
        if (op == OP_OPEN)
            return ((ceph_open_fn)calls->open_fn)(calls->context, path, calls->open_flags, 0);
        return ((ceph_close_fn)calls->close_fn)(calls->context, (int)handle);
    }
    /* a signal's EINTR is retried, as Python's os.stat and os.open retry it (PEP 475);
     * a close is not (Linux frees the descriptor whatever close returns) */
    if (op == OP_STAT)
        do code = stat(path, &found.posix); while (code < 0 && errno == EINTR);
    else if (op == OP_OPEN)
        do code = open(path, calls->open_flags); while (code < 0 && errno == EINTR);
    else
        code = close((int)handle);
    return code < 0 ? -(int64_t)errno : code;
}

/* Run steps [0, count): step i is (op, path index, handle slot) at steps[3i..3i+2]; an
 * open keeps its handle in handles[slot] (-1 where it failed), a close takes it back.
 * Each step's stamps go to stamps[2i], stamps[2i+1], its result (a handle, 0, -errno or
 * SKIPPED) to results[i]. A stat or an open that succeeded and stopped after deadline_ns
 * ends the run after it, *late set to 1 (as the Python loops raise after such an op, the
 * last one included). Returns the number of steps run. */
int64_t stampede_run_steps(const struct calls *calls, const char *const *paths,
                           const int32_t *steps, int64_t count, int64_t *handles,
                           int64_t deadline_ns, int64_t *stamps, int64_t *results,
                           volatile int64_t *progress, int64_t *late) {
    *late = 0;
    for (int64_t i = 0; i < count; i++) {
        int32_t op = steps[3 * i], slot = steps[3 * i + 2];
        const char *path = paths[steps[3 * i + 1]];
        if (op == OP_CLOSE && handles[slot] < 0) {
            results[i] = SKIPPED;
            stamps[2 * i] = stamps[2 * i + 1] = 0;
            continue;
        }
        int64_t start = now_ns();
        progress[1] = start;
        progress[0] = i;
        int64_t result = call(calls, op, path, op == OP_CLOSE ? handles[slot] : -1);
        int64_t stop = now_ns();
        progress[0] = -1;
        stamps[2 * i] = start;
        stamps[2 * i + 1] = stop;
        results[i] = result;
        if (op == OP_OPEN)
            handles[slot] = result;
        else if (op == OP_CLOSE)
            handles[slot] = -1;
        if (op != OP_CLOSE && result >= 0 && stop > deadline_ns) {
            *late = 1;
            return i + 1;
        }
    }
    return count;
}
