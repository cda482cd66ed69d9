/* The librdmacm C API on uroce's drop-in library, as a C program compiled
 * against rdma-core 44's headers sees it: rdma_set_option's checks and
 * effects, the port rules of rdma_bind_addr and rdma_listen (the kernel's:
 * EADDRINUSE, EADDRNOTAVAIL, REUSEADDR until listen), multicast joins and
 * ECE (enhanced connection establishment), synchronous endpoints (the
 * event kept in id->event, rdma_disconnect waiting), non-blocking
 * channels and rdma_migrate_id.
 * Run by tests/drop_in.rs with the device uroce0 on 127.0.0.1. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

static struct sockaddr_in addr4(const char *ip, uint16_t port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	inet_pton(AF_INET, ip, &a.sin_addr);
	return a;
}

#define SA(a) ((struct sockaddr *)&(a))

/* rc == -1 with errno == e. */
static int fails_with(int rc, int e)
{
	return rc == -1 && errno == e;
}

static struct rdma_cm_id *new_id(struct rdma_event_channel *ch, enum rdma_port_space ps)
{
	struct rdma_cm_id *id = NULL;
	REQUIRE(rdma_create_id(ch, &id, NULL, ps) == 0, "rdma_create_id");
	return id;
}

static void options(struct rdma_event_channel *ch)
{
	struct rdma_cm_id *id = new_id(ch, RDMA_PS_TCP);
	uint8_t tos = 32, tmo = 18;
	int one = 1;

	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1) == 0, "TOS");
	CHECK(fails_with(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 4), EINVAL),
	      "TOS of the wrong length");
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &tmo, 1) == 0,
	      "ACK_TIMEOUT");
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof one) == 0,
	      "REUSEADDR");
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &one, sizeof one) == 0,
	      "AFONLY");
	CHECK(fails_with(rdma_set_option(id, RDMA_OPTION_ID, 99, &one, sizeof one), ENOSYS),
	      "an unknown option");
	CHECK(fails_with(rdma_set_option(id, 7, 0, &one, sizeof one), EINVAL), "an unknown level");
	CHECK(fails_with(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, NULL,
					 sizeof one), EINVAL), "NULL value");
	struct sockaddr_in a = addr4("127.0.0.1", 0);
	REQUIRE(rdma_bind_addr(id, SA(a)) == 0, "bind with port 0");
	CHECK(rdma_get_src_port(id) != 0, "an ephemeral port was chosen");
	CHECK(id->verbs != NULL && id->pd != NULL && id->pd->context == id->verbs,
	      "a bound id has the device's context and PD (UCX makes QPs on id->pd)");
	CHECK(fails_with(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &one,
					 sizeof one), EINVAL), "AFONLY after bind");
	CHECK(fails_with(rdma_bind_addr(id, SA(a)), EINVAL), "binding a bound id");
	rdma_destroy_id(id);
	/* As the kernel's CM: an address of this host that no RDMA device
	 * has is ENODEV (127.0.0.9: every 127/8 address is local), an
	 * address of no interface EADDRNOTAVAIL. */
	struct sockaddr_in local = addr4("127.0.0.9", 0), foreign = addr4("192.0.2.1", 0);
	id = new_id(ch, RDMA_PS_TCP);
	CHECK(fails_with(rdma_bind_addr(id, SA(local)), ENODEV), "a local address of no device");
	CHECK(fails_with(rdma_bind_addr(id, SA(foreign)), EADDRNOTAVAIL), "no local address");
	CHECK(rdma_bind_addr(id, SA(a)) == 0, "a failed bind leaves the id idle");
	rdma_destroy_id(id);
}

/* IPoIB ids are made, and refused where RoCE cannot serve them, as the
 * kernel's CM does. */
static void ipoib(struct rdma_event_channel *ch)
{
	struct rdma_cm_id *id = NULL;
	struct sockaddr_in a = addr4("127.0.0.1", 7473), any = addr4("0.0.0.0", 7473);

	CHECK(fails_with(rdma_create_id(ch, &id, NULL, 0x7777), EINVAL), "an unknown port space");
	REQUIRE(rdma_create_id(ch, &id, NULL, RDMA_PS_IPOIB) == 0, "an IPoIB id");
	CHECK(id->qp_type == IBV_QPT_UD, "IPoIB ids are UD");
	CHECK(fails_with(rdma_bind_addr(id, SA(a)), EINVAL), "binding IPoIB to a RoCE address");
	CHECK(fails_with(rdma_resolve_addr(id, NULL, SA(a), 100), EINVAL), "resolving over RoCE");
	CHECK(rdma_bind_addr(id, SA(any)) == 0, "the wildcard");
	CHECK(fails_with(rdma_listen(id, 1), ENODEV), "no RoCE device listens for IPoIB");
	rdma_destroy_id(id);
}

static void ports(struct rdma_event_channel *ch)
{
	const uint16_t port = 7471;
	struct sockaddr_in a = addr4("127.0.0.1", port), any = addr4("0.0.0.0", port);
	struct rdma_cm_id *x = new_id(ch, RDMA_PS_TCP), *y = new_id(ch, RDMA_PS_TCP);
	struct rdma_cm_id *u = new_id(ch, RDMA_PS_UDP);
	int one = 1;

	REQUIRE(rdma_bind_addr(x, SA(a)) == 0, "first bind");
	CHECK(fails_with(rdma_bind_addr(y, SA(a)), EADDRINUSE), "the same address and port");
	CHECK(fails_with(rdma_bind_addr(y, SA(any)), EADDRNOTAVAIL), "the wildcard on a used port");
	CHECK(rdma_bind_addr(u, SA(a)) == 0, "another port space has its own ports");
	rdma_destroy_id(x);
	CHECK(rdma_bind_addr(y, SA(a)) == 0, "a destroyed id frees its port");
	rdma_destroy_id(y);
	rdma_destroy_id(u);

	/* REUSEADDR: both bind; neither listens while the other holds the
	 * port (the kernel's rule), and a listener's port is its alone. */
	x = new_id(ch, RDMA_PS_TCP);
	y = new_id(ch, RDMA_PS_TCP);
	CHECK(rdma_set_option(x, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof one) == 0,
	      "REUSEADDR x");
	CHECK(rdma_set_option(y, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof one) == 0,
	      "REUSEADDR y");
	CHECK(rdma_bind_addr(x, SA(a)) == 0, "bind x");
	CHECK(rdma_bind_addr(y, SA(a)) == 0, "bind y on the same port (both REUSEADDR)");
	CHECK(fails_with(rdma_listen(x, 1), EADDRINUSE), "listening on a shared port");
	rdma_destroy_id(y);
	CHECK(rdma_listen(x, 1) == 0, "listen once the port is x's alone");
	y = new_id(ch, RDMA_PS_TCP);
	CHECK(rdma_set_option(y, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof one) == 0,
	      "REUSEADDR y");
	CHECK(fails_with(rdma_bind_addr(y, SA(a)), EADDRINUSE), "a listener's port, even REUSEADDR");
	rdma_destroy_id(x);
	rdma_destroy_id(y);

	/* Ephemeral ports of one space differ. */
	struct sockaddr_in e = addr4("127.0.0.1", 0);
	x = new_id(ch, RDMA_PS_TCP);
	y = new_id(ch, RDMA_PS_TCP);
	CHECK(rdma_bind_addr(x, SA(e)) == 0 && rdma_bind_addr(y, SA(e)) == 0, "two ephemeral binds");
	CHECK(rdma_get_src_port(x) != rdma_get_src_port(y), "distinct ephemeral ports");
	rdma_destroy_id(x);
	rdma_destroy_id(y);
}

static int next_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want,
		      struct rdma_cm_event **ev)
{
	if (rdma_get_cm_event(ch, ev))
		return 0;
	if ((*ev)->event != want) {
		fprintf(stderr, "got %s, wanted %s\n", rdma_event_str((*ev)->event),
			rdma_event_str(want));
		rdma_ack_cm_event(*ev);
		return 0;
	}
	return 1;
}

static void multicast(struct rdma_event_channel *ch)
{
	struct sockaddr_in local = addr4("127.0.0.1", 0), group = addr4("239.255.78.9", 0);
	struct sockaddr_in unicast = addr4("127.0.0.9", 0);
	struct rdma_cm_id *id = new_id(ch, RDMA_PS_UDP), *rc = new_id(ch, RDMA_PS_TCP);
	struct rdma_cm_event *ev;
	int ctx = 5;

	CHECK(fails_with(rdma_join_multicast(id, SA(group), &ctx), EINVAL), "join before bind");
	CHECK(rdma_bind_addr(id, SA(local)) == 0, "bind");
	CHECK(rdma_bind_addr(rc, SA(local)) == 0, "bind rc");
	CHECK(fails_with(rdma_join_multicast(rc, SA(group), &ctx), EINVAL), "join on an RC id");
	CHECK(fails_with(rdma_join_multicast(id, SA(unicast), &ctx), EINVAL), "a unicast address");
	CHECK(fails_with(rdma_leave_multicast(id, SA(group)), EADDRNOTAVAIL), "leave before join");

	struct ibv_qp_init_attr qa = {
		.qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	REQUIRE(rdma_create_qp(id, NULL, &qa) == 0, "rdma_create_qp (UD)");
	REQUIRE(rdma_join_multicast(id, SA(group), &ctx) == 0, "join");
	CHECK(fails_with(rdma_join_multicast(id, SA(group), &ctx), EADDRINUSE), "join twice");
	if (CHECK(next_event(ch, RDMA_CM_EVENT_MULTICAST_JOIN, &ev), "the join event")) {
		struct rdma_ud_param *ud = &ev->param.ud;
		CHECK(ev->id == id, "the event names the id");
		CHECK(ud->private_data == &ctx, "private data is the join's context");
		CHECK(ud->qp_num == 0xffffff && ud->qkey == 0x01234567, "qpn %x qkey %x",
		      ud->qp_num, ud->qkey);
		CHECK(ud->ah_attr.is_global && ud->ah_attr.grh.dgid.raw[10] == 0xff &&
			      !memcmp(&ud->ah_attr.grh.dgid.raw[12], &group.sin_addr, 4),
		      "the address vector sends to the group's GID");
		struct ibv_ah *ah = ibv_create_ah(id->pd, &ud->ah_attr);
		CHECK(ah != NULL, "an AH from the join's address vector");
		if (ah)
			ibv_destroy_ah(ah);
		rdma_ack_cm_event(ev);
	}
	/* The library attached the QP. */
	union ibv_gid mgid;
	memset(&mgid, 0, sizeof mgid);
	mgid.raw[10] = mgid.raw[11] = 0xff;
	memcpy(&mgid.raw[12], &group.sin_addr, 4);
	CHECK(ibv_detach_mcast(id->qp, &mgid, 0) == 0, "the library attached the QP");
	CHECK(ibv_attach_mcast(id->qp, &mgid, 0) == 0, "re-attach by hand");
	CHECK(rdma_leave_multicast(id, SA(group)) == 0, "leave");
	CHECK(ibv_detach_mcast(id->qp, &mgid, 0) != 0, "leave detached the QP");
	CHECK(fails_with(rdma_leave_multicast(id, SA(group)), EADDRNOTAVAIL), "leave twice");

	/* Send-only joins do not attach. */
	struct rdma_cm_join_mc_attr_ex mc = {
		.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
		.join_flags = RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER,
		.addr = SA(group),
	};
	struct rdma_cm_join_mc_attr_ex bad = mc;
	bad.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS;
	CHECK(fails_with(rdma_join_multicast_ex(id, &bad, NULL), EINVAL), "no join flags");
	CHECK(rdma_join_multicast_ex(id, &mc, NULL) == 0, "send-only join");
	if (CHECK(next_event(ch, RDMA_CM_EVENT_MULTICAST_JOIN, &ev), "the send-only join event"))
		rdma_ack_cm_event(ev);
	CHECK(ibv_detach_mcast(id->qp, &mgid, 0) != 0, "a send-only join attaches nothing");
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	rdma_destroy_id(rc);

	/* A synchronous id (no channel): the join returns once joined. */
	struct rdma_cm_id *s = NULL;
	REQUIRE(rdma_create_id(NULL, &s, NULL, RDMA_PS_UDP) == 0, "a synchronous id");
	CHECK(rdma_bind_addr(s, SA(local)) == 0, "bind");
	CHECK(rdma_join_multicast(s, SA(group), NULL) == 0, "synchronous join");
	CHECK(rdma_leave_multicast(s, SA(group)) == 0, "leave");
	rdma_destroy_id(s);
}

/* A connection to this device itself: the client's TOS and ACK timeout
 * options reach its QP (the RTR address vector, the RTS timeout). */
/* A connection in port space `ps` (TCP, or IB: another service ID, the
 * same handshake), with TOS and ACK timeout set on the client's id. */
static void connection(struct rdma_event_channel *ch, enum rdma_port_space ps, uint16_t port)
{
	struct sockaddr_in srv = addr4("127.0.0.1", port);
	struct rdma_cm_id *l = new_id(ch, ps), *c = new_id(ch, ps), *s = NULL;
	struct rdma_cm_event *ev;
	uint8_t tos = 96, tmo = 19;
	struct ibv_qp_init_attr qa = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};

	REQUIRE(rdma_bind_addr(l, SA(srv)) == 0 && rdma_listen(l, 4) == 0, "listen");
	CHECK(rdma_set_option(c, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1) == 0, "TOS");
	CHECK(rdma_set_option(c, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &tmo, 1) == 0, "ACK");
	REQUIRE(rdma_resolve_addr(c, NULL, SA(srv), 1000) == 0, "resolve_addr");
	REQUIRE(next_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED, &ev), "ADDR_RESOLVED");
	rdma_ack_cm_event(ev);
	REQUIRE(rdma_resolve_route(c, 1000) == 0, "resolve_route");
	REQUIRE(next_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, &ev), "ROUTE_RESOLVED");
	rdma_ack_cm_event(ev);
	REQUIRE(rdma_create_qp(c, NULL, &qa) == 0, "client QP");
	REQUIRE(rdma_connect(c, NULL) == 0, "connect");
	REQUIRE(next_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST, &ev), "CONNECT_REQUEST");
	s = ev->id;
	rdma_ack_cm_event(ev);
	REQUIRE(rdma_create_qp(s, NULL, &qa) == 0, "server QP");
	REQUIRE(rdma_accept(s, NULL) == 0, "accept");
	for (int n = 0; n < 2; n++) {
		REQUIRE(rdma_get_cm_event(ch, &ev) == 0, "established events");
		CHECK(ev->event == RDMA_CM_EVENT_ESTABLISHED, "%s", rdma_event_str(ev->event));
		rdma_ack_cm_event(ev);
	}
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	REQUIRE(ibv_query_qp(c->qp, &a, IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_STATE, &ia) == 0,
		"query the client QP");
	CHECK(a.qp_state == IBV_QPS_RTS, "state %d", a.qp_state);
	CHECK(a.timeout == tmo, "ACK timeout %d", a.timeout);
	CHECK(a.ah_attr.grh.traffic_class == tos, "traffic class %d", a.ah_attr.grh.traffic_class);
	rdma_disconnect(c);
	rdma_destroy_qp(c);
	rdma_destroy_qp(s);
	rdma_destroy_id(c);
	rdma_destroy_id(s);
	rdma_destroy_id(l);
}

/* An id to 127.0.0.1:port with its address and route resolved. */
static struct rdma_cm_id *resolved(struct rdma_event_channel *ch, struct sockaddr_in *srv)
{
	struct rdma_cm_id *c = new_id(ch, RDMA_PS_TCP);
	struct rdma_cm_event *ev;

	REQUIRE(rdma_resolve_addr(c, NULL, SA(*srv), 1000) == 0, "resolve_addr");
	REQUIRE(next_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED, &ev), "ADDR_RESOLVED");
	rdma_ack_cm_event(ev);
	REQUIRE(rdma_resolve_route(c, 1000) == 0, "resolve_route");
	REQUIRE(next_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, &ev), "ROUTE_RESOLVED");
	rdma_ack_cm_event(ev);
	return c;
}

/* An RC QP of the application's own (not the id's) on `verbs`. */
static struct ibv_qp *own_qp(struct ibv_context *verbs, struct ibv_pd **pd, struct ibv_cq **cq)
{
	*pd = ibv_alloc_pd(verbs);
	*cq = ibv_create_cq(verbs, 8, NULL, NULL, 0);
	REQUIRE(*pd && *cq, "PD and CQ");
	struct ibv_qp_init_attr qa = {
		.send_cq = *cq,
		.recv_cq = *cq,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(*pd, &qa);
	REQUIRE(qp != NULL, "an RC QP");
	return qp;
}

static void free_qp(struct ibv_qp *qp, struct ibv_pd *pd, struct ibv_cq *cq)
{
	ibv_destroy_qp(qp);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
}

/* ECE between ids whose QPs the application makes: the client's vendor
 * and options reach the server (rdma_get_remote_ece), the server's answer
 * reaches the client; rdma_reject_ece refuses with REJ reason 35; after a
 * disconnect both ids get RDMA_CM_EVENT_TIMEWAIT_EXIT; the
 * calls' argument checks, and an id with a library-made QP refuses both
 * calls (EINVAL), as librdmacm. */
static void ece(struct rdma_event_channel *ch)
{
	struct sockaddr_in srv = addr4("127.0.0.1", 7473);
	struct rdma_cm_id *l = new_id(ch, RDMA_PS_TCP);
	struct rdma_cm_event *ev;
	struct ibv_ece mine = { .vendor_id = 0x02c9, .options = 0x5 }, got;

	REQUIRE(rdma_bind_addr(l, SA(srv)) == 0 && rdma_listen(l, 4) == 0, "listen");
	for (int round = 0; round < 2; round++) {
		struct rdma_cm_id *c = resolved(ch, &srv), *s;
		struct ibv_pd *pd, *spd;
		struct ibv_cq *cq, *scq;
		struct ibv_qp *qp = own_qp(c->verbs, &pd, &cq), *sqp;

		if (round == 0) {
			struct ibv_ece none = { .options = 1 }, masked = mine;
			masked.comp_mask = 1;
			CHECK(fails_with(rdma_set_local_ece(c, NULL), EINVAL), "NULL ECE");
			CHECK(fails_with(rdma_set_local_ece(c, &none), EINVAL), "no vendor");
			CHECK(fails_with(rdma_set_local_ece(c, &masked), EINVAL), "comp_mask");
			CHECK(fails_with(rdma_get_remote_ece(c, NULL), EINVAL), "NULL out");
			CHECK(rdma_get_remote_ece(c, &got) == 0 && got.vendor_id == 0, "none yet");
		}
		CHECK(rdma_set_local_ece(c, &mine) == 0, "set_local_ece");
		struct rdma_conn_param p = {
			.responder_resources = 1,
			.initiator_depth = 1,
			.retry_count = 7,
			.rnr_retry_count = 7,
			.qp_num = qp->qp_num,
		};
		REQUIRE(rdma_connect(c, &p) == 0, "connect");
		REQUIRE(next_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST, &ev), "CONNECT_REQUEST");
		s = ev->id;
		rdma_ack_cm_event(ev);
		memset(&got, 0xff, sizeof(got));
		CHECK(rdma_get_remote_ece(s, &got) == 0 && got.vendor_id == 0x02c9 &&
			      got.options == 0x5 && got.comp_mask == 0,
		      "the REQ's ECE: %#x %#x %#x", got.vendor_id, got.options, got.comp_mask);
		if (round == 0) {
			REQUIRE(rdma_reject_ece(s, "no", 3) == 0, "reject_ece");
			REQUIRE(next_event(ch, RDMA_CM_EVENT_REJECTED, &ev), "REJECTED");
			CHECK(ev->status == 35, "REJ reason %d", ev->status);
			CHECK(ev->param.conn.private_data_len >= 3 &&
				      !memcmp(ev->param.conn.private_data, "no", 3),
			      "the REJ's private data");
			rdma_ack_cm_event(ev);
			rdma_destroy_id(s);
		} else {
			struct ibv_ece answer = { .vendor_id = 0x02c9, .options = 0x1 };
			sqp = own_qp(s->verbs, &spd, &scq);
			CHECK(rdma_set_local_ece(s, &answer) == 0, "the server's ECE");
			p.qp_num = sqp->qp_num;
			REQUIRE(rdma_accept(s, &p) == 0, "accept");
			REQUIRE(next_event(ch, RDMA_CM_EVENT_CONNECT_RESPONSE, &ev), "CONNECT_RESPONSE");
			rdma_ack_cm_event(ev);
			CHECK(rdma_get_remote_ece(c, &got) == 0 && got.vendor_id == 0x02c9 &&
				      got.options == 0x1,
			      "the REP's ECE: %#x %#x", got.vendor_id, got.options);
			REQUIRE(rdma_establish(c) == 0, "establish");
			REQUIRE(next_event(ch, RDMA_CM_EVENT_ESTABLISHED, &ev), "server ESTABLISHED");
			rdma_ack_cm_event(ev);
			REQUIRE(rdma_disconnect(c) == 0, "disconnect");
			for (int n = 0; n < 2; n++) {
				REQUIRE(next_event(ch, RDMA_CM_EVENT_DISCONNECTED, &ev), "DISCONNECTED");
				rdma_ack_cm_event(ev);
			}
			/* Both ids still live: each hears when its TimeWait ends. */
			int exited = 0;
			for (int n = 0; n < 2; n++) {
				REQUIRE(next_event(ch, RDMA_CM_EVENT_TIMEWAIT_EXIT, &ev), "TIMEWAIT_EXIT");
				exited |= (ev->id == c) | (ev->id == s) << 1;
				rdma_ack_cm_event(ev);
			}
			CHECK(exited == 3, "TIMEWAIT_EXIT for both ids (%d)", exited);
			CHECK(rdma_disconnect(c) == 0, "a late disconnect is harmless");
			rdma_destroy_id(s);
			free_qp(sqp, spd, scq);
		}
		rdma_destroy_id(c);
		free_qp(qp, pd, cq);
	}

	/* librdmacm's own QP: the id's ECE is the QP's (none on uroce, as on
	 * rxe) and neither call is allowed any more. */
	struct rdma_cm_id *c = resolved(ch, &srv);
	struct ibv_qp_init_attr qa = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	REQUIRE(rdma_create_qp(c, NULL, &qa) == 0, "rdma_create_qp");
	CHECK(fails_with(rdma_set_local_ece(c, &mine), EINVAL), "set with a QP");
	CHECK(fails_with(rdma_get_remote_ece(c, &got), EINVAL), "get with a QP");
	REQUIRE(rdma_connect(c, NULL) == 0, "connect");
	REQUIRE(next_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST, &ev), "CONNECT_REQUEST");
	struct rdma_cm_id *s = ev->id;
	rdma_ack_cm_event(ev);
	CHECK(rdma_get_remote_ece(s, &got) == 0 && got.vendor_id == 0, "no ECE offered");
	rdma_reject(s, NULL, 0);
	REQUIRE(next_event(ch, RDMA_CM_EVENT_REJECTED, &ev), "REJECTED");
	CHECK(ev->status == 28, "consumer reject, reason %d", ev->status);
	rdma_ack_cm_event(ev);
	rdma_destroy_id(s);
	rdma_destroy_qp(c);
	rdma_destroy_id(c);
	rdma_destroy_id(l);
}

/* rdma_create_srq_ex: a basic SRQ on the id's device (PD chosen as
 * rdma_create_srq chooses it, written back); no type is EINVAL; an XRC
 * SRQ gets the device's XRC domain and a receive CQ the library makes,
 * which go with it. */
static void srq_ex(struct rdma_event_channel *ch)
{
	struct sockaddr_in srv = addr4("127.0.0.1", 7474);
	struct rdma_cm_id *c = resolved(ch, &srv);
	struct ibv_srq_init_attr_ex a = { .attr = { .max_wr = 16, .max_sge = 1 } };

	CHECK(fails_with(rdma_create_srq_ex(c, &a), EINVAL), "no type");
	a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE;
	a.srq_type = IBV_SRQT_XRC;
	REQUIRE(rdma_create_srq_ex(c, &a) == 0, "an XRC SRQ");
	uint32_t srqn = 0;
	CHECK(c->srq && a.xrcd && a.cq == c->recv_cq &&
		      c->recv_cq && ibv_get_srq_num(c->srq, &srqn) == 0 && srqn != 0,
	      "the XRC SRQ, its domain, its CQ and number");
	rdma_destroy_srq(c);
	CHECK(c->srq == NULL && c->recv_cq == NULL, "the XRC SRQ and its CQ destroyed");
	a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE;
	a.srq_type = IBV_SRQT_BASIC;
	REQUIRE(rdma_create_srq_ex(c, &a) == 0, "a basic SRQ");
	CHECK(c->srq != NULL && a.pd != NULL && c->srq->pd == a.pd, "the id's SRQ and PD");
	CHECK(a.comp_mask & IBV_SRQ_INIT_ATTR_PD, "the PD written back");
	struct ibv_srq_attr sa;
	CHECK(ibv_query_srq(c->srq, &sa) == 0 && sa.max_wr >= 16, "query the SRQ");
	rdma_destroy_srq(c);
	CHECK(c->srq == NULL, "destroyed");
	rdma_destroy_id(c);
}

/* Synchronous endpoints (rdma_create_ep, no channel): each call waits for
 * its outcome and leaves the event in id->event, where the program reads
 * the peer's private data (as Debian's rdma_xclient does); rdma_disconnect
 * waits for DISCONNECTED, whether this side or the peer ended first. */
static pthread_mutex_t sync_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sync_cv = PTHREAD_COND_INITIALIZER;
static int sync_stage;

static void sync_step(int stage)
{
	pthread_mutex_lock(&sync_mu);
	sync_stage = stage;
	pthread_cond_broadcast(&sync_cv);
	pthread_mutex_unlock(&sync_mu);
}

static void sync_wait(int stage)
{
	pthread_mutex_lock(&sync_mu);
	while (sync_stage < stage)
		pthread_cond_wait(&sync_cv, &sync_mu);
	pthread_mutex_unlock(&sync_mu);
}

static struct ibv_qp_init_attr sync_qp_attr = {
	.qp_type = IBV_QPT_RC,
	.sq_sig_all = 1,
	.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
};

static void *sync_server(void *arg)
{
	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP };
	struct rdma_addrinfo *res = NULL;
	struct rdma_cm_id *l = NULL, *s = NULL;
	struct rdma_conn_param p = { .private_data = "world", .private_data_len = 6 };
	struct ibv_qp_init_attr qa = sync_qp_attr;

	(void)arg;
	REQUIRE(rdma_getaddrinfo("127.0.0.1", "7480", &hints, &res) == 0, "getaddrinfo (server)");
	REQUIRE(rdma_create_ep(&l, res, NULL, &qa) == 0, "rdma_create_ep (server)");
	rdma_freeaddrinfo(res);
	REQUIRE(rdma_listen(l, 2) == 0, "listen (sync)");
	sync_step(1);
	REQUIRE(rdma_get_request(l, &s) == 0, "rdma_get_request");
	REQUIRE(s->event != NULL, "the request is in id->event");
	CHECK(s->event->event == RDMA_CM_EVENT_CONNECT_REQUEST, "%s",
	      rdma_event_str(s->event->event));
	CHECK(s->event->listen_id == l, "the request names its listener");
	CHECK(s->event->param.conn.private_data_len >= 6 &&
		      memcmp(s->event->param.conn.private_data, "hello", 6) == 0,
	      "the client's private data in the request");
	CHECK(s->qp != NULL, "rdma_get_request made the endpoint's QP");
	REQUIRE(rdma_accept(s, &p) == 0, "rdma_accept (sync)");
	CHECK(s->event != NULL && s->event->event == RDMA_CM_EVENT_ESTABLISHED,
	      "accept left ESTABLISHED in id->event");
	/* The client disconnects first: DISCONNECTED is waiting already. */
	sync_wait(2);
	CHECK(rdma_disconnect(s) == 0, "rdma_disconnect after the peer's");
	CHECK(s->event != NULL && s->event->event == RDMA_CM_EVENT_DISCONNECTED,
	      "the peer's DISCONNECTED in id->event");
	CHECK(rdma_disconnect(s) == 0, "a second rdma_disconnect returns at once");
	rdma_destroy_ep(s);
	rdma_destroy_ep(l);
	return NULL;
}

static void sync_endpoints(void)
{
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP };
	struct rdma_addrinfo *res = NULL;
	struct rdma_cm_id *c = NULL;
	struct rdma_conn_param p = { .private_data = "hello", .private_data_len = 6 };
	struct ibv_qp_init_attr qa = sync_qp_attr;
	pthread_t t;

	REQUIRE(pthread_create(&t, NULL, sync_server, NULL) == 0, "server thread");
	sync_wait(1);
	REQUIRE(rdma_getaddrinfo("127.0.0.1", "7480", &hints, &res) == 0, "getaddrinfo (client)");
	REQUIRE(rdma_create_ep(&c, res, NULL, &qa) == 0, "rdma_create_ep (client)");
	rdma_freeaddrinfo(res);
	CHECK(c->event != NULL && c->event->event == RDMA_CM_EVENT_ROUTE_RESOLVED,
	      "route resolution left its event in id->event");
	REQUIRE(rdma_connect(c, &p) == 0, "rdma_connect (sync)");
	REQUIRE(c->event != NULL, "connect's event in id->event");
	CHECK(c->event->event == RDMA_CM_EVENT_ESTABLISHED, "%s", rdma_event_str(c->event->event));
	CHECK(c->event->param.conn.private_data_len >= 6 &&
		      memcmp(c->event->param.conn.private_data, "world", 6) == 0,
	      "the server's private data after rdma_connect");
	CHECK(rdma_disconnect(c) == 0, "rdma_disconnect (sync)");
	CHECK(c->event != NULL && c->event->event == RDMA_CM_EVENT_DISCONNECTED,
	      "rdma_disconnect waited for DISCONNECTED");
	sync_step(2);
	pthread_join(t, NULL);
	rdma_destroy_ep(c);
}

/* A non-blocking channel says EAGAIN when empty; an id migrated with an
 * event not yet read takes it to its new channel. */
static void nonblocking_and_migrate(void)
{
	struct rdma_event_channel *a = rdma_create_event_channel(), *b = rdma_create_event_channel();
	struct sockaddr_in srv = addr4("127.0.0.1", 7481);
	struct rdma_cm_event *ev = NULL;
	struct rdma_cm_id *id;

	REQUIRE(a && b, "two channels");
	REQUIRE(fcntl(a->fd, F_SETFL, fcntl(a->fd, F_GETFL) | O_NONBLOCK) == 0, "O_NONBLOCK");
	CHECK(fails_with(rdma_get_cm_event(a, &ev), EAGAIN), "an empty non-blocking channel");
	id = new_id(a, RDMA_PS_TCP);
	REQUIRE(rdma_resolve_addr(id, NULL, SA(srv), 1000) == 0, "resolve_addr");
	REQUIRE(rdma_migrate_id(id, b) == 0, "rdma_migrate_id");
	CHECK(id->channel == b, "the id names its new channel");
	CHECK(fails_with(rdma_get_cm_event(a, &ev), EAGAIN), "the old channel has nothing");
	REQUIRE(next_event(b, RDMA_CM_EVENT_ADDR_RESOLVED, &ev), "ADDR_RESOLVED on the new one");
	CHECK(ev->id == id, "for the migrated id");
	rdma_ack_cm_event(ev);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(a);
	rdma_destroy_event_channel(b);
}

static volatile int late_reader_returned;

static void *late_reader(void *arg)
{
	struct rdma_cm_event *ev;
	rdma_get_cm_event(arg, &ev);
	late_reader_returned = 1;
	return NULL;
}

/* rdma-core 44's rping destroys its channel while its CM thread may still
 * call rdma_get_cm_event: that reader stays blocked (as it would in read(2)
 * over the kernel) instead of failing; a pointer that never was a channel
 * is still EINVAL. */
static void late_reader_on_a_destroyed_channel(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_event *ev;
	pthread_t t;
	int never = 0;

	REQUIRE(ch != NULL, "a channel");
	rdma_destroy_event_channel(ch);
	REQUIRE(pthread_create(&t, NULL, late_reader, ch) == 0, "a reader thread");
	usleep(200000);
	CHECK(!late_reader_returned, "the late reader stays blocked");
	pthread_detach(t);
	CHECK(fails_with(rdma_get_cm_event((void *)&never, &ev), EINVAL), "not a channel");
}

int main(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	REQUIRE(ch != NULL, "rdma_create_event_channel");
	options(ch);
	ipoib(ch);
	ports(ch);
	multicast(ch);
	connection(ch, RDMA_PS_TCP, 7472);
	connection(ch, RDMA_PS_IB, 7473);
	ece(ch);
	srq_ex(ch);
	rdma_destroy_event_channel(ch);
	sync_endpoints();
	nonblocking_and_migrate();
	late_reader_on_a_destroyed_channel();
	if (failures) {
		fprintf(stderr, "%d checks failed\n", failures);
		return 1;
	}
	printf("all checks passed\n");
	return 0;
}
