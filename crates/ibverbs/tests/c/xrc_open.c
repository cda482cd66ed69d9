/* ibv_open_qp across processes: a parent creates an XRC target QP in a
 * domain it shares through a file; a child process of the same device
 * opens it by number, brings it up with ibv_modify_qp through its own
 * handle, and owns the XRC SRQ the parent's initiator sends to through
 * that target QP, and the memory the parent's WRITE, READ and atomic
 * reach through it. The parent's handle sees the child's changes, the QP
 * outlives the parent's handle while the child's lives (the parent's
 * domain cannot be closed meanwhile), and goes with the child's: the
 * parent cannot open it again. */
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "pair.h"

struct side {
	struct ibv_context *ctx;
	struct ibv_xrcd *xrcd;
	union ibv_gid gid;
};

static struct side open_side(const char *path, int create, const char *who)
{
	struct side s;
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	REQUIRE(list && n > 0, "%s: a device", who);
	s.ctx = ibv_open_device(list[0]);
	REQUIRE(s.ctx, "%s: open", who);
	ibv_free_device_list(list);
	REQUIRE(!ibv_query_gid(s.ctx, 1, 0, &s.gid), "%s: gid", who);
	int fd = open(path, O_RDWR | O_CREAT, 0600);
	REQUIRE(fd >= 0, "%s: domain file", who);
	struct ibv_xrcd_init_attr xa = {
		.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
		.fd = fd,
		.oflags = create ? O_CREAT : 0,
	};
	s.xrcd = ibv_open_xrcd(s.ctx, &xa);
	REQUIRE(s.xrcd, "%s: ibv_open_xrcd", who);
	close(fd);
	return s;
}

static void put(int fd, uint32_t v)
{
	REQUIRE(write(fd, &v, sizeof v) == sizeof v, "pipe write");
}

static uint32_t get(int fd)
{
	uint32_t v = 0;
	REQUIRE(read(fd, &v, sizeof v) == sizeof v, "pipe read");
	return v;
}

/* The child: opens the parent's target QP, brings it up, owns the SRQ. */
static int child(const char *path, int rd, int wr)
{
	/* The parent made the domain (O_CREAT) before it says so. */
	uint32_t tgt = get(rd), ini = get(rd);
	struct side s = open_side(path, 0, "child");
	struct ibv_qp_open_attr oa = {
		.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD |
			     IBV_QP_OPEN_ATTR_TYPE,
		.qp_num = tgt + 1,
		.xrcd = s.xrcd,
		.qp_type = IBV_QPT_XRC_RECV,
	};
	CHECK(!ibv_open_qp(s.ctx, &oa) && errno == EINVAL, "no target QP of that number");
	oa.qp_num = tgt;
	struct ibv_qp *qp = ibv_open_qp(s.ctx, &oa);
	REQUIRE(qp && qp->qp_num == tgt, "child: ibv_open_qp of the parent's target QP");
	connect_qp(qp, ini, &s.gid, 0, 1);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	REQUIRE(!ibv_query_qp(qp, &qa, IBV_QP_STATE | IBV_QP_DEST_QPN, &qi), "child: query");
	CHECK(qa.qp_state == IBV_QPS_RTS && qa.dest_qp_num == ini, "child: state %d dest %#x",
	      qa.qp_state, qa.dest_qp_num);
	struct ibv_qp_attr bad = {.qp_state = IBV_QPS_RTR};
	CHECK(ibv_modify_qp(qp, &bad, IBV_QP_STATE) == EINVAL, "RTS to RTR refused by the creator");

	struct ibv_pd *pd = ibv_alloc_pd(s.ctx);
	struct ibv_cq *cq = ibv_create_cq(s.ctx, 16, NULL, NULL, 0);
	REQUIRE(pd && cq, "child: pd, cq");
	struct ibv_srq_init_attr_ex sa = {
		.attr = {.max_wr = 8, .max_sge = 1},
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD |
			     IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_PD,
		.srq_type = IBV_SRQT_XRC,
		.xrcd = s.xrcd,
		.cq = cq,
		.pd = pd,
	};
	struct ibv_srq *srq = ibv_create_srq_ex(s.ctx, &sa);
	REQUIRE(srq, "child: XRC SRQ");
	static char buf[2][64];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr, "child: mr");
	for (int i = 0; i < 2; i++) {
		struct ibv_sge sge = {.addr = (uintptr_t)buf[i], .length = 64, .lkey = mr->lkey};
		struct ibv_recv_wr rw = {.wr_id = 10 + i, .sg_list = &sge, .num_sge = 1}, *bad_rw;
		REQUIRE(!ibv_post_srq_recv(srq, &rw, &bad_rw), "child: post");
	}
	uint32_t srqn;
	REQUIRE(!ibv_get_srq_num(srq, &srqn), "child: srq num");
	put(wr, srqn);
	/* Memory the parent reaches through the target QP (the SRQ's PD). */
	static uint64_t remote[8] = {40};
	int rights = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
		     IBV_ACCESS_REMOTE_ATOMIC;
	struct ibv_mr *rmr = ibv_reg_mr(pd, remote, sizeof remote, rights);
	REQUIRE(rmr, "child: remote mr");
	put(wr, (uint32_t)(uintptr_t)remote);
	put(wr, (uint32_t)((uint64_t)(uintptr_t)remote >> 32));
	put(wr, rmr->rkey);

	for (int i = 0; i < 2; i++) {
		struct ibv_wc wc;
		REQUIRE(poll_basic(cq, &wc) == 1, "child: message %d", i);
		CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)(10 + i) &&
			      wc.qp_num == tgt && wc.byte_len == 6,
		      "child: status %d wr_id %lu qp %#x len %u", wc.status,
		      (unsigned long)wc.wr_id, wc.qp_num, wc.byte_len);
		CHECK(!memcmp(buf[i], i ? "second" : "first!", 6), "child: bytes");
		if (i == 0) {
			/* The parent destroys its handle: this one keeps the QP. */
			put(wr, 1);
			REQUIRE(get(rd) == 2, "parent's handle gone");
			REQUIRE(!ibv_query_qp(qp, &qa, IBV_QP_STATE, &qi), "child: query after");
			CHECK(qa.qp_state == IBV_QPS_RTS, "child: kept, state %d", qa.qp_state);
			put(wr, 3);
		}
	}
	/* The parent's WRITE, READ and FETCH_ADD through the target QP ran
	 * here, in this process's memory. */
	REQUIRE(get(rd) == 5, "parent's accesses done");
	CHECK(remote[0] == 42, "child: fetch-and-add: %lu", (unsigned long)remote[0]);
	CHECK(!memcmp(&remote[1], "written across!!", 16), "child: written bytes");
	CHECK(!ibv_destroy_qp(qp), "child: the last handle");
	put(wr, 4);
	ibv_dereg_mr(rmr);
	ibv_destroy_srq(srq);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_xrcd(s.xrcd);
	ibv_close_device(s.ctx);
	return failures ? 1 : 0;
}

static void send_one(struct ibv_qp *ini, struct ibv_cq *cq, struct ibv_mr *mr, uint32_t srqn,
		     const char *msg)
{
	memcpy(mr->addr, msg, 6);
	struct ibv_sge sge = {.addr = (uintptr_t)mr->addr, .length = 6, .lkey = mr->lkey};
	struct ibv_send_wr wr = {
		.wr_id = 1,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
		.qp_type.xrc.remote_srqn = srqn,
	}, *bad;
	REQUIRE(!ibv_post_send(ini, &wr, &bad), "parent: post");
	struct ibv_wc wc;
	REQUIRE(poll_basic(cq, &wc) == 1, "parent: a completion");
	CHECK(wc.status == IBV_WC_SUCCESS, "parent: send status %d", wc.status);
}

int main(void)
{
	char path[64];
	snprintf(path, sizeof path, "/tmp/uroce-xrc-open-%d", (int)getpid());
	int down[2], up[2];
	REQUIRE(!pipe(down) && !pipe(up), "pipes");
	pid_t pid = fork();
	REQUIRE(pid >= 0, "fork");
	if (pid == 0) {
		close(down[1]);
		close(up[0]);
		_exit(child(path, down[0], up[1]));
	}
	close(down[0]);
	close(up[1]);
	int rd = up[0], wr = down[1];

	struct side s = open_side(path, 1, "parent");
	struct ibv_qp_init_attr_ex ta = {
		.qp_type = IBV_QPT_XRC_RECV,
		.comp_mask = IBV_QP_INIT_ATTR_XRCD,
		.xrcd = s.xrcd,
	};
	struct ibv_qp *tgt = ibv_create_qp_ex(s.ctx, &ta);
	REQUIRE(tgt, "parent: target QP");
	struct ibv_pd *pd = ibv_alloc_pd(s.ctx);
	struct ibv_cq *cq = ibv_create_cq(s.ctx, 16, NULL, NULL, 0);
	REQUIRE(pd && cq, "parent: pd, cq");
	struct ibv_qp_init_attr_ex ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 4, .max_send_sge = 1},
		.qp_type = IBV_QPT_XRC_SEND,
		.sq_sig_all = 1,
		.comp_mask = IBV_QP_INIT_ATTR_PD,
		.pd = pd,
	};
	struct ibv_qp *ini = ibv_create_qp_ex(s.ctx, &ia);
	REQUIRE(ini, "parent: initiator");
	uint32_t tgt_num = tgt->qp_num;
	put(wr, tgt_num);
	put(wr, ini->qp_num);
	uint32_t srqn = get(rd);
	uint64_t raddr = get(rd);
	raddr |= (uint64_t)get(rd) << 32;
	uint32_t rkey = get(rd);

	/* The child brought the target QP up: this handle sees it. */
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	REQUIRE(!ibv_query_qp(tgt, &qa, IBV_QP_STATE | IBV_QP_DEST_QPN, &qi), "parent: query");
	CHECK(qa.qp_state == IBV_QPS_RTS && qa.dest_qp_num == ini->qp_num,
	      "parent: state %d dest %#x", qa.qp_state, qa.dest_qp_num);
	connect_qp(ini, tgt_num, &s.gid, 1, 0);
	static char src[64];
	struct ibv_mr *mr = ibv_reg_mr(pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr, "parent: mr");
	send_one(ini, cq, mr, srqn, "first!");
	REQUIRE(get(rd) == 1, "child got the first");
	CHECK(!ibv_destroy_qp(tgt), "parent: its handle");
	/* The QP, kept for the child's handle, still uses the domain. */
	CHECK(ibv_close_xrcd(s.xrcd) == EBUSY, "parent: domain in use");
	put(wr, 2);
	REQUIRE(get(rd) == 3, "child saw the QP kept");
	send_one(ini, cq, mr, srqn, "second");

	/* WRITE, READ and FETCH_ADD into the child's memory through the
	 * target QP: each is run by the child's process before it is
	 * answered. */
	static uint64_t local[8];
	struct ibv_mr *lmr = ibv_reg_mr(pd, local, sizeof local, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(lmr, "parent: local mr");
	memcpy(&local[1], "written across!!", 16);
	struct ibv_sge sge = {.addr = (uintptr_t)&local[1], .length = 16, .lkey = lmr->lkey};
	struct ibv_send_wr w = {
		.wr_id = 2,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = {.remote_addr = raddr + 8, .rkey = rkey},
		.qp_type.xrc.remote_srqn = srqn,
	}, *bad;
	struct ibv_wc wc;
	REQUIRE(!ibv_post_send(ini, &w, &bad) && poll_basic(cq, &wc) == 1, "parent: WRITE");
	CHECK(wc.status == IBV_WC_SUCCESS, "parent: WRITE status %d", wc.status);
	sge.addr = (uintptr_t)&local[4];
	w.opcode = IBV_WR_RDMA_READ;
	REQUIRE(!ibv_post_send(ini, &w, &bad) && poll_basic(cq, &wc) == 1, "parent: READ");
	CHECK(wc.status == IBV_WC_SUCCESS && !memcmp(&local[4], "written across!!", 16),
	      "parent: READ status %d", wc.status);
	sge.addr = (uintptr_t)&local[0];
	sge.length = 8;
	w.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	w.wr.atomic.remote_addr = raddr;
	w.wr.atomic.compare_add = 2;
	w.wr.atomic.rkey = rkey;
	REQUIRE(!ibv_post_send(ini, &w, &bad) && poll_basic(cq, &wc) == 1, "parent: FETCH_ADD");
	CHECK(wc.status == IBV_WC_SUCCESS && local[0] == 40, "parent: FETCH_ADD status %d, %lu",
	      wc.status, (unsigned long)local[0]);
	put(wr, 5);
	REQUIRE(get(rd) == 4, "child closed its handle");
	ibv_dereg_mr(lmr);

	/* The QP went with the child's handle: not to be opened again. */
	struct ibv_qp_open_attr oa = {
		.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD |
			     IBV_QP_OPEN_ATTR_TYPE,
		.qp_num = tgt_num,
		.xrcd = s.xrcd,
		.qp_type = IBV_QPT_XRC_RECV,
	};
	struct ibv_qp *again = NULL;
	for (int i = 0; i < 500; i++) {
		again = ibv_open_qp(s.ctx, &oa);
		if (!again)
			break;
		ibv_destroy_qp(again);
		usleep(10000);
	}
	CHECK(!again, "the QP outlived its last handle");

	int status;
	REQUIRE(waitpid(pid, &status, 0) == pid, "wait");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed (%d)", status);
	ibv_destroy_qp(ini);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	CHECK(!ibv_close_xrcd(s.xrcd), "parent: domain free once the QP went");
	ibv_close_device(s.ctx);
	unlink(path);
	if (failures)
		return 1;
	printf("all checks passed\n");
	return 0;
}
