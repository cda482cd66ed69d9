/* The libibverbs C API on uroce's drop-in library, as a C program compiled
 * against rdma-core 44's headers sees it: the header's inline verbs (which
 * call through our ops tables), the extended QP and CQ, and the errors
 * rdma-core returns for bad arguments and wrong teardown order. Run by
 * tests/c_api.rs with LD_LIBRARY_PATH pointing at uroce-lib. */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "pair.h"

/* One extended completion, waited for. */
static int poll_one(struct ibv_cq_ex *cq, uint64_t *wr_id, enum ibv_wc_opcode *op,
		    uint32_t *len, uint32_t *flags, uint32_t *imm)
{
	struct ibv_poll_cq_attr attr = {};
	int ret;
	for (int spin = 0; spin < 20000000; spin++) {
		ret = ibv_start_poll(cq, &attr);
		if (ret == ENOENT)
			continue;
		if (ret)
			return -1;
		int status = cq->status;
		*wr_id = cq->wr_id;
		*op = ibv_wc_read_opcode(cq);
		*len = ibv_wc_read_byte_len(cq);
		*flags = ibv_wc_read_wc_flags(cq);
		*imm = ibv_wc_read_imm_data(cq);
		ibv_end_poll(cq);
		return status;
	}
	return -2;
}

/* ibv_destroy_srq on another thread: it must wait for the async event. */
static volatile int srq_destroyed = -1;
static void *destroy_srq_thread(void *srq)
{
	srq_destroyed = ibv_destroy_srq(srq);
	return NULL;
}

int main(void)
{
	int num = -1;
	struct ibv_device **list = ibv_get_device_list(&num);
	REQUIRE(list && num == 1, "one device, got %d", num);
	REQUIRE(!strcmp(ibv_get_device_name(list[0]), "uroce0"), "name");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	REQUIRE(ctx, "open");
	ibv_free_device_list(list);
	/* cmd_fd is a real descriptor (pyverbs dups it). */
	int cmd_copy = dup(ctx->cmd_fd);
	CHECK(ctx->cmd_fd >= 0 && cmd_copy >= 0 && close(cmd_copy) == 0, "cmd_fd dup");

	/* Queries, through the exported functions and the inline wrappers. */
	struct ibv_device_attr_ex dx;
	REQUIRE(!ibv_query_device_ex(ctx, NULL, &dx), "query_device_ex");
	CHECK(dx.orig_attr.phys_port_cnt == 1 && dx.orig_attr.max_qp_rd_atom >= 1, "attrs");
	struct ibv_port_attr pa;
	REQUIRE(!ibv_query_port(ctx, 1, &pa), "query_port");
	CHECK(pa.state == IBV_PORT_ACTIVE && pa.link_layer == IBV_LINK_LAYER_ETHERNET, "port");
	CHECK(ibv_query_port(ctx, 2, &pa) == EINVAL, "port 2");
	union ibv_gid gid;
	REQUIRE(!ibv_query_gid(ctx, 1, 0, &gid), "gid 0");
	CHECK(gid.raw[10] == 0xff && gid.raw[11] == 0xff && gid.raw[12] == 127, "v4-mapped");
	CHECK(ibv_query_gid(ctx, 1, 5, &gid) == -1, "gid 5");
	struct ibv_gid_entry ge;
	CHECK(!ibv_query_gid_ex(ctx, 1, 0, &ge, 0) && ge.gid_type == IBV_GID_TYPE_ROCE_V2,
	      "gid_ex type %u", ge.gid_type);
	/* The interface's other address: lo pairs 127.0.0.1 with ::1. */
	static const uint8_t loop6[16] = {[15] = 1};
	CHECK(!ibv_query_gid_ex(ctx, 1, 1, &ge, 0) && !memcmp(ge.gid.raw, loop6, 16) &&
		      ge.gid_index == 1 && ge.ndev_ifindex == 1,
	      "gid_ex 1 (::1 on lo)");
	CHECK(ibv_query_gid_ex(ctx, 1, 2, &ge, 0) == EINVAL, "gid_ex 2");
	struct ibv_gid_entry table[4];
	CHECK(ibv_query_gid_table(ctx, table, 4, 0) == 2 && table[1].gid_index == 1, "gid table");
	CHECK(ibv_query_gid_table(ctx, table, 1, 0) < 0, "gid table too small");
	uint16_t pkey;
	CHECK(!ibv_query_pkey(ctx, 1, 0, &pkey) && pkey == 0xffff, "pkey");

	/* Rate conversions (the enum is not in rate order). */
	CHECK(ibv_rate_to_mbps(IBV_RATE_40_GBPS) == 40000, "40G");
	CHECK(ibv_rate_to_mbps(IBV_RATE_100_GBPS) == 103125, "100G");
	CHECK(ibv_rate_to_mult(IBV_RATE_25_GBPS) == -1, "25G mult");
	CHECK(mult_to_ibv_rate(4) == IBV_RATE_10_GBPS, "mult 4");
	CHECK(mbps_to_ibv_rate(53125) == IBV_RATE_50_GBPS, "50G");

	/* PD and MRs: optional access bits ignored, ODP refused. */
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	REQUIRE(pd, "pd");
	size_t len = 1 << 16;
	char *buf = aligned_alloc(4096, len);
	memset(buf, 0, len);
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
		     IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_RELAXED_ORDERING;
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, access);
	REQUIRE(mr && mr->lkey && mr->addr == buf && mr->length == len, "reg_mr");
	/* Imports: a context from a dup of cmd_fd shares its file's PD, MR
	 * and DM by handle; an import's keys are the region's; any wrapper's
	 * destroy ends the object for all, an unimport only the wrapper; a
	 * descriptor of no context of ours is refused. */
	{
		struct ibv_context *ictx = ibv_import_device(dup(ctx->cmd_fd));
		REQUIRE(ictx && ictx->device == ctx->device, "import_device");
		struct ibv_pd *ipd = ibv_import_pd(ictx, pd->handle);
		REQUIRE(ipd && ipd->context == ictx && ipd->handle == pd->handle, "import_pd");
		struct ibv_mr *imr = ibv_import_mr(ipd, mr->handle);
		REQUIRE(imr && imr->lkey == mr->lkey && imr->rkey == mr->rkey && imr->addr == buf &&
				imr->length == len && imr->pd == ipd,
			"import_mr");
		errno = 0;
		CHECK(!ibv_import_pd(ictx, 0xfffffff0) && errno, "a handle nobody has");
		struct ibv_pd *other = ibv_alloc_pd(ictx);
		REQUIRE(other, "a PD of the imported context");
		/* A region of the import's, deregistered through the original's
		 * file from another wrapper. */
		struct ibv_mr *tmp = ibv_reg_mr(other, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
		REQUIRE(tmp, "a region of the imported context");
		struct ibv_mr *tmp2 = ibv_import_mr(ibv_import_pd(ctx, other->handle), tmp->handle);
		REQUIRE(tmp2 && tmp2->lkey == tmp->lkey, "imported back into the original context");
		struct ibv_pd *tmp2_pd = tmp2->pd;
		CHECK(!ibv_dereg_mr(tmp2), "dereg through the import");
		errno = 0;
		CHECK(!ibv_import_mr(other, tmp->handle), "a deregistered region is gone for all");
		CHECK(!ibv_dereg_mr(tmp), "the other wrapper is still freed");
		ibv_unimport_pd(tmp2_pd);
		CHECK(!ibv_dealloc_pd(other), "dealloc");
		struct ibv_dm *dm0 = ibv_alloc_dm(ctx, &(struct ibv_alloc_dm_attr){.length = 64});
		REQUIRE(dm0, "dm");
		struct ibv_dm *idm = ibv_import_dm(ictx, dm0->handle);
		char w[8] = "shared!", r[8] = {0};
		CHECK(idm && !ibv_memcpy_to_dm(dm0, 8, w, 8) && !ibv_memcpy_from_dm(r, idm, 8, 8) &&
			      !memcmp(w, r, 8),
		      "import_dm shares the memory");
		if (idm)
			ibv_unimport_dm(idm);
		CHECK(!ibv_free_dm(dm0), "free dm");
		ibv_unimport_mr(imr);
		ibv_unimport_pd(ipd);
		CHECK(!ibv_close_device(ictx), "close the imported context");
		int null_fd = open("/dev/null", O_RDWR);
		errno = 0;
		CHECK(!ibv_import_device(null_fd) && errno == EOPNOTSUPP,
		      "a descriptor of no context of ours");
		close(null_fd);
	}
	/* On-demand paging: explicit and implicit regions, prefetch advice. */
	CHECK(dx.odp_caps.general_caps == (IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT) &&
		      (dx.odp_caps.per_transport_caps.rc_odp_caps & IBV_ODP_SUPPORT_WRITE),
	      "odp caps");
	struct ibv_mr *odp = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	CHECK(odp && odp->addr == buf, "ODP");
	struct ibv_mr *implicit = ibv_reg_mr(pd, NULL, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	CHECK(implicit && implicit->length == SIZE_MAX, "implicit ODP");
	errno = 0;
	CHECK(!ibv_reg_mr(pd, NULL, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND) && errno == EINVAL,
	      "NULL is only implicit ODP");
	if (odp) {
		struct ibv_sge sg = {.addr = (uintptr_t)buf, .length = 4096, .lkey = odp->lkey};
		CHECK(!ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &sg, 1),
		      "advise_mr");
		sg.lkey = mr->lkey;
		CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sg, 1) == EINVAL,
		      "advise_mr on a pinned region");
		CHECK(!ibv_dereg_mr(odp), "dereg ODP");
	}
	if (implicit)
		CHECK(!ibv_dereg_mr(implicit), "dereg implicit ODP");
	errno = 0;
	CHECK(!ibv_reg_mr(pd, buf, len, IBV_ACCESS_REMOTE_WRITE) && errno == EINVAL,
	      "remote write without local write");
	/* XRC domains: FD and OFLAGS required; a file's domain is shared
	 * within the process (O_EXCL refuses a second open). */
	errno = 0;
	CHECK(!ibv_open_xrcd(ctx, &(struct ibv_xrcd_init_attr){}) && errno == EINVAL, "xrcd attrs");
	struct ibv_xrcd_init_attr xa = {.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
					.fd = -1, .oflags = O_CREAT};
	struct ibv_xrcd *xd = ibv_open_xrcd(ctx, &xa);
	CHECK(xd && xd->context == ctx, "private xrcd");
	/* ibv_open_qp: another handle to a domain's target QP; the QP lives
	 * while any handle does, and holds the domain. */
	struct ibv_qp_init_attr_ex ta = {.qp_type = IBV_QPT_XRC_RECV, .comp_mask = IBV_QP_INIT_ATTR_XRCD,
					 .xrcd = xd};
	struct ibv_qp *tgt = ibv_create_qp_ex(ctx, &ta);
	CHECK(tgt, "XRC target");
	struct ibv_qp_open_attr oa = {.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD |
						   IBV_QP_OPEN_ATTR_TYPE | IBV_QP_OPEN_ATTR_CONTEXT,
				      .qp_num = tgt ? tgt->qp_num : 0, .xrcd = xd,
				      .qp_context = &oa, .qp_type = IBV_QPT_XRC_RECV};
	errno = 0;
	oa.comp_mask |= IBV_QP_OPEN_ATTR_RESERVED;
	CHECK(!ibv_open_qp(ctx, &oa) && errno == EOPNOTSUPP, "open_qp reserved mask");
	oa.comp_mask &= ~(IBV_QP_OPEN_ATTR_RESERVED | IBV_QP_OPEN_ATTR_TYPE);
	errno = 0;
	CHECK(!ibv_open_qp(ctx, &oa) && errno == EINVAL, "open_qp without a type");
	oa.comp_mask |= IBV_QP_OPEN_ATTR_TYPE;
	oa.qp_type = IBV_QPT_RC;
	errno = 0;
	CHECK(!ibv_open_qp(ctx, &oa) && errno == EINVAL, "open_qp of an RC type");
	oa.qp_type = IBV_QPT_XRC_RECV;
	oa.qp_num ^= 0x5a5a;
	errno = 0;
	CHECK(!ibv_open_qp(ctx, &oa) && errno == EINVAL, "open_qp of a number the domain lacks");
	oa.qp_num ^= 0x5a5a;
	struct ibv_qp *opened = ibv_open_qp(ctx, &oa);
	CHECK(opened && opened->qp_num == oa.qp_num && opened->qp_type == IBV_QPT_XRC_RECV &&
		      opened->qp_context == &oa && opened->context == ctx,
	      "open_qp");
	errno = 0;
	CHECK(ibv_close_xrcd(xd) == EBUSY, "xrcd busy while a target QP is open");
	if (tgt && opened) {
		CHECK(!ibv_destroy_qp(tgt), "destroy the creator's handle");
		struct ibv_qp_attr qa = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
					 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
		CHECK(!ibv_modify_qp(opened, &qa,
				     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					     IBV_QP_ACCESS_FLAGS),
		      "the opened handle modifies the QP");
		struct ibv_qp_init_attr qi;
		CHECK(!ibv_query_qp(opened, &qa, IBV_QP_STATE, &qi) && qa.qp_state == IBV_QPS_INIT,
		      "and queries it");
		struct ibv_qp *again = ibv_open_qp(ctx, &oa);
		CHECK(again && again->state == IBV_QPS_INIT && !ibv_destroy_qp(again),
		      "open a live QP again");
		CHECK(!ibv_destroy_qp(opened), "destroy the last handle");
		errno = 0;
		CHECK(!ibv_open_qp(ctx, &oa) && errno == EINVAL, "a QP whose handles are gone");
	}
	CHECK(!ibv_close_xrcd(xd), "close the private xrcd");
	char xpath[] = "/tmp/uroce-api-xrcd-XXXXXX";
	int xfd = mkstemp(xpath);
	xa.fd = xfd;
	struct ibv_xrcd *x1 = ibv_open_xrcd(ctx, &xa);
	struct ibv_xrcd *x2 = ibv_open_xrcd(ctx, &xa);
	CHECK(x1 && x2, "a file's xrcd opened twice");
	xa.oflags = O_CREAT | O_EXCL;
	errno = 0;
	CHECK(!ibv_open_xrcd(ctx, &xa) && errno == EINVAL, "O_EXCL");
	if (x1 && x2)
		CHECK(!ibv_close_xrcd(x1) && !ibv_close_xrcd(x2), "close xrcds");
	xa.oflags = 0;
	errno = 0;
	CHECK(!ibv_open_xrcd(ctx, &xa) && errno == EAGAIN, "no O_CREAT for a new file's domain");
	close(xfd);
	unlink(xpath);

	/* ibv_rereg_mr: libibverbs' input checks (ERR_INPUT), the command's
	 * (ERR_CMD with errno), then each change: new rights or a new PD
	 * keep the keys (as rxe and mlx5), new memory gets new ones. */
	errno = 0;
	CHECK(ibv_rereg_mr(mr, 8, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
	      "rereg unknown flag");
	CHECK(ibv_rereg_mr(mr, 0, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE) == IBV_REREG_MR_ERR_INPUT,
	      "rereg access without its flag");
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, len, 0) ==
		      IBV_REREG_MR_ERR_INPUT,
	      "rereg translation without an address");
	errno = 0;
	CHECK(ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_CMD && errno == EINVAL,
	      "rereg of nothing");
	errno = 0;
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_REMOTE_WRITE) ==
			      IBV_REREG_MR_ERR_CMD &&
		      errno == EINVAL,
	      "rereg to remote write without local write");
	uint32_t key0 = mr->lkey;
	CHECK(!ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE) &&
		      mr->lkey == key0 && mr->rkey == mr->lkey,
	      "rereg access: the same keys");
	char *buf2 = aligned_alloc(4096, len / 2);
	CHECK(!ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, buf2, len / 2, 0) &&
		      mr->addr == buf2 && mr->length == len / 2 && mr->lkey != key0 &&
		      mr->rkey == mr->lkey,
	      "rereg translation: new keys");
	struct ibv_pd *other_pd = ibv_alloc_pd(ctx);
	REQUIRE(other_pd, "second pd");
	uint32_t key1 = mr->lkey;
	CHECK(!ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, other_pd, NULL, 0, 0) && mr->pd == other_pd &&
		      mr->lkey == key1,
	      "rereg pd: the same keys");
	CHECK(ibv_dealloc_pd(other_pd) == EBUSY, "the new PD holds the MR");
	CHECK(!ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_TRANSLATION |
					IBV_REREG_MR_CHANGE_ACCESS,
			    pd, buf, len, access) &&
		      mr->pd == pd && mr->addr == buf && mr->length == len,
	      "rereg everything back");
	CHECK(!ibv_dealloc_pd(other_pd), "the old PD is free again");
	free(buf2);

	/* Device memory: copies in and out, bounds, a zero-based region on
	 * it that holds it, refused without IBV_ACCESS_ZERO_BASED. */
	CHECK(dx.max_dm_size >= 4096, "max_dm_size");
	struct ibv_dm *dm = ibv_alloc_dm(ctx, &(struct ibv_alloc_dm_attr){.length = 4096});
	REQUIRE(dm && dm->context == ctx, "alloc_dm");
	errno = 0;
	CHECK(!ibv_alloc_dm(ctx, &(struct ibv_alloc_dm_attr){.length = 0}) && errno == EINVAL, "dm of 0");
	char hello[16] = "device memory!", back[16] = {0};
	CHECK(!ibv_memcpy_to_dm(dm, 100, hello, sizeof hello) &&
		      !ibv_memcpy_from_dm(back, dm, 100, sizeof back) && !memcmp(hello, back, 16),
	      "dm round trip");
	CHECK(ibv_memcpy_to_dm(dm, 4090, hello, sizeof hello) != 0, "dm copy past its end");
	errno = 0;
	CHECK(!ibv_reg_dm_mr(pd, dm, 0, 4096, IBV_ACCESS_LOCAL_WRITE) && errno == EINVAL,
	      "dm mr needs zero-based");
	struct ibv_mr *dm_mr =
		ibv_reg_dm_mr(pd, dm, 1024, 2048, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED);
	CHECK(dm_mr && dm_mr->length == 2048 && dm_mr->addr == NULL, "reg_dm_mr");
	CHECK(!ibv_reg_dm_mr(pd, dm, 3000, 2048, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED),
	      "dm mr past its end");
	CHECK(ibv_rereg_mr(dm_mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT,
	      "no rereg of a dm region");
	CHECK(ibv_free_dm(dm) == EBUSY, "dm held by its region");
	CHECK(!ibv_dereg_mr(dm_mr) && !ibv_free_dm(dm), "free dm");

	/* Thread and parent domains: a parent domain stands for its PD
	 * (regions and CQs on it), holds its PD and thread domain. */
	struct ibv_td *td = ibv_alloc_td(ctx, &(struct ibv_td_init_attr){});
	REQUIRE(td && td->context == ctx, "alloc_td");
	struct ibv_parent_domain_init_attr pda = {.pd = pd, .td = td};
	struct ibv_pd *parent = ibv_alloc_parent_domain(ctx, &pda);
	REQUIRE(parent && parent->context == ctx, "alloc_parent_domain");
	errno = 0;
	CHECK(!ibv_alloc_parent_domain(ctx, &(struct ibv_parent_domain_init_attr){.pd = parent}) &&
		      errno == EINVAL,
	      "no parent domain of a parent domain");
	CHECK(ibv_dealloc_td(td) == EBUSY, "the parent domain holds its td");
	struct ibv_mr *pmr = ibv_reg_mr(parent, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(pmr != NULL, "mr on a parent domain");
	struct ibv_cq_init_attr_ex pcx = {
		.cqe = 8, .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD, .parent_domain = parent};
	struct ibv_cq_ex *pcq = ibv_create_cq_ex(ctx, &pcx);
	CHECK(pcq != NULL, "cq on a parent domain");
	pcx.parent_domain = pd;
	errno = 0;
	CHECK(!ibv_create_cq_ex(ctx, &pcx) && errno == EINVAL, "cq with a plain pd as parent domain");
	CHECK(ibv_dealloc_pd(parent) == EBUSY, "parent domain in use");
	if (pcq)
		CHECK(!ibv_destroy_cq(ibv_cq_ex_to_cq(pcq)), "destroy parent-domain cq");
	if (pmr)
		CHECK(!ibv_dereg_mr(pmr), "dereg parent-domain mr");
	CHECK(!ibv_dealloc_pd(parent) && !ibv_dealloc_td(td), "dealloc parent domain and td");

	/* CQs: a basic one on a channel, and an extended one. */
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	REQUIRE(ch && ch->fd >= 0, "channel");
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, (void *)0x1234, ch, 0);
	REQUIRE(cq && cq->cqe >= 64, "cq");
	CHECK(!ibv_resize_cq(cq, 256) && cq->cqe == 256, "resize cq up");
	CHECK(!ibv_resize_cq(cq, 64) && cq->cqe == 64, "resize cq down");
	CHECK(ibv_resize_cq(cq, 0) == EINVAL && cq->cqe == 64, "resize cq to 0");
	struct ibv_modify_cq_attr mod = {.attr_mask = IBV_CQ_ATTR_MODERATE,
					 .moderate = {.cq_count = 4, .cq_period = 100}};
	CHECK(!ibv_modify_cq(cq, &mod), "cq moderation");
	mod.attr_mask = IBV_CQ_ATTR_RESERVED;
	CHECK(ibv_modify_cq(cq, &mod) == EINVAL, "cq moderation mask");
	mod = (struct ibv_modify_cq_attr){.attr_mask = IBV_CQ_ATTR_MODERATE,
					  .moderate = {.cq_count = 1, .cq_period = 0}};
	CHECK(!ibv_modify_cq(cq, &mod), "cq moderation off");
	errno = 0;
	CHECK(!ibv_create_cq(ctx, 0, NULL, NULL, 0) && errno == EINVAL, "cqe 0");
	errno = 0;
	CHECK(!ibv_create_cq(ctx, 4, NULL, NULL, 7) && errno == EINVAL, "comp_vector 7");
	struct ibv_cq_init_attr_ex cx = {
		.cqe = 64,
		.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM,
	};
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &cx);
	REQUIRE(cqx, "cq_ex");
	/* Completion timestamps: a 1 GHz device clock, every bit counting,
	 * read by ibv_query_rt_values_ex; CVLAN stripping is not there. */
	cx.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
	struct ibv_cq_ex *cq_ts = ibv_create_cq_ex(ctx, &cx);
	CHECK(cq_ts != NULL, "timestamp cq");
	CHECK(!ibv_query_device_ex(ctx, NULL, &dx) && dx.completion_timestamp_mask == UINT64_MAX &&
		      dx.hca_core_clock == 1000000,
	      "timestamp caps");
	struct ibv_values_ex v1 = {.comp_mask = IBV_VALUES_MASK_RAW_CLOCK}, v2 = v1;
	CHECK(!ibv_query_rt_values_ex(ctx, &v1) && !ibv_query_rt_values_ex(ctx, &v2) &&
		      (v2.raw_clock.tv_sec > v1.raw_clock.tv_sec ||
		       (v2.raw_clock.tv_sec == v1.raw_clock.tv_sec &&
			v2.raw_clock.tv_nsec > v1.raw_clock.tv_nsec)),
	      "raw clock runs");
	struct ibv_values_ex bad_mask = {.comp_mask = IBV_VALUES_MASK_RESERVED};
	CHECK(ibv_query_rt_values_ex(ctx, &bad_mask) == EINVAL, "raw clock mask");
	if (cq_ts)
		CHECK(!ibv_destroy_cq(ibv_cq_ex_to_cq(cq_ts)), "destroy timestamp cq");
	cx.wc_flags = IBV_WC_EX_WITH_CVLAN;
	errno = 0;
	CHECK(!ibv_create_cq_ex(ctx, &cx) && errno == EOPNOTSUPP, "cvlan");

	/* QPs: bad types, then an extended pair. */
	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = 99,
	};
	errno = 0;
	CHECK(!ibv_create_qp(pd, &ia) && errno == EINVAL, "qp type 99");
	ia.qp_type = IBV_QPT_XRC_SEND;
	struct ibv_qp *xs = ibv_create_qp(pd, &ia);
	CHECK(xs && xs->qp_type == IBV_QPT_XRC_SEND && !ibv_destroy_qp(xs), "XRC initiator");
	ia.qp_type = IBV_QPT_XRC_RECV;
	errno = 0;
	CHECK(!ibv_create_qp(pd, &ia) && errno == EINVAL, "XRC target needs a domain");
	ia.qp_type = IBV_QPT_RC;
	errno = 0;
	CHECK(!ibv_create_qp(pd, NULL) && errno == EINVAL, "NULL attr");

	struct ibv_qp_init_attr_ex qx = {
		.send_cq = ibv_cq_ex_to_cq(cqx),
		.recv_cq = ibv_cq_ex_to_cq(cqx),
		.cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2,
			.max_recv_sge = 2, .max_inline_data = 64},
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND_WITH_IMM |
				  IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
				  IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_WRITE,
	};
	struct ibv_qp *a = ibv_create_qp_ex(ctx, &qx);
	struct ibv_qp *b = ibv_create_qp_ex(ctx, &qx);
	REQUIRE(a && b && a->qp_num != b->qp_num, "create_qp_ex");
	CHECK(qx.cap.max_inline_data >= 64, "inline granted");
	{
		/* No inline asked: the SGEs' room is granted (16 bytes each), as
		 * rxe grants it; rdma_xclient sends 16 inline bytes that way. */
		struct ibv_qp_init_attr ia = {
			.send_cq = ibv_cq_ex_to_cq(cqx), .recv_cq = ibv_cq_ex_to_cq(cqx),
			.cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
				.max_recv_sge = 1},
			.qp_type = IBV_QPT_RC,
		};
		struct ibv_qp *q = ibv_create_qp(pd, &ia);
		REQUIRE(q, "create_qp without inline");
		CHECK(ia.cap.max_inline_data == 16, "inline granted %u", ia.cap.max_inline_data);
		ibv_destroy_qp(q);
	}
	struct ibv_qp_ex *ax = ibv_qp_to_qp_ex(a);
	REQUIRE(ax, "qp_to_qp_ex");
	struct ibv_qp *plain = ibv_create_qp(pd, &ia);
	REQUIRE(plain, "plain qp");
	CHECK(!ibv_qp_to_qp_ex(plain), "no qp_ex without send ops");

	/* Wrong transitions and posts before RTS. */
	struct ibv_qp_attr bad = {.qp_state = IBV_QPS_RTS};
	CHECK(ibv_modify_qp(plain, &bad, IBV_QP_STATE) == EINVAL, "RESET->RTS");
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey};
	struct ibv_send_wr swr = {.wr_id = 9, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr *bad_wr = NULL;
	CHECK(ibv_post_send(plain, &swr, &bad_wr) == EINVAL && bad_wr == &swr, "post in RESET");
	swr.opcode = 77;
	bad_wr = NULL;
	CHECK(ibv_post_send(plain, &swr, &bad_wr) == EINVAL && bad_wr == &swr, "bad opcode");

	/* Teardown order: busy parents refuse. */
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "PD with MR");
	CHECK(ibv_destroy_cq(cq) == EBUSY, "CQ with QP");
	CHECK(ibv_destroy_comp_channel(ch) == EBUSY, "channel with CQ");
	CHECK(!ibv_destroy_qp(plain), "destroy plain");
	CHECK(ibv_destroy_qp(plain) == EINVAL, "double destroy");

	union ibv_gid self;
	REQUIRE(!ibv_query_gid(ctx, 1, 0, &self), "gid");
	connect_pair(a, b, &self);

	/* b receives into the second half of buf. */
	char *rbuf = buf + 32768;
	struct ibv_sge rsge = {.addr = (uintptr_t)rbuf, .length = 4096, .lkey = mr->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 77, .sg_list = &rsge, .num_sge = 1};
	struct ibv_recv_wr *bad_rwr;
	REQUIRE(!ibv_post_recv(b, &rwr, &bad_rwr), "post_recv");

	/* One batch: a WRITE from an SGE, then a SEND with immediate, inline. */
	memcpy(buf, "written by ibv_wr_rdma_write", 29);
	ibv_wr_start(ax);
	ax->wr_id = 1;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(ax, mr->rkey, (uintptr_t)(buf + 16384));
	ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)buf, 29);
	ax->wr_id = 2;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(ax, htobe32(0xabcdef01));
	ibv_wr_set_inline_data(ax, "inline!", 8);
	REQUIRE(!ibv_wr_complete(ax), "wr_complete");

	uint64_t id;
	enum ibv_wc_opcode op;
	uint32_t blen, flags, imm;
	int seen_send = 0, seen_write = 0, seen_recv = 0;
	for (int i = 0; i < 3; i++) {
		int st = poll_one(cqx, &id, &op, &blen, &flags, &imm);
		REQUIRE(st == IBV_WC_SUCCESS, "completion %d status %d", i, st);
		if (id == 1 && op == IBV_WC_RDMA_WRITE)
			seen_write = 1;
		else if (id == 2 && op == IBV_WC_SEND)
			seen_send = 1;
		else if (id == 77 && op == IBV_WC_RECV) {
			seen_recv = 1;
			CHECK(blen == 8 && (flags & IBV_WC_WITH_IMM) && imm == htobe32(0xabcdef01),
			      "recv len %u flags %x imm %x", blen, flags, imm);
		}
	}
	CHECK(seen_write && seen_send && seen_recv, "all three completions");
	CHECK(!strcmp(buf + 16384, "written by ibv_wr_rdma_write"), "WRITE landed");
	CHECK(!strcmp(rbuf, "inline!"), "inline SEND landed");

	/* IBV_SEND_INLINE through ibv_post_send from unregistered memory with
	 * no L_Key (man ibv_post_send: the L_Key is not checked), two SGEs. */
	{
		char part1[] = "unregistered ", part2[] = "inline WRITE";
		struct ibv_sge isge[2] = {
			{.addr = (uintptr_t)part1, .length = 13, .lkey = 0},
			{.addr = (uintptr_t)part2, .length = sizeof part2, .lkey = 0xdeadbeef},
		};
		struct ibv_send_wr iwr = {.wr_id = 3, .sg_list = isge, .num_sge = 2,
					  .opcode = IBV_WR_RDMA_WRITE,
					  .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE};
		iwr.wr.rdma.remote_addr = (uintptr_t)(buf + 20480);
		iwr.wr.rdma.rkey = mr->rkey;
		struct ibv_send_wr *ibad = NULL;
		CHECK(!ibv_post_send(a, &iwr, &ibad), "inline post without an L_Key");
		struct ibv_send_wr aw = iwr;
		aw.opcode = IBV_WR_ATOMIC_WRITE;
		CHECK(ibv_post_send(a, &aw, &ibad) == EINVAL && ibad == &aw,
		      "ATOMIC WRITE needs the ibv_wr_* API");
		int st = poll_one(cqx, &id, &op, &blen, &flags, &imm);
		CHECK(st == IBV_WC_SUCCESS && id == 3, "inline WRITE status %d id %lu", st,
		      (unsigned long)id);
		CHECK(!strcmp(buf + 20480, "unregistered inline WRITE"), "inline WRITE landed");
	}

	/* READ, FETCH_ADD and CMP_SWP in one batch. */
	uint64_t *counter = (uint64_t *)(buf + 8192);
	*counter = 41;
	ibv_wr_start(ax);
	ax->wr_id = 3;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(ax, mr->rkey, (uintptr_t)(buf + 16384));
	ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)(buf + 20000), 29);
	ax->wr_id = 4;
	ibv_wr_atomic_fetch_add(ax, mr->rkey, (uintptr_t)counter, 1);
	ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)(buf + 24576), 8);
	ax->wr_id = 5;
	ibv_wr_atomic_cmp_swp(ax, mr->rkey, (uintptr_t)counter, 42, 1000);
	ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)(buf + 24584), 8);
	REQUIRE(!ibv_wr_complete(ax), "wr_complete 2");
	for (int i = 0; i < 3; i++) {
		int st = poll_one(cqx, &id, &op, &blen, &flags, &imm);
		CHECK(st == IBV_WC_SUCCESS && id == (uint64_t)(3 + i), "completion %lu status %d",
		      (unsigned long)id, st);
	}
	CHECK(!strcmp(buf + 20000, "written by ibv_wr_rdma_write"), "READ");
	CHECK(*(uint64_t *)(buf + 24576) == 41, "fetch_add old value");
	CHECK(*(uint64_t *)(buf + 24584) == 42, "cmp_swp old value");
	CHECK(*counter == 1000, "counter %lu", (unsigned long)*counter);

	/* ATOMIC WRITE (IBA 1.5): 8 bytes stored at once, completed with
	 * IBV_WC_ATOMIC_WRITE and 8 bytes; a misaligned one is refused by the
	 * responder (REM_INV_REQ) and ends the QP, so it comes last below. */
	uint64_t value = 0x1122334455667788ULL;
	ibv_wr_start(ax);
	ax->wr_id = 6;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(ax, mr->rkey, (uintptr_t)counter, &value);
	REQUIRE(!ibv_wr_complete(ax), "wr_complete atomic write");
	{
		int st = poll_one(cqx, &id, &op, &blen, &flags, &imm);
		CHECK(st == IBV_WC_SUCCESS && id == 6 && op == IBV_WC_ATOMIC_WRITE && blen == 8,
		      "atomic write status %d op %d len %u", st, op, blen);
		CHECK(*counter == value, "atomic write stored %lx", (unsigned long)*counter);
	}

	/* A batch with an error is refused whole. */
	char big[128] = {0};
	ibv_wr_start(ax);
	ax->wr_id = 6;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(ax, 0);
	ibv_wr_set_inline_data(ax, big, sizeof big);
	CHECK(ibv_wr_complete(ax) == EINVAL, "inline above max_inline_data");
	ibv_wr_start(ax);
	ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)buf, 8);
	CHECK(ibv_wr_complete(ax) == EINVAL, "set_sge without a WR");
	/* A batch larger than the send queue (16) is refused whole, ENOMEM
	 * as mlx5's provider answers, and nothing of it is posted. */
	ibv_wr_start(ax);
	for (int i = 0; i < 17; i++) {
		ax->wr_id = 100 + i;
		ax->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(ax, mr->rkey, (uintptr_t)(buf + 30000));
		ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)buf, 8);
	}
	CHECK(ibv_wr_complete(ax) == ENOMEM, "a batch above the queue's depth");
	usleep(20000);
	struct ibv_poll_cq_attr none_attr = {};
	int none = ibv_start_poll(cqx, &none_attr);
	if (none == 0)
		ibv_end_poll(cqx);
	CHECK(none == ENOENT, "nothing of the refused batch was posted (%d)", none);

	/* Memory windows: type 1 bound with ibv_bind_mw, type 2 with
	 * ibv_wr_bind_mw; peers reach the region only through them. */
	struct ibv_mr *wmr = ibv_reg_mr(pd, buf + 40960, 8192,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	REQUIRE(wmr, "MR for windows");
	struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	struct ibv_mw *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	REQUIRE(mw1 && mw2 && mw1->type == IBV_MW_TYPE_1, "alloc_mw");
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "PD with windows");
	memcpy(buf + 40960, "seen through window 1", 22);
	uint32_t old_rkey = mw1->rkey;
	struct ibv_mw_bind mb = {
		.wr_id = 10,
		.send_flags = IBV_SEND_SIGNALED,
		.bind_info = {.mr = wmr, .addr = (uintptr_t)(buf + 40960), .length = 4096,
			      .mw_access_flags = IBV_ACCESS_REMOTE_READ},
	};
	REQUIRE(!ibv_bind_mw(a, mw1, &mb), "bind_mw");
	CHECK(mw1->rkey != old_rkey, "bind gives a new rkey");
	int st = poll_one(cqx, &id, &op, &blen, &flags, &imm);
	CHECK(st == IBV_WC_SUCCESS && id == 10 && op == IBV_WC_BIND_MW, "bind completion %d", st);
	struct ibv_qp_ex *bx = ibv_qp_to_qp_ex(b);
	ibv_wr_start(bx);
	bx->wr_id = 11;
	bx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(bx, mw1->rkey, (uintptr_t)(buf + 40960));
	ibv_wr_set_sge(bx, mr->lkey, (uintptr_t)(buf + 28000), 22);
	REQUIRE(!ibv_wr_complete(bx), "READ through window 1");
	st = poll_one(cqx, &id, &op, &blen, &flags, &imm);
	CHECK(st == IBV_WC_SUCCESS && id == 11, "READ via mw1 %d", st);
	CHECK(!strcmp(buf + 28000, "seen through window 1"), "READ via mw1 data");

	ibv_wr_start(ax);
	ax->wr_id = 12;
	ax->wr_flags = IBV_SEND_SIGNALED;
	uint32_t k2 = ibv_inc_rkey(mw2->rkey);
	ibv_wr_bind_mw(ax, mw2, k2,
		       &(struct ibv_mw_bind_info){.mr = wmr, .addr = (uintptr_t)(buf + 45056),
						  .length = 4096,
						  .mw_access_flags = IBV_ACCESS_REMOTE_WRITE});
	REQUIRE(!ibv_wr_complete(ax), "wr_bind_mw");
	st = poll_one(cqx, &id, &op, &blen, &flags, &imm);
	CHECK(st == IBV_WC_SUCCESS && id == 12 && op == IBV_WC_BIND_MW, "type 2 bind %d", st);
	CHECK(mw2->rkey == k2, "mw2 rkey");
	memcpy(buf + 28100, "written through window 2", 25);
	ibv_wr_start(bx);
	bx->wr_id = 13;
	bx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(bx, k2, (uintptr_t)(buf + 45056));
	ibv_wr_set_sge(bx, mr->lkey, (uintptr_t)(buf + 28100), 25);
	REQUIRE(!ibv_wr_complete(bx), "WRITE through window 2");
	st = poll_one(cqx, &id, &op, &blen, &flags, &imm);
	CHECK(st == IBV_WC_SUCCESS && id == 13, "WRITE via mw2 %d", st);
	CHECK(!strcmp(buf + 45056, "written through window 2"), "WRITE via mw2 data");
	/* Unbinding window 1: no region, length 0. It gets a new R_Key and
	 * its old one is refused from then on. */
	uint32_t bound_rkey = mw1->rkey;
	struct ibv_mw_bind ub = {.wr_id = 14, .send_flags = IBV_SEND_SIGNALED};
	REQUIRE(!ibv_bind_mw(a, mw1, &ub), "unbind mw1");
	CHECK(mw1->rkey != bound_rkey, "unbind gives a new rkey");
	st = poll_one(cqx, &id, &op, &blen, &flags, &imm);
	CHECK(st == IBV_WC_SUCCESS && id == 14 && op == IBV_WC_BIND_MW, "unbind completion %d", st);
	ub.bind_info.length = 8;
	CHECK(ibv_bind_mw(a, mw1, &ub) == EINVAL, "a length without a region");
	ibv_wr_start(bx);
	bx->wr_id = 15;
	bx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(bx, bound_rkey, (uintptr_t)(buf + 40960));
	ibv_wr_set_sge(bx, mr->lkey, (uintptr_t)(buf + 28200), 22);
	REQUIRE(!ibv_wr_complete(bx), "READ through the unbound window");
	st = poll_one(cqx, &id, &op, &blen, &flags, &imm);
	CHECK(st == IBV_WC_REM_ACCESS_ERR && id == 15, "READ via an unbound window: %d", st);
	CHECK(!ibv_dealloc_mw(mw1) && !ibv_dealloc_mw(mw2), "dealloc_mw");
	CHECK(!ibv_dereg_mr(wmr), "dereg window MR");

	/* Completion events on the basic CQ: a SEND from plain QPs. */
	struct ibv_qp *c1 = ibv_create_qp(pd, &ia), *c2 = ibv_create_qp(pd, &ia);
	REQUIRE(c1 && c2, "event qps");
	connect_pair(c1, c2, &self);
	REQUIRE(!ibv_req_notify_cq(cq, 0), "req_notify");
	rwr.wr_id = 88;
	REQUIRE(!ibv_post_recv(c2, &rwr, &bad_rwr), "post_recv c2");
	swr.opcode = IBV_WR_SEND;
	swr.wr_id = 8;
	REQUIRE(!ibv_post_send(c1, &swr, &bad_wr), "post_send c1");
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	REQUIRE(!ibv_get_cq_event(ch, &ev_cq, &ev_ctx), "get_cq_event");
	CHECK(ev_cq == cq && ev_ctx == (void *)0x1234, "event names the CQ and its context");
	struct ibv_wc wc;
	int got = 0;
	for (int i = 0; i < 2; i++) {
		REQUIRE(poll_basic(cq, &wc) == 1, "poll");
		CHECK(wc.status == IBV_WC_SUCCESS, "status %s", ibv_wc_status_str(wc.status));
		got |= wc.wr_id == 8 ? 1 : wc.wr_id == 88 ? 2 : 0;
		if (wc.wr_id == 88)
			CHECK(wc.qp_num == c2->qp_num && wc.byte_len == 8, "recv wc");
	}
	CHECK(got == 3, "send and recv completions");
	ibv_ack_cq_events(cq, 1);

	/* Async events: an SRQ armed with a limit of 2 raises
	 * IBV_EVENT_SRQ_LIMIT_REACHED when SENDs leave it 1 WQE; the event
	 * names it, and ibv_destroy_srq waits until the event is acknowledged
	 * (as rdma-core's does: the element stays valid until then). */
	struct ibv_device **olist = ibv_get_device_list(NULL);
	struct ibv_context *other = olist ? ibv_open_device(olist[0]) : NULL;
	ibv_free_device_list(olist);
	REQUIRE(other, "a second context on the device");
	CHECK(other->async_fd != ctx->async_fd, "each context has its own async_fd");
	struct ibv_srq_init_attr sia = {.attr = {.max_wr = 8, .max_sge = 1}};
	struct ibv_srq *asrq = ibv_create_srq(pd, &sia);
	REQUIRE(asrq, "srq for async events");
	struct ibv_qp_init_attr sqa = ia;
	sqa.srq = asrq;
	struct ibv_qp *s1 = ibv_create_qp(pd, &ia), *s2 = ibv_create_qp(pd, &sqa);
	REQUIRE(s1 && s2, "qps for async events");
	connect_pair(s1, s2, &self);
	struct ibv_recv_wr srwr = rwr, *bad_srwr;
	for (int i = 0; i < 3; i++) {
		srwr.wr_id = 300 + i;
		REQUIRE(!ibv_post_srq_recv(asrq, &srwr, &bad_srwr), "post_srq_recv");
	}
	struct ibv_srq_attr lim = {.srq_limit = 2};
	REQUIRE(!ibv_modify_srq(asrq, &lim, IBV_SRQ_LIMIT), "arm the limit");
	for (int i = 0; i < 2; i++) {
		swr.wr_id = 310 + i;
		REQUIRE(!ibv_post_send(s1, &swr, &bad_wr), "send to the srq");
	}
	for (int i = 0; i < 4; i++)
		REQUIRE(poll_basic(cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS, "srq traffic");
	/* Earlier events first (of the QPs the unbound window's access
	 * error above ended). */
	struct ibv_async_event aev;
	for (;;) {
		REQUIRE(!ibv_get_async_event(ctx, &aev), "get_async_event");
		if (aev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED)
			break;
		CHECK(aev.element.qp == a || aev.element.qp == b, "an earlier event (%d)",
		      aev.event_type);
		ibv_ack_async_event(&aev);
	}
	CHECK(aev.element.srq == asrq, "the limit event names the SRQ");
	/* As the kernel's: an object's events go to the context that created
	 * it, not to another context of the device. */
	struct pollfd opfd = {.fd = other->async_fd, .events = POLLIN};
	CHECK(poll(&opfd, 1, 50) == 0, "the other context has no event");
	REQUIRE(fcntl(other->async_fd, F_SETFL,
		      fcntl(other->async_fd, F_GETFL) | O_NONBLOCK) == 0, "nonblocking");
	struct ibv_async_event oev;
	CHECK(ibv_get_async_event(other, &oev) == -1 && errno == EAGAIN,
	      "nothing to read on the other context");
	CHECK(!ibv_close_device(other), "close the other context");
	CHECK(!ibv_destroy_qp(s1) && !ibv_destroy_qp(s2), "destroy the srq's qps");
	pthread_t destroyer;
	REQUIRE(!pthread_create(&destroyer, NULL, destroy_srq_thread, asrq), "thread");
	usleep(100000);
	CHECK(srq_destroyed == -1, "ibv_destroy_srq waits for the unacknowledged event");
	ibv_ack_async_event(&aev);
	pthread_join(destroyer, NULL);
	CHECK(srq_destroyed == 0, "and returns once it is acknowledged (%d)", srq_destroyed);

	/* Teardown in the right order succeeds. */
	CHECK(!ibv_destroy_qp(c1) && !ibv_destroy_qp(c2), "destroy c");
	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b), "destroy a b");
	CHECK(!ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)), "destroy cq_ex");
	CHECK(!ibv_destroy_cq(cq), "destroy cq");
	CHECK(!ibv_destroy_comp_channel(ch), "destroy channel");
	CHECK(!ibv_dereg_mr(mr), "dereg");
	CHECK(ibv_dereg_mr(mr) == EINVAL, "double dereg");
	CHECK(!ibv_dealloc_pd(pd), "dealloc pd");
	CHECK(!ibv_close_device(ctx), "close");

	/* Closing a context before its objects (perftest's send_bw client
	 * leaks a CQ): the objects stay destroyable, nothing crashes. */
	list = ibv_get_device_list(NULL);
	struct ibv_context *ctx2 = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	REQUIRE(ctx2, "reopen");
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx2);
	struct ibv_cq *cq2 = ibv_create_cq(ctx2, 8, NULL, NULL, 0);
	ia.send_cq = ia.recv_cq = cq2;
	struct ibv_qp *qp2 = pd2 && cq2 ? ibv_create_qp(pd2, &ia) : NULL;
	REQUIRE(qp2, "objects on ctx2");
	CHECK(!ibv_close_device(ctx2), "close with live objects");
	CHECK(!ibv_destroy_qp(qp2) && !ibv_destroy_cq(cq2) && !ibv_dealloc_pd(pd2),
	      "destroy after close");
	free(buf);
	if (failures) {
		fprintf(stderr, "%d failures\n", failures);
		return 1;
	}
	printf("c api: all checks passed\n");
	return 0;
}
