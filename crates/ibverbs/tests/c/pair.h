/* Two RC QPs of one device connected to each other, and a plain poll:
 * what the C API tests (api.c, fork.c) share. Include after check.h. */
#ifndef UROCE_PAIR_H
#define UROCE_PAIR_H

#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>

static int poll_basic(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (int spin = 0; spin < 20000000; spin++) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n)
			return n;
	}
	return 0;
}

/* Brings `qp` to RTS towards QP `dest` of the device at `gid`, with the
 * attributes the kernel's table asks of a QP that sends requests
 * (`requester`: retry counts, READ/atomic credits) and of one that
 * receives them (`responder`: its READ/atomic resources, RNR timer): both
 * for RC, one for either side of XRC. */
__attribute__((unused)) static void connect_qp(struct ibv_qp *qp, uint32_t dest,
					       union ibv_gid *gid, int requester, int responder)
{
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC,
	};
	REQUIRE(!ibv_modify_qp(qp, &attr,
			       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
		"INIT");
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_RTR;
	attr.path_mtu = IBV_MTU_1024;
	attr.dest_qp_num = dest;
	attr.rq_psn = 100;
	attr.max_dest_rd_atomic = 4;
	attr.min_rnr_timer = 12;
	attr.ah_attr.is_global = 1;
	attr.ah_attr.grh.dgid = *gid;
	attr.ah_attr.grh.hop_limit = 64;
	attr.ah_attr.port_num = 1;
	int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	if (responder)
		rtr |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	REQUIRE(!ibv_modify_qp(qp, &attr, rtr), "RTR");
	attr.qp_state = IBV_QPS_RTS;
	attr.timeout = 14;
	attr.retry_cnt = 7;
	attr.rnr_retry = 7;
	attr.sq_psn = 100;
	attr.max_rd_atomic = 4;
	int rts = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN;
	if (requester)
		rts |= IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	REQUIRE(!ibv_modify_qp(qp, &attr, rts), "RTS");
	REQUIRE(qp->state == IBV_QPS_RTS, "qp->state kept current");
}

__attribute__((unused)) static void connect_pair(struct ibv_qp *a, struct ibv_qp *b,
						 union ibv_gid *gid)
{
	connect_qp(a, b->qp_num, gid, 1, 1);
	connect_qp(b, a->qp_num, gid, 1, 1);
}

#endif
