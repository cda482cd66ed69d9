/* The names beyond the verbs a program usually calls, run under
 * `uroce run`: ibv_read_ibdev_sysfs_file reads the device's sysfs files
 * (printf-style path), the import family fails with EOPNOTSUPP, cmd_fd is
 * a descriptor that survives dup. */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* <infiniband/driver.h> (not installed by libibverbs-dev) declares it. */
int ibv_read_ibdev_sysfs_file(char *buf, size_t size, const char *ibdev,
                              const char *fnfmt, ...);

/* Provider libraries set this flag (rdma-core's IBVERBS_PRIVATE_34). */
extern _Bool verbs_allow_disassociate_destroy;

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "FAILED: %s (line %d, errno %d)\n", #c, __LINE__, errno); return 1; } } while (0)

int main(void) {
    CHECK(!verbs_allow_disassociate_destroy);
    verbs_allow_disassociate_destroy = 1;
    CHECK(verbs_allow_disassociate_destroy);
    char buf[64];
    int n = ibv_read_ibdev_sysfs_file(buf, sizeof buf, "uroce0", "ports/%u/gid_attrs/types/%u", 1, 0);
    CHECK(n == 7 && strcmp(buf, "RoCE v2") == 0);
    n = ibv_read_ibdev_sysfs_file(buf, sizeof buf, "uroce0", "node_type");
    CHECK(n == 5 && strcmp(buf, "1: CA") == 0);
    n = ibv_read_ibdev_sysfs_file(buf, 3, "uroce0", "node_type");
    CHECK(n == 2 && strcmp(buf, "1:") == 0);
    errno = 0;
    CHECK(ibv_read_ibdev_sysfs_file(buf, sizeof buf, "uroce0", "no_such_file") == -1 && errno == ENOENT);

    int num;
    struct ibv_device **list = ibv_get_device_list(&num);
    CHECK(list && num >= 1);
    struct ibv_context *ctx = ibv_open_device(list[0]);
    CHECK(ctx);
    /* A real cmd_fd: dup'able, naming the device's char device. */
    CHECK(ctx->cmd_fd >= 0);
    int copy = dup(ctx->cmd_fd);
    CHECK(copy >= 0 && close(copy) == 0);
    char link[64], target[128] = {0};
    snprintf(link, sizeof link, "/proc/self/fd/%d", ctx->cmd_fd);
    CHECK(readlink(link, target, sizeof target - 1) > 0);
    CHECK(strcmp(target, "/dev/infiniband/uverbs0") == 0);
    errno = 0;
    CHECK(ibv_import_device(ctx->async_fd) == NULL && errno == EOPNOTSUPP);
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd);
    /* Every context's cmd_fd here is the same file (/dev/null under the
     * device's name): the import finds its context by the open file. */
    struct ibv_context *ictx = ibv_import_device(dup(ctx->cmd_fd));
    CHECK(ictx);
    struct ibv_pd *ipd = ictx ? ibv_import_pd(ictx, pd->handle) : NULL;
    CHECK(ipd && ipd->handle == pd->handle);
    errno = 0;
    CHECK(ibv_import_mr(pd, 0) == NULL && errno == ENOENT);
    if (ipd)
        ibv_unimport_pd(ipd);
    CHECK(!ictx || ibv_close_device(ictx) == 0);
    CHECK(ibv_dealloc_pd(pd) == 0);
    CHECK(ibv_close_device(ctx) == 0);
    ibv_free_device_list(list);
    printf("all checks passed\n");
    return 0;
}
