/* Raw packet QPs and flow steering through the headers: two raw QPs of
 * the device on 127.0.0.1 (the loopback interface, which hands every
 * frame sent back as received); frames one sends reach the other as its
 * flow rules say (Ethernet + IPv4 + UDP specs, a better priority winning,
 * a sniffer's copy), byte for byte; a destroyed rule takes nothing; flows
 * on an RC QP are EOPNOTSUPP. Needs CAP_NET_RAW, as from the kernel. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* A completion within `ms`, or 0. */
static int poll_for(struct ibv_cq *cq, struct ibv_wc *wc, double ms)
{
	double end = now_ms() + ms;
	while (now_ms() < end) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n)
			return n;
	}
	return 0;
}

static void to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};
	REQUIRE(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT), "INIT");
	a.qp_state = IBV_QPS_RTR;
	REQUIRE(!ibv_modify_qp(qp, &a, IBV_QP_STATE), "RTR");
	a.qp_state = IBV_QPS_RTS;
	REQUIRE(!ibv_modify_qp(qp, &a, IBV_QP_STATE), "RTS");
}

/* Completions on `cq` until `qp_b` has one (the frame was handed out: a
 * rule's copy comes with it), then for a moment more: how many `qp_a`
 * and `qp_b` got. */
static void settle(struct ibv_cq *cq, uint32_t qp_a, uint32_t qp_b, int *a, int *b)
{
	struct ibv_wc wc;
	*a = *b = 0;
	double end = now_ms() + 5000;
	while (*b == 0 && now_ms() < end) {
		if (ibv_poll_cq(cq, 1, &wc) == 1) {
			*a += wc.qp_num == qp_a;
			*b += wc.qp_num == qp_b;
		}
	}
	while (poll_for(cq, &wc, 100)) {
		*a += wc.qp_num == qp_a;
		*b += wc.qp_num == qp_b;
	}
}

/* An Ethernet/IPv4/UDP frame to 10.77.0.2:dport with a payload byte. */
static size_t frame(uint8_t *f, uint16_t dport, uint8_t tag)
{
	static const uint8_t dst[6] = {0x02, 0, 0, 0, 0x77, 2}, src[6] = {0x02, 0, 0, 0, 0x77, 1};
	memset(f, 0, 64);
	memcpy(f, dst, 6);
	memcpy(f + 6, src, 6);
	f[12] = 0x08;
	f[14] = 0x45;
	f[17] = 50; /* IP total length: 20 + 8 + 22 */
	f[22] = 64;
	f[23] = 17;
	memcpy(f + 26, (uint8_t[]){10, 77, 0, 1}, 4);
	memcpy(f + 30, (uint8_t[]){10, 77, 0, 2}, 4);
	f[34] = 0x30;
	f[35] = 0x39;
	f[36] = dport >> 8;
	f[37] = dport & 0xff;
	f[39] = 30;
	f[63] = tag;
	return 64;
}

struct rule {
	struct ibv_flow_attr attr;
	struct ibv_flow_spec_eth eth;
	struct ibv_flow_spec_ipv4 ip;
	struct ibv_flow_spec_tcp_udp udp;
};

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	REQUIRE(list && list[0], "a device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	REQUIRE(ctx, "open");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	REQUIRE(pd && cq, "pd, cq");
	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RAW_PACKET,
	};
	struct ibv_qp *tx = ibv_create_qp(pd, &ia);
	if (!tx && errno == EPERM && geteuid() != 0) {
		printf("raw packet QPs need CAP_NET_RAW: all checks passed (skipped)\n");
		return 0;
	}
	struct ibv_qp *rx = ibv_create_qp(pd, &ia), *sniff = ibv_create_qp(pd, &ia);
	REQUIRE(tx && rx && sniff, "raw packet QPs");
	CHECK(tx->qp_type == IBV_QPT_RAW_PACKET, "qp_type");
	struct ibv_qp_attr bad = {.qp_state = IBV_QPS_INIT};
	CHECK(ibv_modify_qp(tx, &bad, IBV_QP_STATE) == EINVAL, "INIT needs the port");
	to_rts(tx);
	to_rts(rx);
	to_rts(sniff);
	static uint8_t out[64], in[4][128], sn[4][128];
	int acc = IBV_ACCESS_LOCAL_WRITE;
	struct ibv_mr *mo = ibv_reg_mr(pd, out, sizeof out, acc);
	struct ibv_mr *mi = ibv_reg_mr(pd, in, sizeof in, acc);
	struct ibv_mr *ms = ibv_reg_mr(pd, sn, sizeof sn, acc);
	REQUIRE(mo && mi && ms, "mrs");
	struct ibv_recv_wr *bad_r;
	for (int i = 0; i < 4; i++) {
		struct ibv_sge s = {.addr = (uintptr_t)in[i], .length = 128, .lkey = mi->lkey};
		struct ibv_recv_wr r = {.wr_id = 100 + i, .sg_list = &s, .num_sge = 1};
		REQUIRE(!ibv_post_recv(rx, &r, &bad_r), "post recv");
		struct ibv_sge s2 = {.addr = (uintptr_t)sn[i], .length = 128, .lkey = ms->lkey};
		struct ibv_recv_wr r2 = {.wr_id = 200 + i, .sg_list = &s2, .num_sge = 1};
		REQUIRE(!ibv_post_recv(sniff, &r2, &bad_r), "post recv (sniffer)");
	}
	/* The rule: our MACs' frames, IPv4 to 10.77.0.2, UDP to port 4000. */
	struct rule r = {
		.attr = {.type = IBV_FLOW_ATTR_NORMAL, .size = sizeof r, .num_of_specs = 3, .port = 1},
		.eth = {.type = IBV_FLOW_SPEC_ETH, .size = sizeof r.eth},
		.ip = {.type = IBV_FLOW_SPEC_IPV4, .size = sizeof r.ip},
		.udp = {.type = IBV_FLOW_SPEC_UDP, .size = sizeof r.udp},
	};
	memcpy(r.eth.val.dst_mac, (uint8_t[]){0x02, 0, 0, 0, 0x77, 2}, 6);
	memset(r.eth.mask.dst_mac, 0xff, 6);
	r.eth.val.ether_type = htobe16(0x0800);
	r.eth.mask.ether_type = 0xffff;
	r.ip.val.dst_ip = htobe32(0x0a4d0002);
	r.ip.mask.dst_ip = 0xffffffff;
	r.udp.val.dst_port = htobe16(4000);
	r.udp.mask.dst_port = 0xffff;
	struct ibv_flow_attr sn_attr = {.type = IBV_FLOW_ATTR_SNIFFER, .size = sizeof sn_attr, .port = 1};
	struct ibv_flow *fs = ibv_create_flow(sniff, &sn_attr);
	CHECK(fs, "a sniffer rule");
	struct ibv_flow *f = ibv_create_flow(rx, (struct ibv_flow_attr *)&r);
	REQUIRE(f, "a flow rule");
	struct ibv_wc wc;
	struct ibv_sge s = {.addr = (uintptr_t)out, .length = 64, .lkey = mo->lkey};
	struct ibv_send_wr w = {.wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
				.send_flags = IBV_SEND_SIGNALED}, *bad_w;
	/* Matching: to the rule's QP, byte for byte, and to the sniffer. */
	frame(out, 4000, 0xa1);
	REQUIRE(!ibv_post_send(tx, &w, &bad_w), "post send");
	int got_send = 0, got_rx = 0, got_sniff = 0;
	for (int i = 0; i < 3 && poll_for(cq, &wc, 2000); i++) {
		CHECK(wc.status == IBV_WC_SUCCESS, "status %d (wr %lu)", wc.status, (unsigned long)wc.wr_id);
		if (wc.qp_num == tx->qp_num)
			got_send++;
		if (wc.qp_num == rx->qp_num) {
			got_rx++;
			CHECK(wc.opcode == IBV_WC_RECV && wc.byte_len == 64 && wc.wr_id == 100 &&
				      !memcmp(in[0], out, 64),
			      "the frame as sent");
		}
		if (wc.qp_num == sniff->qp_num)
			got_sniff++;
	}
	CHECK(got_send == 1 && got_rx == 1 && got_sniff == 1, "send %d, rule %d, sniffer %d",
	      got_send, got_rx, got_sniff);
	/* Not matching (another port): the sniffer only. */
	frame(out, 4001, 0xa2);
	REQUIRE(!ibv_post_send(tx, &w, &bad_w), "post send");
	settle(cq, rx->qp_num, sniff->qp_num, &got_rx, &got_sniff);
	CHECK(got_rx == 0 && got_sniff == 1, "another port: rule %d, sniffer %d", got_rx, got_sniff);
	/* A destroyed rule takes nothing. */
	CHECK(!ibv_destroy_flow(f), "destroy flow");
	frame(out, 4000, 0xa3);
	REQUIRE(!ibv_post_send(tx, &w, &bad_w), "post send");
	settle(cq, rx->qp_num, sniff->qp_num, &got_rx, &got_sniff);
	CHECK(got_rx == 0 && got_sniff == 1, "no rule: rule %d, sniffer %d", got_rx, got_sniff);
	/* A frame shorter than an Ethernet header: a local length error. */
	s.length = 10;
	REQUIRE(!ibv_post_send(tx, &w, &bad_w), "post a runt");
	CHECK(poll_for(cq, &wc, 2000) && wc.status == IBV_WC_LOC_LEN_ERR, "runt: status %d", wc.status);
	/* A gather list with a key of no region: a local protection error,
	 * nothing read. */
	s.length = 64;
	s.lkey = mo->lkey ^ 0x5a5a00;
	REQUIRE(!ibv_post_send(tx, &w, &bad_w), "post with a bad key");
	CHECK(poll_for(cq, &wc, 2000) && wc.status == IBV_WC_LOC_PROT_ERR, "bad key: status %d",
	      wc.status);
	s.lkey = mo->lkey;
	/* RSS: two receive WQs behind an indirection table, an RSS QP
	 * hashing IPv4 addresses; eight frames from eight sources each land
	 * in one of the WQs, on the WQs' CQ. */
	struct ibv_cq *wcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_wq_init_attr wia = {.wq_type = IBV_WQT_RQ, .max_wr = 16, .max_sge = 1, .pd = pd,
				       .cq = wcq};
	struct ibv_wq *wqs[2] = {ibv_create_wq(ctx, &wia), ibv_create_wq(ctx, &wia)};
	REQUIRE(wcq && wqs[0] && wqs[1], "WQs");
	for (int i = 0; i < 2; i++) {
		struct ibv_wq_attr wa = {.attr_mask = IBV_WQ_ATTR_STATE, .wq_state = IBV_WQS_RDY};
		REQUIRE(!ibv_modify_wq(wqs[i], &wa), "WQ ready");
		for (int k = 0; k < 4; k++) {
			struct ibv_sge rs = {.addr = (uintptr_t)in[k], .length = 128, .lkey = mi->lkey};
			struct ibv_recv_wr rw = {.wr_id = 300 + i, .sg_list = &rs, .num_sge = 1};
			REQUIRE(!ibv_post_wq_recv(wqs[i], &rw, &bad_r), "post WQ recv");
		}
	}
	struct ibv_rwq_ind_table_init_attr ta = {.log_ind_tbl_size = 1, .ind_tbl = wqs};
	struct ibv_rwq_ind_table *tbl = ibv_create_rwq_ind_table(ctx, &ta);
	REQUIRE(tbl, "indirection table");
	CHECK(ibv_destroy_wq(wqs[0]) == EBUSY, "a WQ in a table");
	static uint8_t key[40] = {0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67};
	struct ibv_qp_init_attr_ex rss = {
		.qp_type = IBV_QPT_RAW_PACKET,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH,
		.pd = pd,
		.rwq_ind_tbl = tbl,
		.rx_hash_conf = {.rx_hash_function = IBV_RX_HASH_FUNC_TOEPLITZ, .rx_hash_key_len = 40,
				 .rx_hash_key = key,
				 .rx_hash_fields_mask = IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4},
	};
	struct ibv_qp *rq = ibv_create_qp_ex(ctx, &rss);
	REQUIRE(rq, "an RSS QP");
	struct ibv_flow *fr = ibv_create_flow(rq, (struct ibv_flow_attr *)&r);
	REQUIRE(fr, "a rule to the RSS QP");
	CHECK(!ibv_destroy_flow(fs), "the sniffer goes");
	fs = NULL;
	s.length = 64;
	int per_wq[2] = {0, 0};
	for (int i = 0; i < 8; i++) {
		frame(out, 4000, 0xb0 + i);
		out[29] = 10 + i; /* source 10.77.0.(10+i) */
		REQUIRE(!ibv_post_send(tx, &w, &bad_w), "post send");
		REQUIRE(poll_for(cq, &wc, 2000) && wc.status == IBV_WC_SUCCESS, "sent");
	}
	for (int i = 0; i < 8 && poll_for(wcq, &wc, 2000); i++) {
		CHECK(wc.status == IBV_WC_SUCCESS && wc.byte_len == 64, "RSS status %d", wc.status);
		per_wq[wc.qp_num == wqs[1]->wq_num] += wc.qp_num == wqs[0]->wq_num ||
							wc.qp_num == wqs[1]->wq_num;
	}
	CHECK(per_wq[0] + per_wq[1] == 8, "RSS: %d and %d of 8 frames", per_wq[0], per_wq[1]);
	CHECK(!ibv_destroy_flow(fr), "destroy the RSS rule");
	CHECK(ibv_destroy_rwq_ind_table(tbl) == EBUSY, "a table an RSS QP uses");
	CHECK(!ibv_destroy_qp(rq) && !ibv_destroy_rwq_ind_table(tbl) && !ibv_destroy_wq(wqs[0]) &&
		      !ibv_destroy_wq(wqs[1]) && !ibv_destroy_cq(wcq),
	      "destroy RSS objects");
	/* Rules steer to raw packet QPs only. */
	struct ibv_qp_init_attr rc = ia;
	rc.qp_type = IBV_QPT_RC;
	struct ibv_qp *q = ibv_create_qp(pd, &rc);
	errno = 0;
	CHECK(q && !ibv_create_flow(q, &sn_attr) && errno == EOPNOTSUPP, "a flow on an RC QP");
	CHECK(!ibv_destroy_qp(q) && !ibv_destroy_qp(tx) && !ibv_destroy_qp(rx) &&
		      !ibv_destroy_qp(sniff),
	      "destroy qps");
	CHECK(!ibv_dereg_mr(mo) && !ibv_dereg_mr(mi) && !ibv_dereg_mr(ms), "dereg");
	CHECK(!ibv_destroy_cq(cq) && !ibv_dealloc_pd(pd) && !ibv_close_device(ctx), "close");
	ibv_free_device_list(list);
	if (failures)
		return 1;
	printf("raw: all checks passed\n");
	return 0;
}
