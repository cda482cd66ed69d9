/* fork() with a device open, as Python's multiprocessing and test
 * harnesses do: a child that opens the device gets a context of its own
 * (the parent's engine, whose progress thread stayed in the parent, is
 * not used), runs traffic on it and exits; the parent's context keeps
 * working, and the child's exit (which runs the library's exit hooks)
 * leaves the parent's share of the device alone: a later child does not
 * get the parent's slot (its QP numbers would be the parent's). */
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "pair.h"

/* QPN bits that name a process's slot on a shared device. */
#define SLOT(qpn) ((qpn) >> 18)

/* An RDMA WRITE between two QPs of `ctx`, checked byte for byte; returns
 * the first QP's number. */
static uint32_t write_round(struct ibv_context *ctx, const char *who)
{
	union ibv_gid gid;
	REQUIRE(!ibv_query_gid(ctx, 1, 0, &gid), "%s: gid", who);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	REQUIRE(pd && cq, "%s: pd, cq", who);
	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	struct ibv_qp *a = ibv_create_qp(pd, &ia), *b = ibv_create_qp(pd, &ia);
	REQUIRE(a && b, "%s: qps", who);
	connect_pair(a, b, &gid);
	static char src[4096], dst[4096];
	for (int i = 0; i < 4096; i++)
		src[i] = (char)(i * 7 + getpid());
	memset(dst, 0, sizeof dst);
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	struct ibv_mr *ms = ibv_reg_mr(pd, src, sizeof src, access);
	struct ibv_mr *md = ibv_reg_mr(pd, dst, sizeof dst, access);
	REQUIRE(ms && md, "%s: mrs", who);
	struct ibv_sge sge = {.addr = (uintptr_t)src, .length = sizeof src, .lkey = ms->lkey};
	struct ibv_send_wr wr = {
		.wr_id = 7,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE,
		.wr.rdma = {.remote_addr = (uintptr_t)dst, .rkey = md->rkey},
	}, *bad;
	REQUIRE(!ibv_post_send(a, &wr, &bad), "%s: post", who);
	struct ibv_wc wc;
	REQUIRE(poll_basic(cq, &wc) == 1, "%s: a completion", who);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 7, "%s: status %d", who, wc.status);
	CHECK(!memcmp(src, dst, sizeof src), "%s: the bytes written", who);
	uint32_t qpn = a->qp_num;
	CHECK(!ibv_dereg_mr(ms) && !ibv_dereg_mr(md), "%s: dereg", who);
	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b), "%s: destroy qps", who);
	CHECK(!ibv_destroy_cq(cq) && !ibv_dealloc_pd(pd), "%s: destroy cq, pd", who);
	return qpn;
}

/* Forks a child that opens `dev`, runs a round, reports its QP number's
 * slot through a pipe and ends with exit() (the library's exit hooks
 * run) or _exit(); returns that slot. */
static uint32_t child_round(struct ibv_device *dev, int use_exit)
{
	int p[2];
	REQUIRE(!pipe(p), "pipe");
	pid_t pid = fork();
	REQUIRE(pid >= 0, "fork");
	if (pid == 0) {
		close(p[0]);
		struct ibv_context *ctx = ibv_open_device(dev);
		REQUIRE(ctx, "child: open the device");
		uint32_t slot = SLOT(write_round(ctx, "child"));
		CHECK(!ibv_close_device(ctx), "child: close");
		REQUIRE(write(p[1], &slot, sizeof slot) == sizeof slot, "child: report");
		if (use_exit)
			exit(failures ? 1 : 0);
		_exit(failures ? 1 : 0);
	}
	close(p[1]);
	uint32_t slot = UINT32_MAX;
	CHECK(read(p[0], &slot, sizeof slot) == sizeof slot, "the child's report");
	close(p[0]);
	int status;
	REQUIRE(waitpid(pid, &status, 0) == pid, "wait");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's status %#x", status);
	return slot;
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	REQUIRE(list && list[0], "a device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	REQUIRE(ctx, "open");
	uint32_t mine = SLOT(write_round(ctx, "parent"));
	for (int round = 0; round < 3; round++) {
		uint32_t theirs = child_round(list[0], round != 1);
		CHECK(theirs != mine, "round %d: the child got the parent's slot %u", round, mine);
		/* The parent's context, after a child ended. */
		CHECK(SLOT(write_round(ctx, "parent again")) == mine, "round %d: parent's slot", round);
	}
	CHECK(!ibv_close_device(ctx), "close");
	ibv_free_device_list(list);
	if (failures)
		return 1;
	printf("all checks passed\n");
	return 0;
}
